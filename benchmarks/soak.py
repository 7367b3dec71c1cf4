#!/usr/bin/env python3
"""Thousands of runs in one process, across the feature matrix: nothing may grow.

    python benchmarks/soak.py [--runs 2000] [--json PATH]

A notebook or a sweep runs experiments for hours in one interpreter. This
cycles through MATRIX (every wait mode, both resolvers, the uffd modes, every
page source, every prefetch, wp, move, both stats modes, and runs that fail:
timeouts, injected errors where the build has test hooks, Ctrl-C), each run
small (64 KiB to 2 MiB a vCPU) so that 2,000 take minutes. Every Result must
verify and pass uffdkvm._invariants; every failing run must fail as its case
says. It measures the process (MEASURES: fds, threads, child processes,
mappings, RSS and its high-water mark, the C heap) after a warm-up and at
the end, and exits 1, printing the table, when any of them grew beyond its
TOLERANCE or a run ended otherwise than its case expects.

Cases the host cannot run (HostUnsupportedError: io_uring, spin with too few
CPUs, a kernel without UFFDIO_MOVE) are left out at the warm-up and listed.
tests/benchmarks/test_soak.py runs 200 of these same runs.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import uffdkvm
from uffdkvm._invariants import check_result

TINY = dict(vcpus=2, mem_per_vcpu="64K", readers=2)
HOOKS = uffdkvm._core.TEST_HOOKS
WARM_UP_CYCLES = 3


@dataclasses.dataclass(frozen=True)
class Case:
    """One kind of run: run(**fields), the snapshot as source_path where
    ``file``, through uffdkvm.testing._faults.run_with_fault where ``fault`` names
    an injected failure (fault, after), or ``special`` (a Ctrl-C). ``expect``
    is "verified" (a Result that verifies), "unverified" (one that does
    not: a page damaged on purpose) or the exception it must raise.
    ``every``: run once in that many cycles (the slow ones)."""

    name: str
    fields: dict[str, Any]
    expect: str | type[BaseException] = "verified"
    every: int = 1
    file: bool = False
    fault: tuple[str, int] | None = None
    special: Callable[[], Any] | None = None

    def run(self, snapshot: str) -> Any:
        fields = {**self.fields, **({"source_path": snapshot} if self.file else {})}
        if self.special:
            return self.special()
        if self.fault:
            from uffdkvm.testing._faults import run_with_fault
            return run_with_fault(fault=self.fault[0], after=self.fault[1], **fields)
        return uffdkvm.run(**fields)


def _case(name: str, expect: str | type[BaseException] = "verified", *, every: int = 1,
          file: bool = False, fault: tuple[str, int] | None = None, **fields: Any) -> Case:
    return Case(name, fields, expect, every, file, fault)


def _interrupted() -> Any:
    """Ctrl-C 50 ms into a run that would take 16 s (a second a fault)."""
    timer = threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,))
    timer.start()
    try:
        return uffdkvm.run(**TINY, delay_us=1_000_000)
    finally:
        timer.join()


def _cancelled() -> Any:
    """The progress callback raising KeyboardInterrupt, as a notebook's stop does."""
    def stop(progress: Any) -> None:
        raise KeyboardInterrupt
    return uffdkvm.run(vcpus=1, mem_per_vcpu="1M", readers=2, delay_us=2000, progress=stop)


