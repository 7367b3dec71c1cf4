#!/usr/bin/env python3
"""What a fault cannot avoid on this host, and each fault path against it.

In the same run, interleaved trial by trial, this measures the parts a
userfault is made of, each alone (benchmarks/floor.c, compiled here with cc
into a temporary directory), and uffdkvm's per-page overhead on several
fault paths (benchmarks/overhead.py's commands and rates, imported):

    exit              a vCPU exit round trip to user space: a real-mode guest
                      writing an I/O port in a loop, KVM_RUN returning
                      KVM_EXIT_IO and re-entering (floor.c counts the exits
                      and checks each carries the guest's counter)
    copy              UFFDIO_COPY of 4 KiB into a fresh page of a MISSING-
                      registered anonymous region, no KVM
    continue          UFFDIO_CONTINUE of 4 KiB into a MINOR-registered shmem
                      mapping whose page cache a second mapping filled
    switch_same_cpu   half an eventfd ping-pong round trip between two
                      threads pinned to one CPU: a switch, a write, a read
    wakeup_cross_cpu  the same with the threads on two CPUs: a wakeup of a
                      sleeping thread on the other CPU
    fault_none        a first write to a page of anonymous memory in user
                      space, no uffd (a user-space fault, not the guest's)

Each part's value is, per trial, the median of its repetitions' mean ns per
operation; the table gives the median of those per-trial values over the
trials, with a bootstrap 95% interval over trials (uffdkvm.spread_of), or
their range (min-max), labelled so, below 5 trials. Repetitions within a
trial are not independent samples and are not pooled. The zapping between
repetitions (MADV_DONTNEED) is outside the clock.

A path's overhead is uffdkvm with that path less uffdkvm with
uffd_mode=None, per page, as overhead.py defines it
(vcpus * (1/rate(uffd) - 1/rate(none))); its floor is the sum of the parts
its kernel path needs, with X = copy at MISSING and continue at MINOR. Both
settings pin the vCPUs (-c 0,1), so every reader but the scheduler's runs on
its vCPU's CPU:

    default (wait="spin_idle": each reader spins at SCHED_IDLE beside its
    vCPU):
        2 * switch_same_cpu + X
        the vCPU blocks and the CPU switches to the reader, already
        runnable there; it reads and resolves (X), and the ioctl's wakeup
        of the vCPU preempts it, a switch back. No exit: the fault is
        handled inside KVM_RUN.
    wait="epoll_exclusive" and wait="io_uring", beside their vCPUs:
        2 * switch_same_cpu + X
        the vCPU blocks and the CPU switches to the reader it woke, the
        reader resolves (X) and blocks again, the CPU switches back.
    pin_readers="scheduler" (upstream's placement; the reader sleeps where
    the scheduler put it, taken here as the other CPU):
        2 * wakeup_cross_cpu + X
        handle_userfault queues the message and wakes the sleeping reader on
        the other CPU; the reader reads and resolves (X); the ioctl wakes
        the vCPU thread sleeping in handle_userfault, back across CPUs. When
        the scheduler puts the reader beside its vCPU, the same-CPU floor
        applies instead.
    resolver="vcpu" (no reader; UFFD_FEATURE_SIGBUS):
        exit + X
        the access fails back to KVM_RUN (on PVM as an MMIO exit at the
        page), the vCPU thread resolves it and re-enters.

fault_none enters no floor: the overhead already subtracts the run without
userfaultfd, which pays the no-uffd fault. Where a uffd path skips work that
fault does (MINOR: the page cache is filled before the guest runs; MISSING:
the copy's page allocation stands in for the fault's), its overhead can go
below the floor by up to about fault_none: a ratio below 1 means that. A
ratio is "-" where the overhead's interval spans 0.

    python benchmarks/floor.py --trials 15 --json floor.json

--quick runs tiny settings (4 MiB per vCPU, few repetitions) for a smoke
test; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import uffdkvm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import overhead  # noqa: E402  (benchmarks/overhead.py, beside this file)

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "floor.c"
# part name in the JSON -> floor.c's part
PARTS = {"exit": "exit", "copy": "copy", "continue": "continue",
         "switch_same_cpu": "switch", "wakeup_cross_cpu": "wakeup", "fault_none": "fault"}
SETTINGS = {
    "MISSING, one uffd per vCPU, 1 reader": ("-u MISSING -v 2 -b {size} -r 1 -c 0,1", "copy"),
    "MINOR shmem, one uffd per vCPU, 2 readers": (
        "-u MINOR -s shmem -v 2 -b {size} -r 2 -c 0,1", "continue"),
}
# path -> (flags for the uffd run only, the floor's terms besides X)
PATHS: dict[str, tuple[str, dict[str, int]]] = {
    "default (spin_idle, readers at SCHED_IDLE on their vCPUs' CPUs)": (
        "", {"switch_same_cpu": 2}),
    'wait="epoll_exclusive" (asleep on their vCPUs\' CPUs)': (
        "--wait epoll_exclusive", {"switch_same_cpu": 2}),
    'wait="io_uring"': ("--wait io_uring", {"switch_same_cpu": 2}),
    'pin_readers="scheduler"': ("--pin-readers scheduler", {"wakeup_cross_cpu": 2}),
    'resolver="vcpu"': ("--resolver vcpu -r 1", {"exit": 1}),
}
COUNT = re.compile(r"^count (\d+) (\d+)$", re.M)
NS = re.compile(r"^ns ([\d.]+)$", re.M)


def build(tmp: str) -> str:
    """floor.c compiled into tmp; the binary's path."""
    cc = shutil.which("cc")
    if cc is None:
        raise SystemExit("floor.py needs a C compiler: install gcc (cc not on PATH)")
    binary = os.path.join(tmp, "floor")
    subprocess.run([cc, "-O2", "-Wall", "-o", binary, str(SOURCE), "-pthread"], check=True)
    return binary


