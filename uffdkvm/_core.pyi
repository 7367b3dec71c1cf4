"""The C core (csrc/module.c): plain dicts and ints in, plain dicts out.

uffdkvm/run.py is its one caller; everything here is internal.
"""
from collections.abc import Callable
from typing import Any

_ProgressReport = Callable[[str, list[int], list[int]], object]

class CoreError(RuntimeError):
    """A failure reported by the core: args are (kind, errno, message), kind
    one of the ERR_* constants."""


def run(config: dict[str, Any], progress: _ProgressReport | None = None, /) -> dict[str, Any]:
    """Run one experiment; progress(phase, pages_done, pages_total) is called
    every 50 ms with a list per vCPU."""

def probe(config: dict[str, Any], /) -> None:
    """Build what the config needs and register it, run nothing."""

def make_snapshot(path: str, size: int, seed: int, /) -> None:
    """Write a snapshot file of size bytes, every word a function of (seed, offset)."""

def wait_idle(timeout_s: float = 10.0, /) -> None:
    """Wait until failed runs have released their threads, fds and memory."""

def pageserver_serve(snapshot_path: str, listen: str, latency_ns: int, bandwidth_mbps: int,
                     max_inflight: int, ready_fd: int, stop_fd: int, /) -> dict[str, int]:
    """Serve the snapshot until SIGTERM, SIGINT or stop_fd polls readable
    (uffdkvm/pageserver.py's child); returns the final counters."""

def remote_fetch(address: str, offset: int, length: int, urgent: bool, timeout_s: float,
                 /) -> bytes:
    """Test hooks only: the C client fetches one range from a page server."""

# Bucket b of the core's latency histograms holds [HIST_BOUNDS[b],
# HIST_BOUNDS[b + 1]) nanoseconds.
HIST_BOUNDS: list[int]

# Whether this build has the fault-injection hooks (UFFDKVM_TEST_HOOKS=1).
TEST_HOOKS: bool
# Whether this build has liburing, and so wait="io_uring" (setup.py finds it,
# unless UFFDKVM_NO_LIBURING=1).
HAVE_IO_URING: bool

BACKING_ANONYMOUS: int
BACKING_SHMEM: int
BACKING_ANONYMOUS_THP: int
BACKING_ANONYMOUS_HUGETLB: int
BACKING_ANONYMOUS_HUGETLB_1GB: int
BACKING_SHARED_HUGETLB: int
BACKING_GUEST_MEMFD: int
PATTERN_SEQUENTIAL: int
PATTERN_REVERSE: int
PATTERN_RANDOM: int
ACCESS_UNIFORM: int
ACCESS_ZIPF: int
RESOLVE_COPY: int
RESOLVE_ZEROPAGE: int
RESOLVE_MOVE: int
DELAY_FIXED: int
DELAY_UNIFORM: int
DELAY_EXPONENTIAL: int
PREFETCH_NONE: int
PREFETCH_READAHEAD: int
PREFETCH_BACKGROUND: int
PREFETCH_REPLAY: int
STATS_FULL: int
CLOCK_SYNC_NONE: int
CLOCK_SYNC_KVM_OFFSET: int
CLOCK_SYNC_EXITS: int
STATS_BASIC: int
UFFD_NONE: int
UFFD_MISSING: int
UFFD_MINOR: int
UFFD_WP: int
WAIT_POLL: int
WAIT_EPOLL: int
WAIT_EPOLL_EXCLUSIVE: int
WAIT_READ: int
WAIT_SPIN: int
WAIT_IO_URING: int
RESOLVER_READERS: int
RESOLVER_VCPU: int
SOURCE_SYNTHETIC: int
SOURCE_FILE: int
SOURCE_REMOTE: int
SOURCE_READ_PREAD: int
SOURCE_READ_MMAP: int
SOURCE_CACHE_WARM: int
SOURCE_CACHE_COLD: int
ERR_CONFIG: int
ERR_HOST: int
ERR_RUN: int
ERR_TIMEOUT: int
ERR_CANCELLED: int
INJECT_RESOLVE_EIO: int
INJECT_READER_EXIT: int
INJECT_GUEST_FAULT: int
INJECT_GUEST_MMIO: int
INJECT_THREAD_CREATE: int
INJECT_CORRUPT_PAGE: int
INJECT_READER_STALL: int
INJECT_VCPU_STALL: int
INJECT_RESOLVE_EAGAIN: int
INJECT_READER_CRASH: int
INJECT_TSC_OFFSET: int
INJECT_NO_KVM_TSC_OFFSET: int
INJECT_UNFAULTED_PAGE: int
INJECT_TSC_JUMP: int
INJECT_NO_EXACT_ADDRESS: int
INJECT_NO_MOVE: int
INJECT_WP_NO_SAVE: int
INJECT_NO_WP_FEATURES: int
INJECT_SOURCE_WRONG_OFFSET: int
INJECT_UNTOUCHED_PAGE: int
INJECT_RING_NOWAIT: int
INJECT_NO_VM_GUEST_MEMFD: int
INJECT_MINCORE_FAIL: int
INJECT_RELEASE_DUP3: int