EIO = ("resolve_eio", 5)
MATRIX: tuple[Case, ...] = (
    # the ways to wait, and the vCPU resolver
    _case("poll", **TINY, wait="poll"),
    _case("epoll", **TINY, wait="epoll"),
    _case("epoll_exclusive", **TINY, wait="epoll_exclusive"),
    _case("read-batch", **TINY, wait="read", read_batch=8),
    _case("io_uring", **TINY, wait="io_uring"),
    _case("spin", vcpus=1, mem_per_vcpu="64K", readers=1, wait="spin"),
    _case("resolver-vcpu", vcpus=2, mem_per_vcpu="64K", resolver="vcpu"),
    _case("single-uffd-overlap", vcpus=3, mem_per_vcpu="64K", readers=3, single_uffd=True,
          overlap=True, wait="epoll"),
    # uffd modes and how a page goes in
    _case("zeropage", **TINY, resolve="zeropage"),
    _case("minor-shmem", **TINY, backing="shmem", uffd_mode="minor"),
    _case("wp", **TINY, uffd_mode="wp", write_percent=50),
    _case("wp-async", **TINY, uffd_mode="wp", wp_async=True),
    _case("wp-vcpu-shmem", vcpus=2, mem_per_vcpu="64K", uffd_mode="wp", backing="shmem",
          resolver="vcpu"),
    _case("move", **TINY, resolve="move"),
    _case("move-vcpu", vcpus=2, mem_per_vcpu="64K", resolve="move", resolver="vcpu"),
    _case("move-thp", vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp", resolve="move"),
    _case("thp", vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp"),
    _case("no-uffd", **TINY, uffd_mode=None),
    _case("prefault", **TINY, prefault=True),
    # page sources: a snapshot file read both ways, a page server over both transports
    _case("file-pread", file=True, **TINY, source="file"),
    _case("file-mmap", file=True, **TINY, source="file", source_read="mmap"),
    _case("file-mmap-vcpu", file=True, vcpus=2, mem_per_vcpu="64K", source="file",
          source_read="mmap", resolver="vcpu"),
    _case("remote-unix", file=True, **TINY, source="remote"),
    _case("remote-tcp", file=True, **TINY, source="remote", remote_transport="tcp"),
    _case("remote-background", file=True, **TINY, source="remote", prefetch="background"),
    # prefetch
    _case("readahead", **TINY, prefetch="readahead"),
    _case("readahead-file", file=True, **TINY, source="file", prefetch="readahead"),
    _case("background", **TINY, prefetch="background"),
    _case("replay", **TINY, prefetch="replay", replay_from=range(31, -1, -1)),
    # what is measured
    _case("stats-basic", **TINY, stats="basic", overlap=True),
    _case("trace-timing", **TINY, trace_faults=True, guest_timing=True, passes=2),
    _case("zipf-trace", **TINY, access="zipf", zipf_theta=0.99, trace_faults=True),
    _case("touch-half", **TINY, touch_percent=50),
    # failing runs
    _case("refused-config", uffdkvm.UffdkvmError, **TINY, pin_vcpus=[1023]),
    _case("refused-by-kvm", uffdkvm.UffdkvmError, vcpus=100_000, mem_per_vcpu="4K"),
    _case("timeout-at-once", uffdkvm.RunTimeoutError, **TINY, timeout_s=1e-9),
    Case("interrupted", TINY, KeyboardInterrupt, every=4, special=_interrupted),
    Case("cancelled", {"vcpus": 1}, KeyboardInterrupt, every=4, special=_cancelled),
    *((
        _case("resolve-eio", uffdkvm.RunError, fault=EIO, **TINY),
        _case("move-eio", uffdkvm.RunError, fault=EIO, **TINY, resolve="move"),
        _case("wp-eio", uffdkvm.RunError, fault=EIO, **TINY, uffd_mode="wp"),
        _case("vcpu-resolver-eio", uffdkvm.RunError, fault=EIO, vcpus=2, mem_per_vcpu="64K",
              resolver="vcpu"),
        _case("prefetch-paced-eio", uffdkvm.RunError, fault=EIO, **TINY, prefetch="background",
              prefetch_bandwidth_mbps=1),
        _case("guest-fault", uffdkvm.RunError, fault=("guest_fault", 3), **TINY),
        _case("guest-mmio", uffdkvm.RunError, fault=("guest_mmio", 3), **TINY),
        _case("reader-thread", uffdkvm.RunError, fault=("thread_create", 3), **TINY),
        _case("vcpu-thread", uffdkvm.RunError, fault=("thread_create", 6), **TINY),
        _case("corrupt-page", "unverified", fault=("corrupt_page", 1), **TINY),
        _case("timeout-stuck", uffdkvm.RunTimeoutError, every=4, fault=("reader_exit", 2),
              **TINY, wait="read", timeout_s=0.05),
    ) if HOOKS else ()),
)


# ---- the measures

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost".split()]


def _mallinfo2() -> Any:
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    f.restype = _Mallinfo2
    return f


# Looked up once: every lookup makes ctypes objects that stay (a soak of
# its own measures would see them).
_MALLINFO2 = _mallinfo2()


def _heap_kib() -> int:
    """KiB the C heap has handed out (glibc's mallinfo2), -1 without it."""
    if _MALLINFO2 is None:
        return -1
    m = _MALLINFO2()
    return (m.uordblks + m.hblkhd) // 1024


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return -1


def _maps() -> tuple[int, int]:
    """/proc/self/maps: its lines, and the KiB they span."""
    lines = kib = 0
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = line.split(None, 1)[0].split("-")
            lines += 1
            kib += (int(hi, 16) - int(lo, 16)) // 1024
    return lines, kib


def _children() -> int:
    """Processes whose parent is this one, zombies included (every thread's
    /proc/self/task/TID/children)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                n += len(f.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return n


def measure() -> dict[str, int]:
    """The process as it stands, once the core's background cleanup is done."""
    uffdkvm._core.wait_idle()
    gc.collect()
    lines, kib = _maps()
    return {"fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")),
            "children": _children(),
            "maps": lines, "maps_kib": kib,
            "rss_kib": _status_kib("VmRSS"), "hwm_kib": _status_kib("VmHWM"),
            "heap_kib": _heap_kib()}


