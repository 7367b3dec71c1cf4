#!/usr/bin/env python3
"""Thousands of runs in one process, across the feature matrix: nothing may grow.

    python benchmarks/soak.py [--runs 2000] [--json PATH]

A notebook or a sweep runs experiments for hours in one interpreter. This
cycles through MATRIX (every wait mode, both resolvers, the uffd modes, every
page source, every prefetch, wp, move, both stats modes, and runs that fail:
timeouts, injected errors where the build has test hooks, Ctrl-C), each run
small (64 KiB to 2 MiB a vCPU) so that 2,000 take minutes. Every Result must
verify and pass uffdkvm.invariants; every failing run must fail as its case
says. It measures the process (MEASURES: fds, threads, child processes,
mappings, RSS and its high-water mark, the C heap) after a warm-up and at
the end, and exits 1, printing the table, when any of them grew beyond its
TOLERANCE or a run ended otherwise than its case expects.

Cases the host cannot run (HostUnsupportedError: io_uring, spin with too few
CPUs, a kernel without UFFDIO_MOVE) are left out at the warm-up and listed.
tests/test_soak.py runs 200 of these same runs.
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
from uffdkvm.invariants import check_result

TINY = dict(vcpus=2, mem_per_vcpu="64K", readers=2)
HOOKS = uffdkvm._core.TEST_HOOKS
WARM_UP_CYCLES = 3


@dataclasses.dataclass(frozen=True)
class Case:
    """One kind of run. ``run(snapshot)`` makes it; ``expect`` is "verified"
    (a Result that verifies), "unverified" (one that does not: a page
    damaged on purpose) or the exception it must raise. ``every``: run once
    in that many cycles (the slow ones)."""

    name: str
    run: Callable[[str], Any]
    expect: str | type[BaseException] = "verified"
    every: int = 1


def _fault(fault: str, after: int, **fields: Any) -> Callable[[str], Any]:
    def run(snapshot: str) -> Any:
        from uffdkvm._testing import run_with_fault
        return run_with_fault(fault=fault, after=after, **fields)
    return run


def _runs(**fields: Any) -> Callable[[str], Any]:
    return lambda snapshot: uffdkvm.run(**fields)


def _from_file(**fields: Any) -> Callable[[str], Any]:
    return lambda snapshot: uffdkvm.run(source_path=snapshot, **fields)


def _interrupted(snapshot: str) -> Any:
    """Ctrl-C 50 ms into a run that would take 16 s (a second a fault)."""
    timer = threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,))
    timer.start()
    try:
        return uffdkvm.run(**TINY, delay_us=1_000_000)
    finally:
        timer.join()


def _cancelled(snapshot: str) -> Any:
    """The progress callback raising KeyboardInterrupt, as a notebook's stop does."""
    def stop(progress: Any) -> None:
        raise KeyboardInterrupt
    return uffdkvm.run(vcpus=1, mem_per_vcpu="1M", readers=2, delay_us=2000, progress=stop)