def run_part(binary: str, part: str, reps: int, iters: int,
             cpus: tuple[int, int] = (0, 1)) -> tuple[list[float], int, int]:
    """One run of floor.c: its per-repetition ns per operation and its count
    (operations that did what they should, operations asked). Raises
    RuntimeError with floor.c's stderr when it fails."""
    cmd = [binary, PARTS[part], str(reps), str(iters), str(cpus[0]), str(cpus[1])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = COUNT.search(p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return [float(x) for x in NS.findall(p.stdout)], int(m.group(1)), int(m.group(2))


def floor_of(path: str, x: str, parts: dict[str, float]) -> float:
    terms = dict(PATHS[path][1])
    terms[x] = terms.get(x, 0) + 1
    return sum(n * parts[name] for name, n in terms.items())


def formula(path: str, x: str) -> str:
    terms = dict(PATHS[path][1])
    return " + ".join(f"{n} * {k}" if n > 1 else k for k, n in terms.items()) + f" + {x}"


def finite(x: float) -> float | None:
    """x, or None (null in the JSON) where it is NaN: no trial, or too few
    for an interval."""
    return None if math.isnan(x) else x


def spread_dict(values: list[float | None]) -> dict[str, float | None]:
    """Median over trials and its [low, high]: overhead.bounds (the range
    below 5 trials, else the bootstrap 95% interval)."""
    lo, hi = overhead.bounds(values)
    return {"median": finite(uffdkvm.spread_of(values).median), "ci_low": finite(lo),
            "ci_high": finite(hi)}


def ratio_text(o: dict[str, float | None], fl: float) -> str:
    """The overhead's median over the floor, or "-" where its interval spans 0."""
    return overhead.ratio_text(o["median"], o["ci_low"], o["ci_high"], fl)


def num(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--quick", action="store_true",
                    help="tiny settings and few repetitions: a smoke test, not a measurement")
    ap.add_argument("--json", metavar="PATH", help="write parts, paths and every sample here")
    a = ap.parse_args(argv)
    if a.trials < 1:
        ap.error(f"--trials {a.trials}: give 1 or more (15 for intervals worth quoting)")
    size = "4M" if a.quick else "64M"
    reps, iters = (3, 200) if a.quick else (20, 4000)
    exit_iters = 200 if a.quick else 2000
    # part -> one list of per-repetition ns per trial
    samples: dict[str, list[list[float]]] = {p: [] for p in PARTS}
    rates: dict[str, dict[str, list[float | None]]] = {}
    cmds: dict[str, dict[str, list[str]]] = {}
    for setting, (flags, _x) in SETTINGS.items():
        variants = {path: shlex.split(extra) for path, (extra, _t) in PATHS.items()}
        cmds[setting] = overhead.commands(shlex.split(flags.format(size=size)), [],
                                          variants, None)
        rates[setting] = {name: [] for name in cmds[setting]}
    with tempfile.TemporaryDirectory(prefix="uffdkvm-floor-") as tmp:
        binary = build(tmp)
        jobs: list[tuple[str, str]] = [("part", p) for p in PARTS]
        jobs += [(s, n) for s in cmds for n in cmds[s]]
        for t in range(a.trials):
            for kind, name in overhead.rotated(jobs, t):  # nothing always first
                if kind == "part":
                    ns, got, asked = run_part(binary, name, reps,
                                              exit_iters if name == "exit" else iters)
                    if got != asked:
                        raise RuntimeError(f"{name}: {got} of {asked} operations "
                                           "did what they should")
                    samples[name].append(ns)
                else:
                    rates[kind][name].append(overhead.rate_of(cmds[kind][name]))
            print(f"  trial {t + 1}/{a.trials} done", file=sys.stderr)
    # One value per trial (the median of its repetitions), spread over trials.
    per_trial_parts = {p: [statistics.median(ns) for ns in v] for p, v in samples.items()}
    parts = {p: spread_dict(list(v)) for p, v in per_trial_parts.items()}
    medians: dict[str, float] = {}
    for p, s in parts.items():
        if s["median"] is None or s["median"] <= 0:
            raise RuntimeError(f"part {p}: no positive median ({samples[p]})")
        medians[p] = s["median"]
    paths: list[dict[str, Any]] = []
    for setting, (flags, x) in SETTINGS.items():
        vcpus = overhead.vcpus_of(shlex.split(flags))
        for path in PATHS:
            per_trial = [None if v is None else v * 1000.0 for v in
                         overhead.overheads_us(rates[setting], path, "uffdkvm", vcpus)]
            o = spread_dict(per_trial)
            fl = floor_of(path, x, medians)
            paths.append({"path": path, "setting": setting, "overhead_ns": o["median"],
                          "floor_ns": fl,
                          "ratio": None if ratio_text(o, fl) == "-" else o["median"] / fl,
                          "overhead_ns_ci": [o["ci_low"], o["ci_high"]],
                          "floor_formula": formula(path, x),
                          "overhead_ns_per_trial": per_trial})
    record: dict[str, Any] = {
        "parts_ns": medians,
        "parts_ns_ci": {p: [s["ci_low"], s["ci_high"]] for p, s in parts.items()},
        "paths": paths,
        "trials": a.trials, "quick": a.quick,
        "settings": {s: f.format(size=size) for s, (f, _x) in SETTINGS.items()},
        "interval": overhead.interval_name(a.trials),
        "parts_ns_per_trial": per_trial_parts,
        "parts_samples_ns": samples, "rates": rates,
    }
    iv = overhead.interval_name(a.trials)
    print(f"\nThe parts, ns: median over {a.trials} trials of each trial's median of "
          f"{reps} repetitions [{iv} over trials]")
    print("| part | ns |")
    print("|---|---|")
    for p, s in parts.items():
        print(f"| `{p}` | {num(s['median'])} [{num(s['ci_low'])}, {num(s['ci_high'])}] |")
    print(f"\nPer-page overhead against its floor, ns (overhead: median of {a.trials} "
          f"trials [{iv}]; ratio \"-\" where that spans 0)")
    print("| setting | path | overhead ns | floor | floor ns | ratio |")
    print("|---|---|---|---|---|---|")
    for row in paths:
        lo, hi = row["overhead_ns_ci"]
        print(f"| {row['setting']} | {row['path']} | {num(row['overhead_ns'])} "
              f"[{num(lo)}, {num(hi)}] | {row['floor_formula']} | {num(row['floor_ns'])} "
              f"| {num(row['ratio'], '.2f')} |")  # None where the interval spans 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1, allow_nan=False)
    return record


if __name__ == "__main__":
    main()
