#!/usr/bin/env python3
"""Flat as work grows: per-page userfault overhead against memory and vCPUs.

Per-page overhead as benchmarks/overhead.py computes it (its functions,
imported): each point's uffdkvm run with userfaultfd (the CLI's default
fault path, -u MISSING) and without (-u NONE), same settings, and

    overhead per page = vcpus * (1 / rate(uffd) - 1 / rate(none))

per trial; the table gives the median with a bootstrap 95% interval.
Every trial runs every command of a sweep (both runs of every point) in an
order that rotates from trial to trial, so drift hits all points alike.

Sweeps (--sweeps, default all three):
  memory  total guest memory --sizes (default 64M,1G,4G,16G), 1 vCPU, so
          -b is the total; backings --backings (default anonymous and
          anonymous_hugetlb, 2 MiB pages). For hugetlb the script raises
          /proc/sys/vm/nr_hugepages to what the biggest size needs, for the
          hugetlb points alone, and takes back what it added when they end
          (also on error, Ctrl-C and SIGTERM);
          a size whose pages the kernel does not find, or whose memory
          (its huge pages beyond those free) is more than 90% of
          MemAvailable, is skipped with the reason printed. Sizes of --big-from and up
          (default 4G) run only --big-trials trials (default 2): the table
          says how many each point had.
  vcpus   --vcpus (default 1,2,4,8,16) at --mem-per-vcpu (default 64M):
          aggregate rate (pages/s over all vCPUs, uffd and none) and the
          per-fault overhead; more vCPUs than host CPUs is "oversubscribed".
          There a vCPU's time per fault includes waiting for a CPU, so the
          table also gives "CPU us/fault", the same formula with the CPUs
          the vCPUs can use, min(vcpus, host CPUs), for vcpus: the CPU time
          a fault adds if those CPUs are busy the whole run (as they are
          when oversubscribed).
  phases  one in-process uffdkvm.run() per memory size (1 vCPU, anonymous;
          --phase-sizes, default the --sizes up to 4G) and vCPU count: its
          wall clock less paging (Result.seconds), exact, and how that
          splits as the core's progress phases show it: setup (until
          "running" is first reported) and after paging (from the
          first of stopping, verifying, releasing to run()'s return:
          verification, the result, unmapping). Phases are seen at the
          core's 50 ms progress tick: setup reads up to 50 ms long, after
          paging up to 50 ms short (None when the run had no tick there).

Per fault: with MISSING on these backings every fault resolves one backing
page (the run verifies each page was resolved once), so the overhead per
fault is the overhead per 4 KiB page times the pages per backing page (1 for
anonymous, 512 for 2 MiB hugetlb).

    python benchmarks/scaling.py --trials 9 --big-trials 2 --pin-vcpus 0,1 --json scaling.json

(--pin-vcpus pins every run's vCPUs round-robin, so the default fault path
is the pinned one, readers spinning at SCHED_IDLE beside their vCPUs;
without it the vCPUs and readers are unpinned and every fault here wakes a
reader on the other CPU, about 5 times slower a fault on the development
host. About 18 minutes pinned there, the estimate it prints first;
benchmarks/RESULTS.md, "Flat as work grows").
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402 - benchmarks/overhead.py, beside this file

import uffdkvm  # noqa: E402
from uffdkvm._spawn import python_command  # noqa: E402
from uffdkvm.config import parse_size  # noqa: E402

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
# The lock tests/helpers/hostfacts.py takes around its own changes to the pools.
HUGEPAGES_LOCK = os.path.join(tempfile.gettempdir(), "uffdkvm-hugepages.lock")
HUGE = 2 << 20
PAGE = 4096
PAGES_PER_FAULT = {"anonymous": 1, "anonymous_hugetlb": HUGE // PAGE}
# For the time estimate only: this host's rates (pages/s, 1 vCPU, measured
# under load on 2026-12-01): with 4 KiB faults, with 2 MiB faults, without.
GUESS_UFFD_PAGES_PER_S = {"anonymous": 40_000, "anonymous_hugetlb": 110_000}
GUESS_NONE_PAGES_PER_S = 130_000
GUESS_START_S = 1.0


def size_bytes(text: str) -> int:
    """Bytes of a size such as 64M: uffdkvm's own parser (uffdkvm.config.parse_size)."""
    return parse_size(text.strip(), "size")


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def size_list(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    for s in out:
        try:
            if size_bytes(s) <= 0:
                raise ValueError
        except (ValueError, uffdkvm.ConfigError):
            raise argparse.ArgumentTypeError(
                f"{s!r}: a size such as 64M, 1G or 4096 (bytes), comma-separated") from None
    return out


def int_list(text: str) -> list[int]:
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: counts such as 1,2,4") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: counts of at least 1")
    return out


