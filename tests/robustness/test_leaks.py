"""Many runs in one process leak nothing: fds, threads, mappings, memory.

A notebook or a sweep runs thousands of experiments in one process; each
must give back everything, on success and on every failure path. The suite
runs a few hundred tiny runs (a second or two); for a longer soak set
UFFDKVM_LEAK_RUNS, e.g.

    UFFDKVM_LEAK_RUNS=1000 pytest tests/robustness/test_leaks.py -s

which prints the numbers.
"""
import ctypes
import gc
import os
import signal
import threading

import pytest

import uffdkvm
from helpers.resources import assert_released, resources
from helpers.runs import run_with_fault
from helpers.skips import TEST_HOOKS

pytestmark = pytest.mark.kvm

RUNS = int(os.environ.get("UFFDKVM_LEAK_RUNS", "200"))
TINY = dict(vcpus=2, mem_per_vcpu="64K", readers=2)


def interrupted_run():
    timer = threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,))
    timer.start()
    try:
        uffdkvm.run(**TINY, delay_us=1_000_000)
    finally:
        timer.join()


_SNAPSHOT: list[str] = []


def tiny_snapshot():
    """A snapshot for TINY's region, made on first use (the endings run once
    before anything is counted) and removed at exit."""
    if not _SNAPSHOT:
        import atexit
        import shutil
        import tempfile
        folder = tempfile.mkdtemp(prefix="uffdkvm-leaks-")
        atexit.register(shutil.rmtree, folder, True)
        _SNAPSHOT.append(str(uffdkvm.make_snapshot(os.path.join(folder, "mem.img"), 128 << 10)))
    return dict(source="file", source_path=_SNAPSHOT[0])


