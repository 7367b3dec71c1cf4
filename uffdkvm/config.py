"""What one experiment does: :class:`Config`, validated on construction."""
from __future__ import annotations

import dataclasses
import numbers
import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsIndex

from .errors import ConfigError

PAGE_SIZE = 4096
_2M, _1G = 2 << 20, 1 << 30

# Each backing and the page size its faults are resolved at.
BACKING_PAGE_SIZES = {
    "anonymous": PAGE_SIZE,
    "anonymous_thp": _2M,
    "anonymous_hugetlb": _2M,
    "anonymous_hugetlb_1gb": _1G,
    "shmem": PAGE_SIZE,
    "shared_hugetlb": _2M,
    "guest_memfd": PAGE_SIZE,
}
BACKINGS = tuple(BACKING_PAGE_SIZES)
SHARED_BACKINGS = ("shmem", "shared_hugetlb", "guest_memfd")
HUGETLB_BACKINGS = ("anonymous_hugetlb", "anonymous_hugetlb_1gb", "shared_hugetlb")
# What UFFDIO_MOVE moves pages into: private anonymous memory (resolve="move").
MOVE_BACKINGS = ("anonymous", "anonymous_thp")
UFFD_MODES = ("missing", "minor", "wp")
#: Backings uffd_mode="wp" runs on: 4 KiB pages, saved and verified one at a time.
WP_BACKINGS = ("anonymous", "shmem")
WAITS = ("poll", "epoll", "epoll_exclusive", "read", "spin", "io_uring")
RESOLVERS = ("readers", "vcpu")
GUEST_PAGE_SIZES = {"4K": PAGE_SIZE, "2M": _2M, "1G": _1G}
PATTERNS = ("sequential", "reverse", "random")
# The guest's access models (touch_percent, access): csrc/experiment/access.c.
ACCESSES = ("uniform", "zipf")
MAX_ZIPF_THETA = 100.0
MAX_ACCESSES = 1 << 24  # per pass per vCPU: csrc/experiment/config.c MAX_ACCESSES
RESOLVES = ("copy", "zeropage", "move")
DELAY_DISTS = ("fixed", "uniform", "exponential")
STATS = ("full", "basic")
#: Where a resolved page's bytes come from.
SOURCES = ("synthetic", "file", "remote")
SOURCE_READS = ("pread", "mmap")
SOURCE_CACHES = ("warm", "cold")
#: Prefetch policies (uffd_mode="missing" with resolve="copy" only).
PREFETCHES = ("none", "readahead", "background", "replay")
MAX_PREFETCH_PAGES = 1 << 20
# source="remote": how the readers reach the page server (uffdkvm/pageserver.py).
REMOTE_TRANSPORTS = ("unix", "tcp")

MAX_VCPUS = 4096          # KVM's own ceiling (KVM_MAX_VCPUS); the host may allow fewer
# No guest here addresses more than 2^46 bytes of test memory (the core puts
# the region above 4 GiB, under the CPU's physical-address width).
MAX_REGION_BYTES = 1 << 46
MAX_READERS = 4096
MAX_READ_BATCH = 64  # UKVM_MAX_READ_BATCH
MAX_DELAY_US = 10_000_000
MAX_GUEST_WORK = 1_000_000
MAX_PASSES = 1_000_000
MAX_CPU = 1023
MAX_REMOTE_LATENCY_US = 10_000_000
MAX_REMOTE_BANDWIDTH_MBPS = 1_000_000_000   # 1 Pbit/s: past any real link
MAX_INFLIGHT = 1_000_000

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def _is_bool(value: Any) -> bool:
    """A bool, or numpy's (np.bool_, np.bool in numpy 2)."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy"
                                       and kind.__name__ in ("bool_", "bool"))


def _as_int(value: Any) -> int | None:
    """value as an int if it is an integer (a numpy integer too), else None.
    A bool is not one: True is no count of anything."""
    if _is_bool(value):
        return None
    try:
        return int(operator.index(value))
    except TypeError:
        return None


def parse_size(value: int | str, field: str = "size") -> int:
    """Bytes from an int (a numpy integer too) or a string such as "64M",
    "1G", "4096" or "2GiB"."""
    number = _as_int(value)
    if number is not None:
        return number
    if not isinstance(value, str):
        raise ConfigError(f"{field}: expected bytes as an int or a string like '64M', "
                          f"not {value!r}", field=field)
    m = _SIZE_RE.match(value)
    if not m:
        raise ConfigError(f"{field}: {value!r} is not a size; give bytes, or a number "
                          f"with K, M, G or T (powers of 1024), e.g. '64M'", field=field)
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


def format_size(n: int) -> str:
    """The shortest exact K/M/G/T spelling of n bytes: 67108864 -> '64M'."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _SIZE_UNITS[unit] == 0:
            return f"{n // _SIZE_UNITS[unit]}{unit}"
    return str(n)


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise ConfigError(f"{field}: {value!r} is not one of {', '.join(map(repr, choices))}",
                      field=field)


