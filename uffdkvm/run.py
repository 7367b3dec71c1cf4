"""run(): one experiment, from a Config to a Result."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from . import _core
from .config import Config, format_size
from .errors import (ConfigError, HostUnsupportedError, RunError, RunTimeoutError,
                     UffdkvmError)
from .host import HostInfo
from .result import Result

_BACKINGS = {"anonymous": _core.BACKING_ANONYMOUS, "shmem": _core.BACKING_SHMEM}
_UFFD_MODES = {None: _core.UFFD_NONE, "missing": _core.UFFD_MISSING,
               "minor": _core.UFFD_MINOR}
_WAITS = {"poll": _core.WAIT_POLL, "epoll": _core.WAIT_EPOLL,
          "epoll_exclusive": _core.WAIT_EPOLL_EXCLUSIVE, "read": _core.WAIT_READ}
_ERRORS = {_core.ERR_CONFIG: ConfigError, _core.ERR_HOST: HostUnsupportedError,
           _core.ERR_RUN: RunError, _core.ERR_TIMEOUT: RunTimeoutError}


def _core_config(c: Config) -> dict:
    return {
        "vcpus": c.vcpus,
        "mem_per_vcpu": c.mem_per_vcpu,
        "backing": _BACKINGS[c.backing],
        "uffd_mode": _UFFD_MODES[c.uffd_mode],
        "single_uffd": int(c.single_uffd),
        "readers": c.readers,
        "wait": _WAITS[c.wait],
        "delay_us": c.delay_us,
        "overlap": int(c.overlap),
        "guest_work": c.guest_work,
        "timeout_ns": 0 if c.timeout_s is None else max(1, int(c.timeout_s * 1e9)),
    }


def _mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_fits_host(c: Config) -> None:
    """Refuse a region the host cannot hold before the OOM killer decides."""
    available = _mem_available()
    if available is not None and c.region_bytes > available:
        what = "mem_per_vcpu" if c.overlap else "vcpus * mem_per_vcpu"
        raise ConfigError(
            f"mem_per_vcpu: the run would demand-page {format_size(c.region_bytes)} "
            f"({what}), more than the {format_size(available // (1 << 20) << 20)} this host "
            f"has available (MemAvailable); use less memory per vCPU or fewer vCPUs")


def run(config: Optional[Config] = None, **fields: Any) -> Result:
    """Run one experiment and return its Result.

    ``run()`` runs the default Config; ``run(vcpus=2, mem_per_vcpu="64M")``
    makes one from keywords; ``run(cfg, readers=4)`` overrides fields of cfg.
    The GIL is released while the experiment runs, and Ctrl-C stops it
    (cleanly: every thread joined, every fd and mapping released) and raises
    KeyboardInterrupt.
    """
    if config is None:
        config = Config().replace(**fields) if fields else Config()
    elif not isinstance(config, Config):
        raise TypeError(f"run() takes a uffdkvm.Config, not {type(config).__name__}")
    elif fields:
        config = config.replace(**fields)
    _check_fits_host(config)
    try:
        raw = _core.run(_core_config(config))
    except _core.CoreError as e:
        kind, errnum, message = e.args
        raise _ERRORS.get(kind, UffdkvmError)(message, errnum) from None
    return dataclasses.replace(Result._from_core(config, raw), host=HostInfo.current())