# Every way a run can end: verified, with every kind of reader and backing,
# with the optional records, refused, failed, timed out, interrupted.
ENDINGS = {
    "verified": lambda: uffdkvm.run(**TINY),
    "read-single-uffd": lambda: uffdkvm.run(**TINY, wait="read", single_uffd=True),
    "minor-poll": lambda: uffdkvm.run(**TINY, backing="shmem", uffd_mode="minor",
                                      wait="poll"),
    "zeropage-epoll": lambda: uffdkvm.run(**TINY, resolve="zeropage", wait="epoll"),
    # the default beside a pinned vCPU: a SCHED_IDLE spinner
    "spin-idle": lambda: uffdkvm.run(**TINY, pin_vcpus=(min(os.sched_getaffinity(0)),)),
    "thp": lambda: uffdkvm.run(vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp"),
    # UFFDIO_MOVE: each resolver's staging area, 4 KiB pages and a 2 MiB one
    "move-vcpu": lambda: uffdkvm.run(vcpus=2, mem_per_vcpu="64K", resolve="move",
                                     resolver="vcpu"),
    "move-thp": lambda: uffdkvm.run(vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp",
                                    resolve="move"),
    "move-eio": lambda: run_with_fault(**TINY, resolve="move", fault="resolve_eio", after=5),
    # Write-protect (async: the pagemap scan) and the vCPU resolver's failures.
    # A leaked snapshot would escape the mapping count (an anonymous mapping
    # can merge with its neighbour): these guard the fds and threads.
    "wp": lambda: uffdkvm.run(**TINY, uffd_mode="wp", write_percent=50),
    "wp-vcpu-shmem": lambda: uffdkvm.run(**TINY, uffd_mode="wp", backing="shmem",
                                         resolver="vcpu"),
    "wp-async": lambda: uffdkvm.run(**TINY, uffd_mode="wp", wp_async=True),
    "wp-eio": lambda: run_with_fault(**TINY, uffd_mode="wp", fault="resolve_eio", after=5),
    "vcpu-resolver-eio": lambda: run_with_fault(**TINY, resolver="vcpu", fault="resolve_eio",
                                                after=5),
    # Prefetch: readahead, the pusher thread (address order, replay), and a
    # pusher still pacing itself when the run fails.
    "prefetch-readahead-vcpu": lambda: uffdkvm.run(vcpus=2, mem_per_vcpu="64K",
                                                   resolver="vcpu", prefetch="readahead"),
    "prefetch-background": lambda: uffdkvm.run(**TINY, prefetch="background"),
    "prefetch-replay": lambda: uffdkvm.run(**TINY, prefetch="replay",
                                           replay_from=range(31, -1, -1)),
    "prefetch-paced-eio": lambda: run_with_fault(**TINY, prefetch="background",
                                                 prefetch_bandwidth_mbps=1,
                                                 fault="resolve_eio", after=5),
    # preinstall: pages put in before the vCPUs start, beside the pusher; and
    # a run that fails on one of the rest.
    "preinstall-pusher": lambda: uffdkvm.run(**TINY, **tiny_snapshot(),
                                             preinstall=range(0, 32, 2),
                                             prefetch="background"),
    "preinstall-eio": lambda: run_with_fault(**TINY, **tiny_snapshot(), preinstall=range(16),
                                             fault="resolve_eio", after=5),
    "trace-timing": lambda: uffdkvm.run(**TINY, trace_faults=True, guest_timing=True,
                                        passes=2),
    "stats-basic": lambda: uffdkvm.run(**TINY, stats="basic", overlap=True),
    "no-uffd": lambda: uffdkvm.run(**TINY, uffd_mode=None),
    "prefault": lambda: uffdkvm.run(**TINY, prefault=True),
    "refused-in-python": lambda: uffdkvm.run(**TINY, pin_vcpus=[1023]),
    "refused-by-kvm": lambda: uffdkvm.run(vcpus=100_000, mem_per_vcpu="4K"),
    "resolve-eio": lambda: run_with_fault(**TINY, fault="resolve_eio", after=5),
    "guest-fault": lambda: run_with_fault(**TINY, fault="guest_fault", after=3),
    "guest-mmio": lambda: run_with_fault(**TINY, fault="guest_mmio", after=3),
    "reader-thread": lambda: run_with_fault(**TINY, fault="thread_create", after=3),
    "vcpu-thread": lambda: run_with_fault(**TINY, fault="thread_create", after=6),
    "corrupt": lambda: run_with_fault(**TINY, fault="corrupt_page", after=1),
    "timeout-at-once": lambda: uffdkvm.run(**TINY, timeout_s=1e-9),
    # Dirty tracking: the rings' mappings, the WP_ASYNC uffd and pagemap fd,
    # and a tracker that loses a page (the run fails at a pass gate).
    "dirty-ring": lambda: uffdkvm.run(**TINY, passes=3, dirty_tracking="ring",
                                      dirty_ring_entries=256),
    "dirty-wp-async": lambda: uffdkvm.run(**TINY, passes=3, dirty_tracking="wp_async",
                                          uffd_mode=None),
    "dirty-manual-lost": lambda: run_with_fault(**TINY, passes=3,
                                                dirty_tracking="bitmap_manual",
                                                fault="dirty_drop_page", after=1),
}
# Slower endings (a stuck vCPU is released 0.5 s into the stop): a few of each.
SLOW_ENDINGS = {
    "timeout-stuck": lambda: run_with_fault(**TINY, fault="reader_exit", after=2,
                                            wait="read", timeout_s=0.05),
    "interrupted": interrupted_run,
}


# Endings made by fault injection: a build without test hooks cannot make
# them (each skips in test_each_ending..., citing the fact; the many-runs test
# cycles through the others).
INJECTED = {name for name, ending in {**ENDINGS, **SLOW_ENDINGS}.items()
            if "run_with_fault" in ending.__code__.co_names}


def makeable(endings):
    return {name: e for name, e in endings.items() if TEST_HOOKS or name not in INJECTED}


def end(ending):
    try:
        ending()
    except (uffdkvm.UffdkvmError, KeyboardInterrupt):
        pass


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost".split()]


def _malloc_in_use():
    """Bytes the C heap has handed out (glibc), or None: the core allocates
    with malloc, so a forgotten free shows here and nowhere else."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    gc.collect()
    m = mallinfo2()
    return m.uordblks + m.hblkhd


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024


def warm_up():
    """Fills what fills once and then stays: first-use caches, and glibc's
    cache of thread stacks (up to 40 MiB, each keeping its malloc'ed TLS
    block), which 128 threads of 512 KiB overflow."""
    uffdkvm.run(vcpus=64, mem_per_vcpu="64K", single_uffd=True, readers=64)


def test_many_runs_of_every_ending_leak_nothing(kvm):
    """RUNS runs in three batches, cycling through every ending. A leak grows
    the C heap in every batch; what the interpreter grows once (a table
    resized on the way) shows in one batch at most."""
    names = list(makeable(ENDINGS))
    warm_up()
    for name in names:
        end(ENDINGS[name])
    end(SLOW_ENDINGS["interrupted"])
    before, rss = resources(), _rss()

    heap, per_batch = _malloc_in_use(), []
    for batch in range(3):
        for i in range(RUNS // 3):
            end(ENDINGS[names[i % len(names)]])
        for ending in makeable(SLOW_ENDINGS).values():
            end(ending)
        if heap is not None:
            now = _malloc_in_use()
            per_batch.append(now - heap)
            heap = now

    assert_released(before, maps_slack=4)
    after, rss_growth = resources(), _rss() - rss
    print(f"\n{RUNS // 3 * 3} runs + 6 slow ones: fds {before['fds']} -> {after['fds']}, "
          f"threads {before['threads']} -> {after['threads']}, "
          f"maps {before['maps']} -> {after['maps']}, "
          f"C heap in use per batch {per_batch} bytes, RSS {rss_growth / 1024:+.0f} KiB")
    if per_batch:
        # 16 bytes a run would be a leak; allow for a few interpreter objects.
        assert min(per_batch) < 16 * RUNS // 3 + 4096, f"the C heap grew {per_batch}"
    assert rss_growth < 4 * 1024 * 1024 + 1024 * RUNS, f"RSS grew {rss_growth} bytes"


@pytest.mark.parametrize("name", list(ENDINGS))
def test_each_ending_gives_back_its_fds_threads_and_mappings(kvm, name):
    end(ENDINGS[name])
    before = resources()
    for _ in range(5):
        end(ENDINGS[name])
    assert_released(before, maps_slack=2)
