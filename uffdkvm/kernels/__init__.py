"""Other kernels: uffdkvm's experiments in a kernel of your choosing, under QEMU.

    >>> from uffdkvm import kernels
    >>> r = kernels.run("6.18", uffdkvm.Config(vcpus=2, mem_per_vcpu="16M"))
    >>> r.verified, r.host.kernel_release           # True, '6.18.15+deb13-amd64'
    >>> with kernels.Guest("/src/linux/arch/x86/boot/bzImage") as g:
    ...     df = uffdkvm.sweep(readers=[1, 2], trials=3, executor=g)
    >>> c = kernels.compare("6.12", "7.2", uffdkvm.Config(mem_per_vcpu="16M"))
    >>> print(c.table()); c.verdict(0.05)            # "worse", "better", "same", "unclear"

A kernel is one of Debian's (DEBIAN_KERNELS: "6.1", "6.12", "6.18", "7.2",
and "backports" and "sid", which follow the newest), fetched with an apt
configuration of uffdkvm's own into cache_dir(), or one you built
(``brought(bzImage, modules)``). It boots under QEMU with this host's / as
its root, read-only, so the guest runs this Python and this uffdkvm; with
KVM where the host's KVM can nest, else emulated (TCG), where only ratios
between runs mean anything. docs/kernels.md has the rest.
"""
import os
from typing import Any

from ..config import Config
from ..result import Result
from ._compare import KernelComparison, compare
from ._debian import DEBIAN_KERNELS, KernelWarning, cache_dir, fetch
from ._guest import Guest, resolve
from ._kernel import Kernel, KernelUnavailableError, brought
from ._qemu import Accel, choose_accel

__all__ = ["DEBIAN_KERNELS", "Accel", "Guest", "Kernel", "KernelComparison",
           "KernelUnavailableError", "KernelWarning", "brought", "cache_dir", "choose_accel",
           "compare", "fetch", "resolve", "run"]


def run(kernel: Kernel | str | os.PathLike[str], config: Config | None = None,
        **guest: Any) -> Result:
    """Boots ``kernel``, runs ``config`` (default: Config()) there, powers it
    off, and returns the Result. ``guest``: Guest's options."""
    with Guest(kernel, **guest) as g:
        return g.run(config)