MATRIX: tuple[Case, ...] = (
    # the ways to wait, and the vCPU resolver
    Case("poll", _runs(**TINY, wait="poll")),
    Case("epoll", _runs(**TINY, wait="epoll")),
    Case("epoll_exclusive", _runs(**TINY, wait="epoll_exclusive")),
    Case("read-batch", _runs(**TINY, wait="read", read_batch=8)),
    Case("io_uring", _runs(**TINY, wait="io_uring")),
    Case("spin", _runs(vcpus=1, mem_per_vcpu="64K", readers=1, wait="spin")),
    Case("resolver-vcpu", _runs(vcpus=2, mem_per_vcpu="64K", resolver="vcpu")),
    Case("single-uffd-overlap", _runs(vcpus=3, mem_per_vcpu="64K", readers=3,
                                      single_uffd=True, overlap=True, wait="epoll")),
    # uffd modes and how a page goes in
    Case("zeropage", _runs(**TINY, resolve="zeropage")),
    Case("minor-shmem", _runs(**TINY, backing="shmem", uffd_mode="minor")),
    Case("wp", _runs(**TINY, uffd_mode="wp", write_percent=50)),
    Case("wp-async", _runs(**TINY, uffd_mode="wp", wp_async=True)),
    Case("wp-vcpu-shmem", _runs(vcpus=2, mem_per_vcpu="64K", uffd_mode="wp", backing="shmem",
                                resolver="vcpu")),
    Case("move", _runs(**TINY, resolve="move")),
    Case("move-vcpu", _runs(vcpus=2, mem_per_vcpu="64K", resolve="move", resolver="vcpu")),
    Case("move-thp", _runs(vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp",
                           resolve="move")),
    Case("thp", _runs(vcpus=1, mem_per_vcpu="2M", backing="anonymous_thp")),
    Case("no-uffd", _runs(**TINY, uffd_mode=None)),
    Case("prefault", _runs(**TINY, prefault=True)),
    # page sources
    Case("file-pread", _from_file(**TINY, source="file")),
    Case("file-mmap", _from_file(**TINY, source="file", source_read="mmap")),
    Case("file-mmap-vcpu", _from_file(vcpus=2, mem_per_vcpu="64K", source="file",
                                      source_read="mmap", resolver="vcpu")),
    Case("remote-unix", _from_file(**TINY, source="remote")),
    Case("remote-tcp", _from_file(**TINY, source="remote", remote_transport="tcp")),
    Case("remote-background", _from_file(**TINY, source="remote", prefetch="background")),
    # prefetch
    Case("readahead", _runs(**TINY, prefetch="readahead")),
    Case("readahead-file", _from_file(**TINY, source="file", prefetch="readahead")),
    Case("background", _runs(**TINY, prefetch="background")),
    Case("replay", _runs(**TINY, prefetch="replay", replay_from=range(31, -1, -1))),
    # what is measured
    Case("stats-basic", _runs(**TINY, stats="basic", overlap=True)),
    Case("trace-timing", _runs(**TINY, trace_faults=True, guest_timing=True, passes=2)),
    Case("zipf-trace", _runs(**TINY, access="zipf", zipf_theta=0.99, trace_faults=True)),
    Case("touch-half", _runs(**TINY, touch_percent=50)),
    # failing runs
    Case("refused-config", _runs(**TINY, pin_vcpus=[1023]), uffdkvm.UffdkvmError),
    Case("refused-by-kvm", _runs(vcpus=100_000, mem_per_vcpu="4K"), uffdkvm.UffdkvmError),
    Case("timeout-at-once", _runs(**TINY, timeout_s=1e-9), uffdkvm.RunTimeoutError),
    Case("interrupted", _interrupted, KeyboardInterrupt, every=4),
    Case("cancelled", _cancelled, KeyboardInterrupt, every=4),
    *((
        Case("resolve-eio", _fault("resolve_eio", 5, **TINY), uffdkvm.RunError),
        Case("move-eio", _fault("resolve_eio", 5, **TINY, resolve="move"), uffdkvm.RunError),
        Case("wp-eio", _fault("resolve_eio", 5, **TINY, uffd_mode="wp"), uffdkvm.RunError),
        Case("vcpu-resolver-eio", _fault("resolve_eio", 5, vcpus=2, mem_per_vcpu="64K",
                                         resolver="vcpu"), uffdkvm.RunError),
        Case("prefetch-paced-eio", _fault("resolve_eio", 5, **TINY, prefetch="background",
                                          prefetch_bandwidth_mbps=1), uffdkvm.RunError),
        Case("guest-fault", _fault("guest_fault", 3, **TINY), uffdkvm.RunError),
        Case("guest-mmio", _fault("guest_mmio", 3, **TINY), uffdkvm.RunError),
        Case("reader-thread", _fault("thread_create", 3, **TINY), uffdkvm.RunError),
        Case("vcpu-thread", _fault("thread_create", 6, **TINY), uffdkvm.RunError),
        Case("corrupt-page", _fault("corrupt_page", 1, **TINY), "unverified"),
        Case("timeout-stuck", _fault("reader_exit", 2, **TINY, wait="read", timeout_s=0.05),
             uffdkvm.RunTimeoutError, every=4),
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
#   tracemalloc shows: one, not one a run) and moved 13 KiB over the
#   next 1,800 runs: 1 MiB.
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
    per_cycle = max(1, len(cycles(cases, 1)) - 1)
    return cycles(cases, runs // per_cycle + 1)[:runs] if cases else []


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
        # WARM_UP_CYCLES of the schedule: the C heap steps up once by half
        # a MiB in the third cycle, and is flat from there on (measured).
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