def _integer(field: str, value: Any, low: int, high: int | None = None) -> int:
    number = _as_int(value)
    if number is None:
        raise ConfigError(f"{field}: expected an int, not {value!r}", field=field)
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{field}: must be {bound}, not {number}", field=field)
    return number


def _flag(field: str, value: Any) -> bool:
    if _is_bool(value):
        return bool(value)
    raise ConfigError(f"{field}: expected True or False, not {value!r}", field=field)


def _cpus(field: str, value: Any) -> tuple[int, ...] | None:
    """None, or a non-empty tuple of CPU numbers (from any iterable of them, a
    single number, or a string like "0,2,3")."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"{field}: {value!r} is not a list of CPU numbers like '0,1'",
                              field=field) \
                from None
    if _as_int(value) is not None:
        value = [value]
    if isinstance(value, (set, frozenset)):
        raise ConfigError(f"{field}: a set has no order, and CPUs are assigned round-robin "
                          f"in the order given: use a list, not {value!r}", field=field)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        value = list(value)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{field}: expected a non-empty list of CPU numbers, not {value!r}",
                          field=field)
    return tuple(_integer(field, cpu, 0, MAX_CPU) for cpu in value)


# What save_touch_order's comment line says the pages are.
_TOUCH_ORDER_PAGE_RE = re.compile(r"\((\d+)-byte pages")


def read_touch_order(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """The page indices a file that :meth:`Result.save_touch_order` wrote
    holds: one non-negative integer a line, blank lines and lines starting
    with ``#`` skipped. Raises ConfigError (field ``replay_from``) naming
    the line that is not one."""
    return _read_touch_order(path)[0]


def _read_touch_order(path: str | os.PathLike[str]) -> tuple[tuple[int, ...], int | None]:
    """read_touch_order(), and the page size the file's comment line says
    its indices count in (None: it says none)."""
    pages = []
    page_size = None
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                text = line.strip()
                if text.startswith("#") and page_size is None:
                    m = _TOUCH_ORDER_PAGE_RE.search(text)
                    page_size = int(m.group(1)) if m else None
                if not text or text.startswith("#"):
                    continue
                if not text.isdigit():
                    raise ConfigError(f"replay_from: {os.fspath(path)!r} line {n}: {text!r} "
                                      f"is not a page index (one non-negative integer a "
                                      f"line, as Result.save_touch_order writes)",
                                      field="replay_from")
                pages.append(int(text))
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path, bytes not UTF-8
        if isinstance(e, ConfigError):
            raise
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise ConfigError(f"replay_from: cannot read {os.fspath(path)!r}: {why}",
                          field="replay_from") from None
    return tuple(pages), page_size


def _replay(value: Any, pages: int, page_size: int) -> tuple[int, ...]:
    """replay_from as a tuple of page indices: read from a path, or from any
    sequence of integers; each below pages, none twice, at least one. A file
    recorded with pages of another size than page_size is refused: its
    indices would name other memory."""
    if isinstance(value, (str, os.PathLike)):
        order, recorded = _read_touch_order(value)
        if recorded is not None and recorded != page_size:
            raise ConfigError(f"replay_from: {os.fspath(value)!r} counts {recorded}-byte "
                              f"pages, and this run's backing has {page_size}-byte pages; "
                              f"record the order with the same backing", field="replay_from")
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict, set, frozenset)):
        order = tuple(_integer("replay_from", v, 0) for v in value)
    else:
        raise ConfigError(f"replay_from: expected a path to a touch order file or a sequence "
                          f"of page indices, not {value!r}", field="replay_from")
    if not order:
        raise ConfigError("replay_from: no pages: replay needs the order of at least one "
                          "(Result.touch_order of an earlier run)", field="replay_from")
    seen: set[int] = set()
    for i, page in enumerate(order):
        if page >= pages:
            raise ConfigError(f"replay_from: entry {i} is page {page}, beyond the region's "
                              f"{pages} pages (indices count pages of the backing's page "
                              f"size from the region's start)", field="replay_from")
        if page in seen:
            raise ConfigError(f"replay_from: entry {i} repeats page {page}; each page is "
                              f"installed once", field="replay_from")
        seen.add(page)
    return order


def _page_size(field: str, value: Any) -> str:
    number = _as_int(value)
    if number is not None:
        for name, size in GUEST_PAGE_SIZES.items():
            if size == number:
                return name
    if isinstance(value, str) and value.upper().replace("IB", "").replace("B", "") \
            in GUEST_PAGE_SIZES:
        return value.upper().replace("IB", "").replace("B", "")
    raise ConfigError(f"{field}: {value!r} is not one of '4K', '2M', '1G'", field=field)


# A CPU list as Config takes it: "0,2,3", one number, or any iterable of them.
CpuList = str | SupportsIndex | Iterable[SupportsIndex]
PIN_WITH_VCPUS = "vcpus"  # pin_readers: each reader on the CPU of the vCPU it serves


@dataclass(frozen=True)
class Config:
    """One experiment. Fields are checked when the Config is made, so a bad
    value fails here (a ConfigError with the field's name in ``.field``),
    before any VM exists. Fields are stored in one form whatever form they
    were given in: numbers as int (numpy integers are accepted), sizes as
    bytes, choices in lower case, CPU lists as tuples.

    vcpus            vCPUs, each in its own host thread
    mem_per_vcpu     bytes each vCPU demand-pages: given as an int or a string
                     such as "64M" or "1G", stored as an int
    backing          the memory: "anonymous" (private, THP off), "anonymous_thp",
                     "anonymous_hugetlb" (2 MiB), "anonymous_hugetlb_1gb",
                     "shmem" (memfd), "shared_hugetlb" (2 MiB hugetlbfs memfd),
                     "guest_memfd"; faults are resolved at its page size
    uffd_mode        "missing" (UFFDIO_COPY or UFFDIO_ZEROPAGE), "minor"
                     (UFFDIO_CONTINUE after the page cache is prefilled; shared
                     backings only), "wp" (write-protect, QEMU's background
                     snapshot: the region is filled and write-protected before
                     the vCPUs start; the guest's first write to a page faults,
                     the resolver saves the page's old contents into a snapshot
                     and un-protects it with UFFDIO_WRITEPROTECT; reads never
                     fault; anonymous and shmem only), or None: no userfaultfd,
                     the kernel pages memory in itself (the baseline)
    single_uffd      one uffd for the whole region instead of one per vCPU
    resolver         who resolves a fault: "readers" (reader threads read the
                     uffd's messages while the faulting vCPU sleeps in the
                     kernel) or "vcpu" (the uffd answers a fault with SIGBUS,
                     KVM_RUN returns to the vCPU's own thread, and it resolves
                     the page and runs on: no message, no wakeup, no reader
                     threads; readers, wait, read_batch and pin_readers must
                     stay at their defaults)
    readers          reader threads per uffd
    wait             how readers wait: "poll", "epoll", "epoll_exclusive", "read",
                     "spin" (a non-blocking read in a loop: never sleeps, for
                     readers with CPUs of their own; see allow_oversubscribe),
                     or "io_uring" (each reader keeps a read of the uffd in
                     flight in an io_uring of its own and sleeps in the ring;
                     needs a build with liburing and an io_uring that
                     waits for a read of a non-blocking file, Linux 5.15+,
                     which the setup checks by asking the kernel)
    allow_oversubscribe
                     let wait="spin" run more spinning readers than the CPUs
                     left beside the vCPUs (spinning on a shared CPU measures
                     the scheduler, so run() refuses it otherwise)
    read_batch       messages one read() of the uffd may return (1-64); above 1,
                     while reads come back full a reader reads again before it
                     waits (16 reads at most)
    delay_us         microseconds a reader waits per fault before resolving it
    delay_dist       "fixed" (exactly delay_us), "uniform" (0 to 2 x delay_us)
                     or "exponential" (mean delay_us), seeded by seed
    overlap          every vCPU walks the same region (implies one uffd)
    guest_page_size  how the guest's page tables map the region: "4K", "2M", "1G"
    pattern          the order each vCPU visits its pages: "sequential",
                     "reverse" or "random" (a seeded permutation: still every
                     page exactly once per pass)
    seed             seeds everything random (order, reads, delays)
    write_percent    0-100: the share of pages the guest writes; it reads the
                     rest (and checks what it read)
    passes           walks of the region per vCPU; only the first faults
    resolve          for missing faults: "copy" (UFFDIO_COPY of known data),
                     "zeropage" (UFFDIO_ZEROPAGE) or "move" (UFFDIO_MOVE, Linux
                     6.8+: the resolver fills a staging page of its own and
                     moves it into place, no copy; anonymous and
                     anonymous_thp only)
    pin_vcpus        host CPUs for the vCPU threads, assigned round-robin:
                     given as any iterable of CPU numbers, one number, or a
                     string "0,2,3"; stored as a tuple (None: unpinned)
    pin_readers      host CPUs for the reader threads, likewise; or "vcpus":
                     each reader runs on the CPU of the vCPU it serves (with
                     per-vCPU uffds, its uffd's vCPU; with one uffd, the
                     readers go round the vCPUs' CPUs), so that a fault wakes
                     a reader on the CPU the blocked vCPU just gave up, with
                     no wakeup across CPUs (needs pin_vcpus)
    prefault         populate the whole region before the vCPUs start: no
                     userfaults at all, the ceiling to compare with
    guest_work       guest computation after each page access: iterations of a
                     4-instruction loop, two of them stack accesses (0: none)
    stats            "full": readers time every fault (latency histograms,
                     per-vCPU attribution and blocktime); "basic": counters
                     only, no clock reads on the hot path
    guest_timing     the guest times every access with rdtsc into a histogram
                     (VcpuStats.access_latency); costly where rdtsc traps
    trace_faults     return every fault (Result.fault_trace); needs stats="full"
    timeout_s        seconds before the run is abandoned with RunTimeoutError;
                     None: a generous limit from the size of the run
                     (see effective_timeout_s); math.inf: no limit
    wp_async         uffd_mode="wp" only: UFFD_FEATURE_WP_ASYNC (Linux 6.7+), the
                     dirty-tracking variant: no fault is delivered, the kernel
                     un-protects each page on its first write, and after the
                     run PAGEMAP_SCAN collects the pages written
                     (Result.dirty_pages); no snapshot is saved
    source           where a resolved page's bytes come from: "synthetic" (made
                     up by the resolver, stamped with the page's address) or
                     "file" (a snapshot file, source_path, mapped onto the
                     region byte for byte: region offset o comes from file
                     offset o; uffdkvm.make_snapshot writes one) or "remote"
                     (a page server process that run() starts for the run
                     and stops after it, serving source_path over a socket:
                     the remote_* fields below). Applies to
                     uffd_mode="missing" with resolve="copy" or "move" (no
                     prefault)
    source_path      source="file" or "remote": the snapshot file, at least
                     region_bytes long (a str or os.PathLike, stored as a str)
    source_read      source="file": "pread" (pread(2) from an fd) or "mmap"
                     (memcpy from a read-only MAP_SHARED mapping of the file)
    source_cache     source="file": the file's page cache as the vCPUs start:
                     "warm" (read through once first) or "cold" (written back
                     and dropped with POSIX_FADV_DONTNEED; checked with
                     mincore(): Result.source_cached_pages_at_start)
    touch_percent    1-100: the share of each vCPU's pages the guest touches
                     at all, a seeded subset (the same pages for every vCPU
                     with overlap), visited in the pattern's order; the rest
                     are never touched, so they never fault (default 100)
    access           "uniform": every touched page once per pass (the
                     default); "zipf": each pass makes `accesses` accesses
                     drawn from a Zipf distribution over the vCPU's touched
                     pages (seeded; hot pages many times, some cold ones
                     never), with pattern "sequential"
    zipf_theta       access="zipf": the skew, above 0 (0.99 is the usual one;
                     higher is more skewed)
    accesses         access="zipf": accesses per pass per vCPU (None: as many
                     as it has touched pages)
    prefetch         install pages before the guest asks (uffd_mode="missing"
                     with resolve="copy"; UFFDIO_COPY_MODE_DONTWAKE): "none",
                     "readahead" (after each fault its resolver installs the
                     next prefetch_pages pages of the uffd that are absent),
                     "background" (a pusher thread installs the region in
                     address order, skipping resident pages, while faults are
                     served first) or "replay" (the pusher installs the pages
                     of replay_from in that order)
    prefetch_pages   readahead's window, in pages of the backing's page size
    prefetch_bandwidth_mbps
                     the pusher's rate (background, replay), in megabits
                     (10^6 bits) per second of page data; 0: as fast as it goes
    replay_from      replay's order: a path to a file Result.save_touch_order
                     wrote (read when the Config is made), or a sequence of
                     page indices (pages of the backing's page size from the
                     region's start, each once); stored as a tuple

    With source="remote" (a page server, uffdkvm/pageserver.py, serves the
    snapshot from a process of its own; its model runs on its side):

    remote_transport
                     "unix" (a Unix socket) or "tcp" (loopback TCP)
    remote_latency_us
                     microseconds from a request being taken up by the server
                     to its reply being ready (0-10_000_000)
    remote_bandwidth_mbps
                     the server's one link, in megabits per second: each reply
                     occupies it for its length / bandwidth (0: unlimited)
    max_inflight     requests the server serves at once (0: no cap); the rest
                     queue, faults ahead of background (prefetch) requests
    """

    vcpus: int = 1
    mem_per_vcpu: int = 1 << 30
    backing: str = "anonymous"
    uffd_mode: str | None = "missing"
    single_uffd: bool = False
    resolver: str = "readers"
    readers: int = 1
    wait: str = "epoll_exclusive"
    read_batch: int = 1
    allow_oversubscribe: bool = False
    delay_us: int = 0
    overlap: bool = False
    guest_work: int = 0
    guest_page_size: str = "4K"
    pattern: str = "sequential"
    seed: int = 0
    write_percent: int = 100
    passes: int = 1
    resolve: str = "copy"
    delay_dist: str = "fixed"
    pin_vcpus: tuple[int, ...] | None = None
    pin_readers: tuple[int, ...] | str | None = None
    prefault: bool = False
    stats: str = "full"
    guest_timing: bool = False
    trace_faults: bool = False
    timeout_s: float | None = None
    wp_async: bool = False
    source: str = "synthetic"
    source_path: str | None = None
    source_read: str = "pread"
    source_cache: str = "warm"
    touch_percent: int = 100
    access: str = "uniform"
    zipf_theta: float | None = None
    accesses: int | None = None
    prefetch: str = "none"
    prefetch_pages: int = 8
    prefetch_bandwidth_mbps: int = 0
    replay_from: tuple[int, ...] | None = None
    remote_transport: str = "unix"
    remote_latency_us: int = 0
    remote_bandwidth_mbps: int = 0
    max_inflight: int = 0

    if TYPE_CHECKING:
        # What the constructor takes, for type checkers; the annotations above
        # are what it stores (sizes in bytes, CPU lists as tuples, ...).
        def __init__(self, vcpus: SupportsIndex = ..., mem_per_vcpu: SupportsIndex | str = ...,
                     backing: str = ..., uffd_mode: str | None = ...,
                     single_uffd: bool = ..., resolver: str = ...,
                     readers: SupportsIndex = ..., wait: str = ...,
                     read_batch: SupportsIndex = ..., allow_oversubscribe: bool = ...,
                     delay_us: SupportsIndex = ..., overlap: bool = ...,
                     guest_work: SupportsIndex = ..., guest_page_size: SupportsIndex | str = ...,
                     pattern: str = ..., seed: SupportsIndex = ...,
                     write_percent: SupportsIndex = ..., passes: SupportsIndex = ...,
                     resolve: str = ..., delay_dist: str = ...,
                     pin_vcpus: CpuList | None = ..., pin_readers: CpuList | None = ...,
                     prefault: bool = ..., stats: str = ..., guest_timing: bool = ...,
                     trace_faults: bool = ..., timeout_s: float | None = ...,
                     wp_async: bool = ..., source: str = ...,
                     source_path: str | os.PathLike[str] | None = ...,
                     source_read: str = ..., source_cache: str = ...,
                     touch_percent: SupportsIndex = ...,
                     access: str = ..., zipf_theta: float | None = ...,
                     accesses: SupportsIndex | None = ..., prefetch: str = ...,
                     prefetch_pages: SupportsIndex = ...,
                     prefetch_bandwidth_mbps: SupportsIndex = ...,
                     replay_from: str | os.PathLike[str] | Iterable[SupportsIndex] | None = ...,
                     remote_transport: str = ...,
                     remote_latency_us: SupportsIndex = ...,
                     remote_bandwidth_mbps: SupportsIndex = ...,
                     max_inflight: SupportsIndex = ...) -> None: ...

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise through the back door
        put(self, "vcpus", _integer("vcpus", self.vcpus, 1, MAX_VCPUS))
        put(self, "backing", _choice("backing", self.backing, BACKINGS))
        put(self, "guest_page_size", _page_size("guest_page_size", self.guest_page_size))
        mem = parse_size(self.mem_per_vcpu, "mem_per_vcpu")
        unit = max(BACKING_PAGE_SIZES[self.backing], GUEST_PAGE_SIZES[self.guest_page_size])
        if mem < unit or mem % unit:
            why = (f"the {format_size(unit)} pages of {self.backing!r} memory"
                   if unit == BACKING_PAGE_SIZES[self.backing] and unit > PAGE_SIZE
                   else f"the guest's {format_size(unit)} pages" if unit > PAGE_SIZE
                   else "4 KiB pages")
            raise ConfigError(f"mem_per_vcpu: must be a positive multiple of {unit} "
                              f"({format_size(unit)}, {why}), not {mem}", field="mem_per_vcpu")
        put(self, "mem_per_vcpu", mem)
        region = mem if self.overlap is True else mem * self.vcpus
        if region > MAX_REGION_BYTES:
            what = "mem_per_vcpu" if self.overlap is True else "vcpus x mem_per_vcpu"
            raise ConfigError(f"mem_per_vcpu: {what} is {format_size(region)}, more guest "
                              f"memory than uffdkvm maps ({format_size(MAX_REGION_BYTES)}); "
                              f"use less memory per vCPU or fewer vCPUs", field="mem_per_vcpu")
        mode = self.uffd_mode
        if isinstance(mode, str) and mode.lower() == "none":
            mode = None
        if mode is not None and not (isinstance(mode, str) and mode.lower() in UFFD_MODES):
            raise ConfigError(f"uffd_mode: {mode!r} is not one of 'missing', 'minor', 'wp' or None "
                              f"(no userfaultfd: the kernel pages memory in itself)",
                              field="uffd_mode")
        put(self, "uffd_mode", None if mode is None else mode.lower())
        put(self, "single_uffd", _flag("single_uffd", self.single_uffd))
        put(self, "readers", _integer("readers", self.readers, 1, MAX_READERS))
        put(self, "read_batch", _integer("read_batch", self.read_batch, 1, MAX_READ_BATCH))
        put(self, "allow_oversubscribe", _flag("allow_oversubscribe", self.allow_oversubscribe))
        put(self, "wait", _choice("wait", self.wait, WAITS))
        put(self, "resolver", _choice("resolver", self.resolver, RESOLVERS))
        put(self, "delay_us", _integer("delay_us", self.delay_us, 0, MAX_DELAY_US))
        put(self, "delay_dist", _choice("delay_dist", self.delay_dist, DELAY_DISTS))
        put(self, "overlap", _flag("overlap", self.overlap))
        put(self, "guest_work", _integer("guest_work", self.guest_work, 0, MAX_GUEST_WORK))
        put(self, "pattern", _choice("pattern", self.pattern, PATTERNS))
        put(self, "seed", _integer("seed", self.seed, 0, (1 << 64) - 1))
        put(self, "write_percent", _integer("write_percent", self.write_percent, 0, 100))
        put(self, "passes", _integer("passes", self.passes, 1, MAX_PASSES))
        put(self, "resolve", _choice("resolve", self.resolve, RESOLVES))
        put(self, "pin_vcpus", _cpus("pin_vcpus", self.pin_vcpus))
        if isinstance(self.pin_readers, str) and \
                self.pin_readers.strip().lower() == PIN_WITH_VCPUS:
            if self.pin_vcpus is None:
                raise ConfigError(
                    f"pin_readers: {PIN_WITH_VCPUS!r} runs each reader on its vCPU's CPU, "
                    f"so the vCPUs need CPUs: set pin_vcpus too (e.g. pin_vcpus='0,1'; "
                    f"-c or --pin-vcpus on the command line)",
                    field="pin_readers")
            put(self, "pin_readers", PIN_WITH_VCPUS)
        else:
            put(self, "pin_readers", _cpus("pin_readers", self.pin_readers))
        put(self, "prefault", _flag("prefault", self.prefault))
        put(self, "stats", _choice("stats", self.stats, STATS))
        put(self, "guest_timing", _flag("guest_timing", self.guest_timing))
        put(self, "trace_faults", _flag("trace_faults", self.trace_faults))
        put(self, "wp_async", _flag("wp_async", self.wp_async))
        self._check_access()
        put(self, "remote_transport", _choice("remote_transport", self.remote_transport,
                                              REMOTE_TRANSPORTS))
        put(self, "remote_latency_us", _integer("remote_latency_us", self.remote_latency_us,
                                                0, MAX_REMOTE_LATENCY_US))
        put(self, "remote_bandwidth_mbps", _integer(
            "remote_bandwidth_mbps", self.remote_bandwidth_mbps, 0, MAX_REMOTE_BANDWIDTH_MBPS))
        put(self, "max_inflight", _integer("max_inflight", self.max_inflight, 0, MAX_INFLIGHT))
        if self.trace_faults and self.stats != "full":
            raise ConfigError("trace_faults: needs stats='full' (stats='basic' keeps no "
                              "record of each fault)", field="trace_faults")
        if self.resolver == "vcpu":
            self._check_no_readers()
        if self.timeout_s is not None:
            if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real) \
                    or not self.timeout_s > 0:
                raise ConfigError(f"timeout_s: expected a positive number of seconds, "
                                  f"math.inf or None, not {self.timeout_s!r}", field="timeout_s")
            put(self, "timeout_s", float(self.timeout_s))
        if self.uffd_mode == "minor" and self.backing not in SHARED_BACKINGS:
            raise ConfigError(
                f"uffd_mode: 'minor' needs a shared backing ({', '.join(SHARED_BACKINGS)}); "
                f"MINOR faults come from pages that are in the page cache but not mapped, "
                f"and {self.backing!r} memory has no page cache. Use backing='shmem' or "
                f"uffd_mode='missing'", field="uffd_mode")
        if self.uffd_mode == "wp" and self.backing not in WP_BACKINGS:
            raise ConfigError(
                f"uffd_mode: 'wp' runs on {' or '.join(repr(b) for b in WP_BACKINGS)} memory, "
                f"not {self.backing!r}: the snapshot is saved and verified a 4 KiB page at a "
                f"time (a huge page's first write would save it whole), and guest_memfd "
                f"cannot be registered with userfaultfd. Use backing='anonymous' or 'shmem'",
                field="uffd_mode")
        if self.wp_async and self.uffd_mode != "wp":
            raise ConfigError(f"wp_async: applies to uffd_mode='wp' only, not "
                              f"{self.uffd_mode!r}; set uffd_mode='wp' or leave wp_async "
                              f"False", field="wp_async")
        if self.wp_async and self.resolver == "vcpu":
            raise ConfigError("wp_async: delivers no faults (the kernel un-protects each "
                              "written page itself), so resolver='vcpu' would resolve "
                              "nothing; use resolver='readers'", field="wp_async")
        self._check_source()
        if self.resolve == "zeropage" and self.uffd_mode != "missing":
            raise ConfigError("resolve: 'zeropage' resolves missing faults only; use "
                              "uffd_mode='missing' or resolve='copy'", field="resolve")
        if self.resolve == "zeropage" and self.backing in HUGETLB_BACKINGS:
            raise ConfigError(f"resolve: 'zeropage' does not work on hugetlb memory "
                              f"({self.backing!r} has no UFFDIO_ZEROPAGE); use resolve='copy'",
                              field="resolve")
        if self.resolve == "move" and self.uffd_mode != "missing":
            raise ConfigError("resolve: 'move' resolves missing faults only (a MINOR fault's "
                              "page is in the page cache already); use uffd_mode='missing' or "
                              "resolve='copy'", field="resolve")
        if self.resolve == "move" and self.backing not in MOVE_BACKINGS:
            raise ConfigError(f"resolve: 'move' needs private anonymous memory "
                              f"({', '.join(MOVE_BACKINGS)}): UFFDIO_MOVE cannot move pages of "
                              f"{self.backing!r} memory; use resolve='copy' or "
                              f"backing='anonymous'", field="resolve")
        self._check_prefetch()

    def _check_prefetch(self) -> None:
        """prefetch and its knobs: each applies to some policies only, and a
        knob set for a policy that does not read it is refused, not ignored."""
        put = object.__setattr__
        put(self, "prefetch", _choice("prefetch", self.prefetch, PREFETCHES))
        put(self, "prefetch_pages",
            _integer("prefetch_pages", self.prefetch_pages, 1, MAX_PREFETCH_PAGES))
        put(self, "prefetch_bandwidth_mbps",
            _integer("prefetch_bandwidth_mbps", self.prefetch_bandwidth_mbps, 0, 1 << 40))
        if self.prefetch != "none" and (self.uffd_mode != "missing" or self.resolve != "copy"):
            raise ConfigError(
                f"prefetch: {self.prefetch!r} installs pages with their data (UFFDIO_COPY) "
                f"into missing pages, so it needs uffd_mode='missing' and resolve='copy', "
                f"not uffd_mode={self.uffd_mode!r} with resolve={self.resolve!r}",
                field="prefetch")
        if self.prefetch != "none" and self.prefault:
            raise ConfigError(f"prefetch: {self.prefetch!r} has nothing to install with "
                              f"prefault=True (every page is there before the vCPUs start)",
                              field="prefetch")
        if self.prefetch_pages != 8 and self.prefetch != "readahead":
            raise ConfigError(f"prefetch_pages: the readahead window, so it does nothing with "
                              f"prefetch={self.prefetch!r}; set prefetch='readahead' or leave "
                              f"prefetch_pages at 8", field="prefetch_pages")
        if self.prefetch_bandwidth_mbps and self.prefetch not in ("background", "replay"):
            raise ConfigError(f"prefetch_bandwidth_mbps: the pusher's rate (prefetch "
                              f"'background' or 'replay'), so it does nothing with "
                              f"prefetch={self.prefetch!r}; leave it at 0",
                              field="prefetch_bandwidth_mbps")
        if self.prefetch == "replay":
            if self.replay_from is None:
                raise ConfigError("replay_from: prefetch='replay' needs the order to install "
                                  "pages in: a file Result.save_touch_order wrote, or a "
                                  "sequence of page indices", field="replay_from")
            put(self, "replay_from",
                _replay(self.replay_from, self.region_bytes // self.page_size,
                        self.page_size))
        elif self.replay_from is not None:
            raise ConfigError(f"replay_from: applies to prefetch='replay' only, not "
                              f"{self.prefetch!r}; set prefetch='replay' or leave replay_from "
                              f"None", field="replay_from")

    def _check_source(self) -> None:
        """source and its fields: a source supplies the data of a missing
        fault resolved with data; the file fields mean nothing without a file."""
        put = object.__setattr__
        put(self, "source", _choice("source", self.source, SOURCES))
        put(self, "source_read", _choice("source_read", self.source_read, SOURCE_READS))
        put(self, "source_cache", _choice("source_cache", self.source_cache, SOURCE_CACHES))
        if self.source_path is not None:
            try:
                path = os.fspath(self.source_path)
            except TypeError:
                path = None
            if not isinstance(path, str) or not path or "\x00" in path:
                raise ConfigError(f"source_path: expected the path of a snapshot file (a str "
                                  f"or os.PathLike), not {self.source_path!r}",
                                  field="source_path")
            put(self, "source_path", path)
        remote_fields = ("remote_transport", "remote_latency_us", "remote_bandwidth_mbps",
                         "max_inflight")
        if self.source != "remote":
            self._defaults_only(remote_fields, "source='remote'", f"source={self.source!r}")
        if self.source in ("file", "remote"):
            if self.source_path is None:
                raise ConfigError(f"source_path: source={self.source!r} needs the path of a "
                                  f"snapshot file; write one with uffdkvm.make_snapshot(path, "
                                  f"config.region_bytes)", field="source_path")
            if self.uffd_mode != "missing" or self.resolve not in ("copy", "move") \
                    or self.prefault:
                why = ("prefault populates every page before the vCPUs start, so nothing "
                       "is fetched" if self.prefault else
                       f"uffd_mode={self.uffd_mode!r} with resolve={self.resolve!r} installs "
                       f"no data fetched for the fault")
                raise ConfigError(f"source: {self.source!r} supplies the data of missing "
                                  f"faults resolved with data (uffd_mode='missing' with "
                                  f"resolve='copy' or 'move', no prefault); {why}",
                                  field="source")
        if self.source != "file":
            # A page server reads its file itself: its cache is the server's.
            self._defaults_only(("source_read", "source_cache"), "source='file'",
                                f"source={self.source!r}")
        if self.source == "synthetic":
            self._defaults_only(("source_path",), "source='file' or 'remote'",
                                "source='synthetic'")

    def _defaults_only(self, names: tuple[str, ...], applies: str, here: str) -> None:
        """Each field of names at its default: it applies to `applies` only."""
        for name in names:
            default = next(f.default for f in dataclasses.fields(self) if f.name == name)
            if getattr(self, name) != default:
                raise ConfigError(f"{name}: applies to {applies} only, not {here}; set "
                                  f"{applies} or leave {name} at its default ({default!r})",
                                  field=name)
    def _check_access(self) -> None:
        """touch_percent, access, zipf_theta, accesses: the guest's access model."""
        put = object.__setattr__
        put(self, "touch_percent", _integer("touch_percent", self.touch_percent, 1, 100))
        put(self, "access", _choice("access", self.access, ACCESSES))
        if self.access != "zipf":
            for field in ("zipf_theta", "accesses"):
                if getattr(self, field) is not None:
                    raise ConfigError(
                        f"{field}: applies to access='zipf' only (with access="
                        f"{self.access!r} every touched page is visited once per pass); "
                        f"set access='zipf' or leave {field} unset", field=field)
            return
        theta = self.zipf_theta
        if theta is None or isinstance(theta, bool) or not isinstance(theta, numbers.Real) \
                or not 0 < theta <= MAX_ZIPF_THETA:
            raise ConfigError(f"zipf_theta: access='zipf' needs a skew above 0 and at most "
                              f"{MAX_ZIPF_THETA:g} (0.99 is the usual one), not {theta!r}",
                              field="zipf_theta")
        put(self, "zipf_theta", float(theta))
        if self.accesses is not None:
            put(self, "accesses", _integer("accesses", self.accesses, 1, MAX_ACCESSES))
        if self.pattern != "sequential":
            raise ConfigError(f"pattern: {self.pattern!r} has no meaning with access='zipf' "
                              f"(its accesses are random draws from the Zipf distribution); "
                              f"leave pattern='sequential'", field="pattern")

    @property
    def region_bytes(self) -> int:
        """Bytes of guest memory under test."""
        return self.mem_per_vcpu if self.overlap else self.mem_per_vcpu * self.vcpus

    @property
    def pages_per_vcpu(self) -> int:
        """4 KiB pages each vCPU touches per pass."""
        return self.mem_per_vcpu // PAGE_SIZE

    @property
    def page_size(self) -> int:
        """Bytes resolved per fault: the backing's page size."""
        return BACKING_PAGE_SIZES[self.backing]

    @property
    def effective_timeout_s(self) -> float:
        """The time limit a run of this Config gets: timeout_s, or when None a
        generous one: 60 s, plus 2 ms per page touched, plus twice the
        configured delay for every fault (as if no two delays overlapped),
        and with source="remote" twice the page server's time for every page
        (its latency and the page's time on its link, as if nothing
        overlapped: the faults' fetches and a prefetcher's, one by one)."""
        if self.timeout_s is not None:
            return self.timeout_s
        touched = max(self.pages_per_vcpu, self.accesses or 0) * self.vcpus * self.passes
        faults = self.region_bytes // self.page_size
        limit = 60.0 + 0.002 * touched + 2 * self.delay_us * 1e-6 * faults
        if self.source == "remote":
            link_s = self.page_size * 8 / (self.remote_bandwidth_mbps * 1e6) \
                if self.remote_bandwidth_mbps else 0.0
            limit += 2 * 2 * faults * (self.remote_latency_us * 1e-6 + link_s)
        return limit

    @property
    def uffds(self) -> int:
        """How many userfaultfds the run opens."""
        if self.uffd_mode is None:
            return 0
        return 1 if self.single_uffd or self.overlap else self.vcpus

    def _check_no_readers(self) -> None:
        """resolver="vcpu" has no reader threads: a reader field set away
        from its default would be silently ignored, so it is refused."""
        for name in ("readers", "wait", "read_batch", "pin_readers"):
            default = next(f.default for f in dataclasses.fields(self) if f.name == name)
            if getattr(self, name) != default:
                raise ConfigError(
                    f"{name}: resolver='vcpu' has no reader threads (each vCPU's own thread "
                    f"resolves its faults), so {name}={getattr(self, name)!r} would do "
                    f"nothing; leave {name} at its default ({default!r}) or use "
                    f"resolver='readers'", field=name)

    @property
    def reader_cpus(self) -> tuple[int, ...] | None:
        """The CPU of every reader, in the core's order (reader k of all uffds,
        a uffd's readers together, runs on entry k modulo the length), or
        None: unpinned. pin_readers, with "vcpus" spelled out."""
        if not isinstance(self.pin_readers, str):
            return self.pin_readers
        pins = self.pin_vcpus or ()
        # vCPU v runs on pins[v % len(pins)]: the CPUs the vCPUs get, in order
        vcpu_cpus = [pins[v % len(pins)] for v in range(self.vcpus)]
        if self.uffds == 1:  # one uffd serves every vCPU: go round their CPUs
            return tuple(vcpu_cpus[i % self.vcpus] for i in range(self.readers))
        # uffd u serves vCPU u alone
        return tuple(vcpu_cpus[u] for u in range(self.vcpus) for _ in range(self.readers))

    def replace(self, **fields: Any) -> Config:
        """A copy with some fields changed (validated like a new Config)."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"{', '.join(sorted(unknown))}: not a Config field; fields are "
                              f"{', '.join(f.name for f in dataclasses.fields(self))}", field=None)
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python values (tuples become lists), which
        ``Config(**d)`` takes back; ``Result.to_dict()`` gives strict JSON values."""
        d = dataclasses.asdict(self)
        for key in ("pin_vcpus", "pin_readers", "replay_from"):
            if isinstance(d[key], tuple):
                d[key] = list(d[key])
        return d
