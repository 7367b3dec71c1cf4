"""Other kernels: uffdkvm's experiments in a kernel of your choosing, under QEMU."""
from ._debian import DEBIAN_KERNELS, cache_dir, fetch
from ._kernel import Kernel, KernelUnavailableError, brought

__all__ = ["DEBIAN_KERNELS", "Kernel", "KernelUnavailableError", "brought", "cache_dir",
           "fetch"]