MEASURES = ("fds", "threads", "children", "maps", "maps_kib", "rss_kib", "hwm_kib", "heap_kib")
# How much each may grow from the warm-up to the end, whatever the number of
# runs: a leak of one of anything a run grows it by the runs (2,000 here,
# 200 in the test). fds, threads and children must come back exactly (one
# settle of a second, for a thread just joined that /proc still lists).
# The rest are allowed the allocator's noise, as measured over the 20
# checkpoints of leak-free 2,000-run soaks (benchmarks/RESULTS.md, "Soak"):
# - RSS rose 1.5 MiB in all, in steps of 0.1 to 1 MiB at a few checkpoints
#   and flat between them (glibc's arenas growing to the largest mix of
#   live blocks, and pages freed inside an arena staying resident until it
#   trims); 8 MiB is five times that, and is one page a run over 2,000 runs
#   (a leak of one page a run is caught). The high-water mark did not move
#   at all; it gets the same.
# - the C heap stepped up once by about half a MiB early on (one block of
#   939 KiB the interpreter allocates inside _core.run and keeps, as
#   tracemalloc shows: one, not one a run) and then moved within some
#   20 KiB, up and down, over 1,900 runs: 1 MiB.
# - the mappings: no line more or less, their span 1 MiB more once (an
#   arena's heap grown): 8 lines and 16 MiB.
TOLERANCE = {"fds": 0, "threads": 0, "children": 0, "maps": 8, "maps_kib": 16 * 1024,
             "rss_kib": 8 * 1024, "hwm_kib": 8 * 1024, "heap_kib": 1024}


def settled(before: dict[str, int], within_s: float = 1.0) -> dict[str, int]:
    """measure(), retried for up to within_s while fds, threads or children
    are above before's: a thread joined a moment ago, a page server process
    being reaped."""
    deadline = time.monotonic() + within_s
    while True:
        now = measure()
        if all(now[k] <= before[k] for k in ("fds", "threads", "children")) or \
                time.monotonic() > deadline:
            return now
        time.sleep(0.02)


# ---- the runs

@dataclasses.dataclass
class Report:
    runs: int = 0
    start: dict[str, int] = dataclasses.field(default_factory=dict)
    end: dict[str, int] = dataclasses.field(default_factory=dict)
    checkpoints: list[dict[str, int]] = dataclasses.field(default_factory=list)
    by_case: dict[str, int] = dataclasses.field(default_factory=dict)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    wrong: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def growth(self) -> dict[str, int]:
        return {k: self.end[k] - self.start[k] for k in MEASURES}

    def grown(self) -> list[str]:
        """The measures that grew beyond their tolerance."""
        return [k for k, g in self.growth().items() if g > TOLERANCE[k]]

    @property
    def ok(self) -> bool:
        return not self.grown() and not self.wrong

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "growth": self.growth(), "tolerance": TOLERANCE,
                "grown": self.grown(), "ok": self.ok}


def outcome(case: Case, snapshot: str) -> str | None:
    """Runs case once: None if it ended as expected, else what went wrong."""
    try:
        r = case.run(snapshot)
    except BaseException as e:  # noqa: B036 -- KeyboardInterrupt is a case's outcome
        if isinstance(case.expect, type) and isinstance(e, case.expect):
            return None
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"{case.name}: raised {type(e).__name__}: {e}"
    try:
        check_result(r)
    except uffdkvm.ResultError as e:
        return f"{case.name}: the core's Result breaks an invariant: {e}"
    got = "verified" if r.verified else "unverified"
    if case.expect != got:
        return f"{case.name}: {got} ({r.verify_message or 'no message'}), expected {case.expect}"
    return None