@dataclasses.dataclass
class Point:
    """One point of a sweep: its flags and how many trials it runs."""

    sweep: str
    label: str
    flags: list[str]
    vcpus: int
    pages: int  # 4 KiB pages over all vCPUs
    backing: str
    trials: int
    big: bool = False
    rates: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)

    def commands(self) -> dict[str, list[str]]:
        return overhead.commands(self.flags, [], {"uffdkvm": []}, None)


def measure(points: list[Point], trials: int) -> None:
    """Interleaved: trial t runs both commands of every point still in its
    trials, in an order that rotates with t."""
    cmds = [(p, name, cmd) for p in points for name, cmd in p.commands().items()]
    for p in points:
        p.rates = {name: [] for name in p.commands()}
    for t in range(trials):
        live = [c for c in cmds if t < c[0].trials]
        if not live:
            break
        for p, name, cmd in overhead.rotated(live, t):
            start = time.monotonic()
            p.rates[name].append(overhead.rate_of(cmd))
            print(f"  trial {t + 1}/{trials} {p.label} {name}: "
                  f"{p.rates[name][-1] or 0:.0f} pages/s ({time.monotonic() - start:.0f} s)",
                  file=sys.stderr)


def estimate_s(points: list[Point]) -> float:
    return sum(p.trials * (2 * GUESS_START_S + p.pages / GUESS_UFFD_PAGES_PER_S[p.backing] +
                           p.pages / GUESS_NONE_PAGES_PER_S) for p in points)


def summary(p: Point) -> dict[str, Any]:
    us = overhead.overheads_us(p.rates, "uffdkvm", "uffdkvm", p.vcpus)
    ppf = PAGES_PER_FAULT[p.backing]
    per_fault = [None if x is None else x * ppf for x in us]
    # The same difference on the CPUs the vCPUs can use, all busy (overhead.py's
    # formula with min(vcpus, host CPUs) for vcpus): past the host's CPUs a
    # vCPU's wall time per fault includes waiting for a CPU, this does not.
    busy = min(p.vcpus, host_cpus())
    cpu_per_fault = overhead.overheads_us(p.rates, "uffdkvm", "uffdkvm", busy)
    cpu_per_fault = [None if x is None else x * ppf for x in cpu_per_fault]
    med = {n: statistics.median([x for x in v if x] or [float("nan")])
           for n, v in p.rates.items()}
    return {"sweep": p.sweep, "label": p.label, "flags": " ".join(p.flags),
            "vcpus": p.vcpus, "pages": p.pages, "backing": p.backing,
            "pages_per_fault": ppf, "trials": p.trials,
            "oversubscribed": p.vcpus > host_cpus(),
            "rates": p.rates, "median_rates": med,
            "us_per_page": us, "us_per_fault": per_fault, "busy_cpus": busy,
            "cpu_us_per_fault": cpu_per_fault}


def cell(values: list[float | None]) -> str:
    """Median [low, high]: the range (min-max) below 5 trials, else the
    bootstrap 95% interval (overhead.bounds)."""
    ok = [v for v in values if v is not None]
    if len(ok) < 2:
        return f"{ok[0]:.1f} (1 trial)" if ok else "failed"
    lo, hi = overhead.bounds(ok)
    failed = len(values) - len(ok)
    return (f"{statistics.median(ok):.1f} [{lo:.1f}, {hi:.1f}]"
            + (f" ({failed} failed)" if failed else ""))


def rate_cell(values: list[float | None]) -> str:
    ok = [v for v in values if v]
    return f"{statistics.median(ok):.0f}" if ok else "failed"


