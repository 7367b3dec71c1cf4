"""What one experiment does: :class:`Config`, validated on construction."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

from .errors import ConfigError

BACKINGS = ("anonymous", "shmem")
SHARED_BACKINGS = ("shmem",)
UFFD_MODES = ("missing", "minor")
WAITS = ("poll", "epoll", "epoll_exclusive", "read")

PAGE_SIZE = 4096
MAX_READERS = 4096
MAX_DELAY_US = 10_000_000
MAX_GUEST_WORK = 1_000_000

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(value: Union[int, str], field: str = "size") -> int:
    """Bytes from an int or a string such as "64M", "1G", "4096" or "2GiB"."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{field}: expected bytes as an int or a string like '64M', "
                          f"not {value!r}")
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(value)
    if not m:
        raise ConfigError(f"{field}: {value!r} is not a size; give bytes, or a number "
                          f"with K, M, G or T (powers of 1024), e.g. '64M'")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


def format_size(n: int) -> str:
    """The shortest exact K/M/G/T spelling of n bytes: 67108864 -> '64M'."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _SIZE_UNITS[unit] == 0:
            return f"{n // _SIZE_UNITS[unit]}{unit}"
    return str(n)


def _choice(field: str, value: Any, choices: tuple) -> str:
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise ConfigError(f"{field}: {value!r} is not one of {', '.join(map(repr, choices))}")


def _integer(field: str, value: Any, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field}: expected an int, not {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{field}: must be {bound}, not {value}")
    return value


def _flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{field}: expected True or False, not {value!r}")
    return value


@dataclass(frozen=True)
class Config:
    """One experiment. Fields are checked when the Config is made, so a bad
    value fails here, with the field's name, before any VM exists.

    vcpus         vCPUs, each in its own host thread
    mem_per_vcpu  bytes each vCPU demand-pages: an int, or "64M", "1G"
    backing       "anonymous" (private, THP off) or "shmem" (memfd)
    uffd_mode     "missing" (UFFDIO_COPY), "minor" (UFFDIO_CONTINUE after the
                  page cache is prefilled; shared backings only), or None: no
                  userfaultfd, the kernel pages memory in itself (the baseline)
    single_uffd   one uffd for the whole region instead of one per vCPU
    readers       reader threads per uffd
    wait          how readers wait: "poll", "epoll", "epoll_exclusive", "read"
    delay_us      microseconds a reader sleeps per fault before resolving it
    overlap       every vCPU walks the same region (implies one uffd)
    guest_work    guest computation after each page access: iterations of a
                  4-instruction loop, two of them stack accesses (0: none)
    timeout_s     seconds before the run is abandoned with RunTimeoutError
                  (None: no limit)
    """

    vcpus: int = 1
    mem_per_vcpu: Union[int, str] = "1G"
    backing: str = "anonymous"
    uffd_mode: Optional[str] = "missing"
    single_uffd: bool = False
    readers: int = 1
    wait: str = "epoll_exclusive"
    delay_us: int = 0
    overlap: bool = False
    guest_work: int = 0
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise through the back door
        put(self, "vcpus", _integer("vcpus", self.vcpus, 1))
        mem = parse_size(self.mem_per_vcpu, "mem_per_vcpu")
        if mem < PAGE_SIZE or mem % PAGE_SIZE:
            raise ConfigError(f"mem_per_vcpu: must be a positive multiple of 4 KiB (4096), "
                              f"not {mem}")
        put(self, "mem_per_vcpu", mem)
        put(self, "backing", _choice("backing", self.backing, BACKINGS))
        mode = self.uffd_mode
        if isinstance(mode, str) and mode.lower() == "none":
            mode = None
        put(self, "uffd_mode", None if mode is None else _choice("uffd_mode", mode, UFFD_MODES))
        put(self, "single_uffd", _flag("single_uffd", self.single_uffd))
        put(self, "readers", _integer("readers", self.readers, 1, MAX_READERS))
        put(self, "wait", _choice("wait", self.wait, WAITS))
        put(self, "delay_us", _integer("delay_us", self.delay_us, 0, MAX_DELAY_US))
        put(self, "overlap", _flag("overlap", self.overlap))
        put(self, "guest_work", _integer("guest_work", self.guest_work, 0, MAX_GUEST_WORK))
        if self.timeout_s is not None:
            if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                    or not self.timeout_s > 0:
                raise ConfigError(f"timeout_s: expected a positive number of seconds or None, "
                                  f"not {self.timeout_s!r}")
            put(self, "timeout_s", float(self.timeout_s))
        if self.uffd_mode == "minor" and self.backing not in SHARED_BACKINGS:
            raise ConfigError(
                f"uffd_mode: 'minor' needs a shared backing ({', '.join(SHARED_BACKINGS)}); "
                f"MINOR faults come from pages that are in the page cache but not mapped, "
                f"and {self.backing!r} memory has no page cache. Use backing='shmem' or "
                f"uffd_mode='missing'")

    @property
    def region_bytes(self) -> int:
        """Bytes of guest memory under test."""
        return self.mem_per_vcpu if self.overlap else self.mem_per_vcpu * self.vcpus

    @property
    def pages_per_vcpu(self) -> int:
        """4 KiB pages each vCPU touches per pass."""
        return self.mem_per_vcpu // PAGE_SIZE

    @property
    def uffds(self) -> int:
        """How many userfaultfds the run opens."""
        if self.uffd_mode is None:
            return 0
        return 1 if self.single_uffd or self.overlap else self.vcpus

    def replace(self, **fields: Any) -> "Config":
        """A copy with some fields changed (validated like a new Config)."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"{', '.join(sorted(unknown))}: not a Config field; fields are "
                              f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict:
        """The fields as plain JSON-ready values."""
        return dataclasses.asdict(self)