def cases_for_host(snapshot: str, report: Report) -> list[Case]:
    """MATRIX less what this host cannot run (run once each: the warm-up)."""
    usable = []
    for case in MATRIX:
        try:
            case.run(snapshot)
        except uffdkvm.HostUnsupportedError as e:
            if case.expect is not uffdkvm.UffdkvmError:
                report.left_out[case.name] = str(e).split("\n")[0][:160]
                continue
        except BaseException as e:  # noqa: B036 -- judged in soak(), with the rest
            if isinstance(e, KeyboardInterrupt) and case.expect is not KeyboardInterrupt:
                raise
        usable.append(case)
    return usable


def cycles(cases: list[Case], n: int) -> list[Case]:
    """n cycles of cases: each case once a cycle, the slow ones once in
    ``every`` cycles."""
    return [c for cycle in range(n) for c in cases if cycle % c.every == 0]


def schedule(cases: list[Case], runs: int) -> list[Case]:
    """The first runs runs of as many cycles as it takes."""
    n = 1
    while cases and len(plan := cycles(cases, n)) < runs:
        n += 1
    return plan[:runs] if cases else []


def soak(runs: int, checkpoints: int = 10,
         progress: Callable[[int, int], None] | None = None) -> Report:
    """runs runs across MATRIX, measured after a warm-up and at the end."""
    report = Report(runs=runs)
    with tempfile.TemporaryDirectory(prefix="uffdkvm-soak-") as tmp:
        snapshot = os.path.join(tmp, "snapshot")
        uffdkvm.make_snapshot(snapshot, 4 << 20)
        # Warm-up: every case once (what fills once and stays: first-use
        # caches, the page server's imports), glibc's cache of thread
        # stacks, up to 40 MiB, which 128 threads overflow, and then
        # WARM_UP_CYCLES of the schedule, for the allocators to settle to
        # its mix (RSS and the heap still step once or twice after it:
        # TOLERANCE).
        cases = cases_for_host(snapshot, report)
        uffdkvm.run(vcpus=64, mem_per_vcpu="64K", single_uffd=True, readers=64)
        for case in cycles(cases, WARM_UP_CYCLES):
            outcome(case, snapshot)
        plan = schedule(cases, runs)
        report.start = settled(measure(), 0)
        started = time.monotonic()
        every = max(1, runs // max(checkpoints, 1))
        for i, case in enumerate(plan, 1):
            wrong = outcome(case, snapshot)
            report.by_case[case.name] = report.by_case.get(case.name, 0) + 1
            if wrong:
                report.wrong.append(wrong)
            if i % every == 0 or i == len(plan):
                report.checkpoints.append({"run": i, **measure()})
                if progress:
                    progress(i, runs)
        report.seconds = time.monotonic() - started
        report.end = settled(report.start)
    return report


def table(report: Report) -> str:
    """The measures, as a markdown table, then the cases and what went wrong."""
    cps = report.checkpoints
    lines = [f"{report.runs} runs of {len(report.by_case)} cases in "
             f"{report.seconds:.0f} s, one process",
             "",
             "| measure | after warm-up | end | growth | tolerance | min .. max at checkpoints |",
             "|---|---:|---:|---:|---:|---|"]
    for k in MEASURES:
        low = min((c[k] for c in cps), default=report.end[k])
        high = max((c[k] for c in cps), default=report.end[k])
        mark = "" if report.end[k] - report.start[k] <= TOLERANCE[k] else " **GREW**"
        lines.append(f"| {k} | {report.start[k]} | {report.end[k]} | "
                     f"{report.end[k] - report.start[k]:+d}{mark} | {TOLERANCE[k]} | "
                     f"{low} .. {high} |")
    lines += ["", "runs by case: " + ", ".join(f"{n} {c}" for n, c in report.by_case.items())]
    if report.left_out:
        lines += ["left out (the host cannot run them): " +
                  "; ".join(f"{n}: {why}" for n, why in report.left_out.items())]
    if report.wrong:
        lines += [f"{len(report.wrong)} runs ended otherwise than expected:",
                  *(f"  {w}" for w in report.wrong[:20])]
    lines += ["", "nothing grew" if report.ok else
              f"FAILED: {', '.join(report.grown()) or 'runs ended wrong'}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--checkpoints", type=int, default=20,
                    help="measure this many times along the way (default 20)")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    a = ap.parse_args()

    def progress(i: int, n: int) -> None:
        print(f"  {i}/{n} runs", file=sys.stderr, flush=True)

    report = soak(a.runs, a.checkpoints, progress)
    print(table(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