class Hugepages:
    """nr_hugepages raised for the run and put back, whatever happens.

    Changes are relative and made under the lock the test suite's host
    probes take (tests/helpers/hostfacts.py), so that a test session adding pages
    meanwhile keeps its own: the script adds what it lacks and later takes
    away exactly what it added."""

    def __init__(self) -> None:
        self.found: int | None = None  # nr_hugepages when first asked
        self.added = 0

    @staticmethod
    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        fd = os.open(HUGEPAGES_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def reserve(self, pages: int) -> int:
        """Raise the pool so that `pages` are free; returns how many are."""
        with self.locked():
            now = int(NR_HUGEPAGES.read_text())
            if self.found is None:
                self.found = now
            lack = max(0, pages - self.free())
            if lack:
                try:
                    NR_HUGEPAGES.write_text(f"{now + lack}\n")
                except OSError as e:
                    print(f"note: cannot raise {NR_HUGEPAGES} to {now + lack}: {e}",
                          file=sys.stderr)
                # what the kernel found, not what was asked
                self.added += max(0, int(NR_HUGEPAGES.read_text()) - now)
        return self.free()

    @staticmethod
    def free() -> int:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
        return 0

    def restore(self) -> None:
        if self.added:
            with self.locked():
                now = int(NR_HUGEPAGES.read_text())
                NR_HUGEPAGES.write_text(f"{max(now - self.added, 0)}\n")
                print(f"{NR_HUGEPAGES}: the {self.added} pages added taken back "
                      f"({now} -> {NR_HUGEPAGES.read_text().strip()}; found "
                      f"{self.found})", file=sys.stderr)
        self.found, self.added = None, 0


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def memory_points(a: argparse.Namespace, backing: str, huge: Hugepages | None
                  ) -> tuple[list[Point], list[str]]:
    """The sweep's points on one backing; for hugetlb, with the pages reserved
    (huge None: not reserved, the points as they will be if the pages are had)."""
    points: list[Point] = []
    skipped: list[str] = []
    big_from = size_bytes(a.big_from)

    def beyond_memory(n: int) -> bool:
        """Huge pages for n bytes would take more than 90% of MemAvailable:
        not asked for, so that the pool never takes what other work needs."""
        lack = n - Hugepages.free() * HUGE if backing == "anonymous_hugetlb" else n
        return lack > available_bytes() * 0.9

    need_huge = max((size_bytes(s) for s in a.sizes if not beyond_memory(size_bytes(s))),
                    default=0) // HUGE
    for s in a.sizes:
        n = size_bytes(s)
        label = f"{s} {backing}"
        if backing == "anonymous_hugetlb":
            if n % HUGE:
                skipped.append(f"{label}: not a whole number of 2 MiB pages")
                continue
            if beyond_memory(n):
                skipped.append(f"{label}: its {n // HUGE} 2 MiB pages (less the "
                               f"{Hugepages.free()} free) are more than 90% of MemAvailable "
                               f"({available_bytes() >> 20} MiB): not reserved")
                continue
            if huge is None:
                free = n // HUGE
            elif huge.found is None:
                free = huge.reserve(need_huge)
            else:
                free = huge.free()
            if free < n // HUGE:
                skipped.append(f"{label}: the host reserved only {free} free 2 MiB pages "
                               f"of the {n // HUGE} it needs")
                continue
        elif beyond_memory(n):
            skipped.append(f"{label}: {n >> 20} MiB is more than 90% of MemAvailable "
                           f"({available_bytes() >> 20} MiB)")
            continue
        big = n >= big_from
        points.append(Point("memory", label, ["-v", "1", "-b", s, "-s", backing] + pins(a), 1,
                            n // PAGE, backing, a.big_trials if big else a.trials, big))
    return points, skipped


def pins(a: argparse.Namespace) -> list[str]:
    """--pin-vcpus for every command, where given (round-robin, any count)."""
    return ["--pin-vcpus", a.pin_vcpus] if a.pin_vcpus else []


def vcpu_points(a: argparse.Namespace) -> list[Point]:
    per = size_bytes(a.mem_per_vcpu)
    return [Point("vcpus", f"{v} vCPUs x {a.mem_per_vcpu}",
                  ["-v", str(v), "-b", a.mem_per_vcpu, "-s", "anonymous"] + pins(a), v,
                  v * per // PAGE, "anonymous", a.trials) for v in a.vcpus]


AFTER_PAGING = ("stopping the vCPUs", "stopping the readers", "verifying", "releasing")


def phases_of(mem_per_vcpu: str, vcpus: int, pin_vcpus: str | None) -> dict[str, Any]:
    """One in-process run: its wall clock less paging (exact), and how that
    splits by the core's progress phases (seen at its 50 ms tick)."""
    seen: dict[str, float] = {}

    def note(p: uffdkvm.Progress) -> None:
        seen.setdefault(p.phase, p.elapsed_s)

    start = time.monotonic()
    r = uffdkvm.run(vcpus=vcpus, mem_per_vcpu=mem_per_vcpu, pin_vcpus=pin_vcpus, progress=note)
    wall = time.monotonic() - start
    after = [seen[p] for p in AFTER_PAGING if p in seen]
    return {"mem_per_vcpu": mem_per_vcpu, "vcpus": vcpus, "pages": r.config.region_bytes // PAGE,
            "wall_s": wall, "paging_s": r.seconds, "outside_paging_s": wall - r.seconds,
            # the first phase after setup reported ("running", or a later one in a
            # run shorter than a tick): at most 50 ms after setup ended
            "setup_seen_s": seen.get("running", min(after) if after else None),
            # from the first phase after paging seen to run()'s return: short by up to 50 ms
            "after_paging_seen_s": wall - min(after) if after else None,
            "phases_first_seen_s": seen, "verified": r.verified,
            "reader_wait": r.reader_wait, "vcpu_cpus": [list(v.cpus) for v in r.vcpus]}


def phase_points(a: argparse.Namespace) -> list[tuple[str, int]]:
    out = [(s, 1) for s in a.phase_sizes]
    out += [(a.mem_per_vcpu, v) for v in a.vcpus if (a.mem_per_vcpu, v) not in out]
    return out


def opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", default="memory,vcpus,phases",
                    help="which of memory, vcpus, phases to run (comma-separated)")
    ap.add_argument("--sizes", type=size_list, default=size_list("64M,1G,4G,16G"),
                    help="memory sweep: total guest memory, 1 vCPU")
    ap.add_argument("--backings", type=lambda s: s.split(","),
                    default=["anonymous", "anonymous_hugetlb"],
                    help="memory sweep: anonymous and/or anonymous_hugetlb")
    ap.add_argument("--vcpus", type=int_list, default=int_list("1,2,4,8,16"))
    ap.add_argument("--mem-per-vcpu", default="64M", help="vCPU sweep: memory per vCPU")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--big-trials", type=int, default=2,
                    help="trials for memory sizes of --big-from and up")
    ap.add_argument("--big-from", default="4G")
    ap.add_argument("--phase-sizes", type=size_list, default=None,
                    help="phases sweep: sizes, 1 vCPU (default: --sizes up to 4G)")
    ap.add_argument("--pin-vcpus", metavar="CPULIST", default=None,
                    help="pin every run's vCPUs to these CPUs, round-robin (uffdkvm's "
                    "--pin-vcpus; the default fault path then has its readers spin at "
                    "SCHED_IDLE beside them); default: unpinned")
    ap.add_argument("--json", metavar="PATH", help="write every rate and overhead here")
    a = ap.parse_args()
    sweeps = set(a.sweeps.split(","))
    if sweeps - {"memory", "vcpus", "phases"} or not sweeps:
        ap.error(f"--sweeps {a.sweeps!r}: a comma-separated choice of memory, vcpus, phases")
    for b in a.backings:
        if b not in PAGES_PER_FAULT:
            ap.error(f"--backings: {b!r} is not one of {', '.join(PAGES_PER_FAULT)}")
    if a.trials < 1 or a.big_trials < 1:
        ap.error("--trials and --big-trials: at least 1")
    if a.phase_sizes is None:
        a.phase_sizes = [s for s in a.sizes if size_bytes(s) <= 4 << 30]
    cpus = host_cpus()
    huge = Hugepages()
    # SIGTERM as Ctrl-C, so that nr_hugepages is put back either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    record: dict[str, Any] = {"trials": a.trials, "big_trials": a.big_trials,
                              "pin_vcpus": a.pin_vcpus,
                              "big_from": a.big_from, "host_cpus": cpus,
                              "command": python_command(module="uffdkvm"),
                              "host": dataclasses.asdict(uffdkvm.HostInfo.current()),
                              "memory": [], "vcpus": [], "phases": [], "skipped": []}
    try:
        mem: list[Point] = []
        if "memory" in sweeps:
            for backing in a.backings:
                # hugetlb: counted here, reserved when measured, not held during the rest
                got, skipped = memory_points(
                    a, backing, None if backing == "anonymous_hugetlb" else huge)
                mem += got
                if backing != "anonymous_hugetlb":
                    record["skipped"] += skipped
        vcp = vcpu_points(a) if "vcpus" in sweeps else []
        phases = phase_points(a) if "phases" in sweeps else []
        guess = estimate_s(mem) + estimate_s(vcp) + sum(
            2 + 2 * size_bytes(s) * v / PAGE / GUESS_UFFD_PAGES_PER_S["anonymous"]
            for s, v in phases)
        print(f"estimate: about {guess / 60:.0f} min (at this host's rates with and without "
              f"faults, {GUESS_UFFD_PAGES_PER_S['anonymous']} and {GUESS_NONE_PAGES_PER_S} "
              f"pages/s; {len(mem)} memory points, {len(vcp)} vCPU points, {len(phases)} "
              f"phase runs)", file=sys.stderr)
        started = time.monotonic()
        if mem:
            # Interleaved within each backing: the hugetlb points' pages are
            # reserved for them alone, and released before anything else runs.
            done: list[Point] = []
            for backing in a.backings:
                if backing == "anonymous_hugetlb":
                    points, skipped = memory_points(a, backing, huge)
                    record["skipped"] += skipped
                else:
                    points = [p for p in mem if p.backing == backing]
                print(f"memory sweep, {backing}", file=sys.stderr)
                measure(points, max((p.trials for p in points), default=0))
                huge.restore()
                done += points
            record["memory"] = [summary(p) for p in done]
        for s in record["skipped"]:
            print(f"skipped: {s}", file=sys.stderr)
        if vcp:
            print("vCPU sweep", file=sys.stderr)
            measure(vcp, a.trials)
            record["vcpus"] = [summary(p) for p in vcp]
        for s, v in phases:
            print(f"phases: {v} vCPUs x {s}", file=sys.stderr)
            record["phases"].append(phases_of(s, v, a.pin_vcpus))
        record["elapsed_s"] = time.monotonic() - started
    finally:
        huge.restore()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    print(f"\nHost CPUs (this process's affinity): {cpus}. Median of the per-trial "
          f"overheads [{overhead.interval_name(a.trials)}]; {a.trials} trials, "
          f"{a.big_trials} for sizes of {a.big_from} and up "
          f"([{overhead.interval_name(a.big_trials)}] there).")
    placed = f", vCPUs pinned to {a.pin_vcpus} round-robin" if a.pin_vcpus else ", unpinned"
    if record["memory"]:
        print(f"\nMemory sweep, 1 vCPU, default fault path (-u MISSING){placed}\n")
        print(overhead.table(["memory", "backing", "trials", "uffd pages/s", "none pages/s",
                     "us/page", "us/fault"],
                    [[m["label"].split()[0], m["backing"], str(m["trials"]),
                      rate_cell(m["rates"]["uffdkvm uffd"]),
                      rate_cell(m["rates"]["uffdkvm none"]),
                      cell(m["us_per_page"]), cell(m["us_per_fault"])]
                     for m in record["memory"]]))
    for s in record["skipped"]:
        print(f"\nskipped: {s}")
    if record["vcpus"]:
        print(f"\nvCPU sweep, {a.mem_per_vcpu} per vCPU, anonymous, default fault path{placed}\n")
        print(overhead.table(["vCPUs", "", "trials", "uffd pages/s (all vCPUs)",
                     "none pages/s (all vCPUs)", "us/fault", "CPU us/fault"],
                    [[str(m["vcpus"]), "oversubscribed" if m["oversubscribed"] else "",
                      str(m["trials"]), rate_cell(m["rates"]["uffdkvm uffd"]),
                      rate_cell(m["rates"]["uffdkvm none"]), cell(m["us_per_fault"]),
                      cell(m["cpu_us_per_fault"])]
                     for m in record["vcpus"]]))
    if record["phases"]:
        print("\nOne run each, in process, seconds: outside paging = run()'s wall clock less "
              "Result.seconds; setup and after paging as the 50 ms progress tick saw them "
              "(setup up to 50 ms long, after paging up to 50 ms short)\n")
        print(overhead.table(["memory/vCPU", "vCPUs", "pages", "paging", "outside paging",
                     "setup (seen)", "after paging (seen)", "us outside paging per page"],
                    [[p["mem_per_vcpu"], str(p["vcpus"]), str(p["pages"]), opt(p["paging_s"]),
                      opt(p["outside_paging_s"]), opt(p["setup_seen_s"]),
                      opt(p["after_paging_seen_s"]),
                      f"{p['outside_paging_s'] / p['pages'] * 1e6:.2f}"]
                     for p in record["phases"]]))


if __name__ == "__main__":
    main()
