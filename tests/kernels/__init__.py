"""uffdkvm/kernels/: experiments in another kernel, booted under QEMU."""
