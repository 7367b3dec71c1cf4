"""Where a run ran: :class:`HostInfo`, the facts needed to compare runs later.

Every Result that run() returns carries the HostInfo of the machine it ran on
(``r.host``), so results written to JSON today can be told apart from those of
another kernel, CPU or uffdkvm version tomorrow.
"""
from __future__ import annotations

import functools
import os
import platform
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class HostInfo:
    """The host of one run. Every field has a default ("" or 0: unknown), so
    JSON written before a field existed still loads.

    name             host name (os.uname().nodename)
    kernel_release   kernel release, as ``uname -r``
    kernel_version   kernel build string, as ``uname -v``
    cpu_model        CPU model name from /proc/cpuinfo
    cpus             logical CPUs the host has online
    usable_cpus      logical CPUs this process may run on (its affinity)
    hypervisor       the host is itself a VM, so KVM runs nested (the
                     "hypervisor" CPU flag): expect far lower paging rates
    memory_bytes     MemTotal
    python_version   e.g. "3.11.7"
    uffdkvm_version  the uffdkvm that ran the experiment
    """

    name: str = ""
    kernel_release: str = ""
    kernel_version: str = ""
    cpu_model: str = ""
    cpus: int = 0
    usable_cpus: int = 0
    hypervisor: bool = False
    memory_bytes: int = 0
    python_version: str = ""
    uffdkvm_version: str = ""

    @classmethod
    def current(cls) -> HostInfo:
        """This host, probed once per process."""
        return _current()


def _cpuinfo() -> tuple:
    """(model name, whether the "hypervisor" flag is set) from /proc/cpuinfo."""
    model, hypervisor = "", False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags":
                    hypervisor = "hypervisor" in value.split()
                    break
    except OSError:
        pass
    return model or platform.processor(), hypervisor


def _mem_total() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@functools.lru_cache(maxsize=1)
def _current() -> HostInfo:
    from ._version import __version__

    uname = os.uname()
    model, hypervisor = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return HostInfo(
        name=uname.nodename or socket.gethostname(),
        kernel_release=uname.release,
        kernel_version=uname.version,
        cpu_model=model,
        cpus=os.cpu_count() or 0,
        usable_cpus=usable,
        hypervisor=hypervisor,
        memory_bytes=_mem_total(),
        python_version=platform.python_version(),
        uffdkvm_version=__version__,
    )
