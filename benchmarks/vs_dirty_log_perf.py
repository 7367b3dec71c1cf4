#!/usr/bin/env python3
"""Dirty tracking's cost, uffdkvm dirty-log beside the kernel's dirty_log_perf_test.

Two figures for each tool and tracker (upstream: its default, manual protect
with KVM_CLEAR_DIRTY_LOG, and -g; uffdkvm: every --tracking):

(a) write cost, us/page: what writing a page in a tracked iteration costs a
    vCPU above reading it in a tracked iteration, same tool, same tracker,
    same flags:

        (dirty(-w 100) - dirty(-w 0)) / pages each vCPU walks

    with dirty() the mean "Iteration N dirty memory time" of iterations 2..N
    of one run. Why this baseline: upstream cannot run an iteration with
    tracking off. Its populate pass is untracked, but it also faults every
    page in (the host allocates and zeroes it, KVM maps it), so it costs far
    more than a pass over resident memory and the difference would come out
    low, even negative. uffdkvm's own untracked pass is another guest's loop:
    on a host that emulates guest instructions the loop is most of a pass's
    time, so it cancels nothing of upstream's. A read-only iteration of the
    same tool and tracker runs the same guest loop over the same resident
    memory, behind the same barrier and with tracking on; a read is not
    tracked, so what is left is what tracking adds to a write (the
    write-protection fault, or the hardware's dirty logging and its exits),
    plus whatever a store costs above a load untracked. uffdkvm measures that
    last term: its runs with tracking off (the same config, dirty_tracking
    None, in a child process: Result.pass_seconds of the same passes) at
    -w 100 and -w 0 give the row "uffdkvm, off", which should be near 0. One
    difference it also holds: upstream's populate pass writes every page
    whatever -w says, uffdkvm's writes -w's share, so at -w 0 uffdkvm's
    reads find the kernel's shared zero page where upstream's find pages of
    their own (--prefault would populate them, but wp_async refuses it). For
    uffdkvm those runs also give the direct figure, "vs off": (dirty(-w 100)
    - its untracked pass at -w 100) / pages, the cost over the same pass with
    tracking off. (A tracked iteration runs from the gate opening to the last
    vCPU's end; an untracked pass from the first vCPU's start to the last
    one's end: the same window with one vCPU.)

    Iteration 1 is left out: what it sees depends on the tracker (with
    upstream's default the bitmap starts all set, KVM_DIRTY_LOG_INITIALLY_SET,
    and nothing is write-protected until the first clear; -g write-protects
    at enabling), while every later iteration follows a harvest and a
    re-protect. Hence -i 3 by default here (two such iterations a run).

(b) harvest + re-protect, s/GiB: the mean of iterations 2..N of the harvest
    ("get dirty log time": KVM_GET_DIRTY_LOG, the rings collected,
    PAGEMAP_SCAN) plus the re-protect ("clear dirty log time":
    KVM_CLEAR_DIRTY_LOG, KVM_RESET_DIRTY_RINGS; none with -g and wp_async,
    whose harvest re-protects), per GiB of guest memory (vcpus x -b), from
    the -w 100 runs: every page dirty in every iteration.

Every trial runs every command (upstream x 2 trackers x 2 write shares,
uffdkvm x 4 trackers x 2, uffdkvm untracked x 2) in an order that rotates
from trial to trial, as benchmarks/overhead.py does; the table gives medians
with bootstrap 95% intervals, and upstream / uffdkvm as the median of the
per-trial ratios (paired) for upstream's default against bitmap_manual and
-g against bitmap.

    python benchmarks/vs_dirty_log_perf.py \\
        --upstream PATH/tools/testing/selftests/kvm/dirty_log_perf_test \\
        --trials 11 --json dirty.json

--flags are upstream's (-v, -b, -s, -o, -a, -r, -c, -m, -i; not -w or -g,
which the script sets), given to both tools; --ours adds uffdkvm's own
flags to its tracked runs. Upstream's output is read with the regexes of
uffdkvm.cli.dirty_log.LINES, uffdkvm's from its --json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402 - benchmarks/overhead.py, beside this file

import uffdkvm  # noqa: E402
from uffdkvm._spawn import child_env, python_command  # noqa: E402
from uffdkvm.cli import dirty_log as cli_dirty  # noqa: E402
from uffdkvm.schema import fields as schema  # noqa: E402

FLAGS = "-v 1 -b 64M -i 3"
UPSTREAM_FLAGS = {"-v", "-b", "-s", "-o", "-a", "-r", "-c", "-m", "-i"}
WRITES = (100, 0)
# uffdkvm's trackers: Config.dirty_tracking's values, as the schema declares them.
TRACKERS = [c for c in schema.BY_NAME["dirty_tracking"].choices if c != "none"]
UPSTREAM_TRACKERS = {"bitmap_manual": [], "bitmap": ["-g"]}  # its default, and -g
GIB = 1 << 30
RING_ENTRIES = 65536  # KVM's most (KVM_DIRTY_RING_MAX_ENTRIES)
# The untracked baseline: the dirty-log run's own Config with tracking off.
UNTRACKED = ("import json, sys, uffdkvm\n"
             "r = uffdkvm.run(**json.loads(sys.argv[1]))\n"
             "print(json.dumps({'verified': r.verified, 'pass_seconds': list(r.pass_seconds)}))\n")


@dataclasses.dataclass
class Run:
    """One command's iterations (seconds each; index 0 is iteration 1)."""

    dirty: list[float]
    harvest: list[float]
    reprotect: list[float]


def check_flags(flags: list[str]) -> None:
    for word in flags:
        if word.startswith("-") and word not in UPSTREAM_FLAGS:
            raise SystemExit(f"--flags {shlex.join(flags)}: {word} is not one of upstream's "
                             f"flags this script passes on ({', '.join(sorted(UPSTREAM_FLAGS))}"
                             "; -w and -g are the script's); uffdkvm's own go in --ours")


def fields_for(flags: list[str], write: int) -> dict[str, Any]:
    """The Config fields `uffdkvm dirty-log FLAGS -w WRITE` runs with."""
    fields, main_cpu = cli_dirty.fields_of(
        cli_dirty.build_parser().parse_args(flags + ["-w", str(write)]))
    if main_cpu is not None:
        raise SystemExit("-c with a main-thread entry: give one CPU per vCPU here")
    return fields


def commands(flags: list[str], ours: list[str], upstream: str | None,
             trackers: list[str]) -> dict[str, list[str]]:
    me = python_command(module="uffdkvm")
    cmds: dict[str, list[str]] = {}
    for w in WRITES:
        if upstream:
            for tracker, extra in UPSTREAM_TRACKERS.items():
                cmds[f"upstream {tracker} w{w}"] = [upstream, *flags, *extra, "-w", str(w)]
        for tracker in trackers:
            # The largest ring: kvm_pvm overruns a small one (docs/dirty-tracking.md).
            ring = ["--dirty-ring-entries", str(RING_ENTRIES)] if tracker == "ring" and \
                "--dirty-ring-entries" not in ours else []
            cmds[f"uffdkvm {tracker} w{w}"] = me + ["dirty-log", *flags, "--tracking", tracker,
                                                    "-w", str(w), "--json", "-q", *ring, *ours]
        untracked = {**fields_for(flags, w), "dirty_tracking": None}
        for name in ("dirty_clear_pages", "dirty_ring_entries"):
            untracked.pop(name, None)
        cmds[f"uffdkvm off w{w}"] = python_command(code=UNTRACKED, args=[json.dumps(untracked)])
    return cmds


def run_one(name: str, cmd: list[str]) -> Run | None:
    """The command's iterations, or None (said on stderr) if it failed or did
    not verify: the trial then counts as failed for the figures it feeds."""
    # The uffdkvm this script imported, never a uffdkvm/ in the working directory.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=child_env())
    try:
        if p.returncode != 0:
            raise ValueError(f"exit status {p.returncode}")
        if name.startswith("upstream"):
            got = cli_dirty.parse(p.stdout)
            if not got.dirty_s or len(got.get_s) != len(got.dirty_s):
                raise ValueError("no iteration lines")
            return Run(got.dirty_s, got.get_s, got.clear_s or [0.0] * len(got.dirty_s))
        d = json.loads(p.stdout)
        if not d["verified"]:
            raise ValueError("memory not verified")
        if name.startswith("uffdkvm off"):
            s = d["pass_seconds"][1:]  # pass 0 populates; pass k is iteration k
            return Run(s, [0.0] * len(s), [0.0] * len(s))
        passes = d["dirty_passes"]
        return Run([x["dirty_seconds"] for x in passes], [x["harvest_seconds"] for x in passes],
                   [x["reprotect_seconds"] for x in passes])
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"{name}: {shlex.join(cmd)} failed ({e}):\n{p.stdout[-2000:]}\n{p.stderr}",
              file=sys.stderr)
        return None


def steady(values: list[float]) -> float:
    """The mean of iterations 2..N."""
    return statistics.fmean(values[1:])


def write_cost_us(w100: Run | None, base: Run | None, pages: int) -> float | None:
    """(a): iterations 2..N of w100 over those of base, us per page a vCPU walks."""
    if w100 is None or base is None:
        return None
    return (steady(w100.dirty) - steady(base.dirty)) / pages * 1e6


def harvest_s_per_gib(w100: Run | None, gib: float) -> float | None:
    """(b): iterations 2..N's harvest + re-protect, seconds per GiB of guest memory."""
    if w100 is None:
        return None
    return steady([h + r for h, r in zip(w100.harvest, w100.reprotect, strict=True)]) / gib


def figures(runs: dict[str, list[Run | None]], pages: int, gib: float,
            upstream: bool, trackers: list[str]) -> dict[str, dict[str, list[float | None]]]:
    """Per tool and tracker: its per-trial figures."""
    out: dict[str, dict[str, list[float | None]]] = {}
    rows = ([f"upstream {t}" for t in UPSTREAM_TRACKERS] if upstream else []) + \
        [f"uffdkvm {t}" for t in trackers]
    for row in rows:
        w100, w0 = runs[f"{row} w100"], runs[f"{row} w0"]
        got = {"write_us_per_page": [write_cost_us(a, b, pages)
                                     for a, b in zip(w100, w0, strict=True)],
               "harvest_s_per_gib": [harvest_s_per_gib(a, gib) for a in w100]}
        if row.startswith("uffdkvm"):
            got["vs_off_us_per_page"] = [write_cost_us(a, b, pages) for a, b in
                                         zip(w100, runs["uffdkvm off w100"], strict=True)]
        out[row] = got
    out["uffdkvm off"] = {"write_us_per_page": [
        write_cost_us(a, b, pages)
        for a, b in zip(runs["uffdkvm off w100"], runs["uffdkvm off w0"], strict=True)]}
    return out


def cell(values: list[float | None], fmt: str = ".3g") -> str:
    s = uffdkvm.spread_of(values)
    if s.n == 0:
        return "-"
    failed = f" ({s.failed} failed)" if s.failed else ""
    if s.n == 1:
        return f"{s.median:{fmt}}{failed}"
    return f"{s.median:{fmt}} [{s.ci_low:{fmt}}, {s.ci_high:{fmt}}]{failed}"


def ratio(theirs: list[float | None], mine: list[float | None]) -> tuple[str, dict[str, Any]]:
    """upstream / uffdkvm, paired; "-" where either side's interval holds 0
    (or a side has no value): a ratio of a cost not told from none."""
    for side in (theirs, mine):
        low, high = overhead.bounds(side)
        if not low == low or low <= 0 <= high:  # NaN, or spans 0
            return "-", {}
    try:
        r = uffdkvm.ratio_of(theirs, mine, paired=True)
    except (ValueError, uffdkvm.ConfigError):
        return "-", {}
    return str(r), {"estimate": r.estimate, "ci_low": r.ci_low, "ci_high": r.ci_high}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="path to dirty_log_perf_test (else uffdkvm only)")
    ap.add_argument("--trials", type=int, default=11)
    ap.add_argument("--flags", default=FLAGS, help=f"upstream's flags for both tools "
                    f"(default {FLAGS!r})")
    ap.add_argument("--ours", default="", metavar="FLAGS",
                    help="extra flags for uffdkvm's tracked runs, e.g. '--dirty-clear-pages 512'")
    ap.add_argument("--json", metavar="PATH", help="write every run's times and figures here")
    ap.add_argument("--trackers", default=",".join(TRACKERS), metavar="LIST",
                    help="uffdkvm's trackers to run, comma-separated (default: all, "
                    "%(default)s); leave out what the kernel lacks (wp_async before 6.7)")
    a = ap.parse_args()
    trackers = a.trackers.split(",")
    if not trackers or set(trackers) - set(TRACKERS):
        ap.error(f"--trackers: a comma-separated list of {', '.join(TRACKERS)}")
    flags, ours = shlex.split(a.flags), shlex.split(a.ours)
    check_flags(flags)
    config = uffdkvm.Config(**fields_for(flags, 100))
    if config.passes < 3:
        ap.error("-i 1: the figures use iterations 2..N; give -i 2 or more")
    pages = config.region_bytes // 4096 // (1 if config.overlap else config.vcpus)
    gib = config.region_bytes / GIB
    cmds = commands(flags, ours, a.upstream, trackers)
    names = list(cmds)
    runs: dict[str, list[Run | None]] = {n: [] for n in names}
    for t in range(a.trials):
        for name in overhead.rotated(names, t):
            runs[name].append(run_one(name, cmds[name]))
        print(f"  trial {t + 1}/{a.trials} done", file=sys.stderr)
    got = figures(runs, pages, gib, bool(a.upstream), trackers)
    rows: list[list[str]] = []
    ratios: dict[str, dict[str, Any]] = {}
    for row, f in got.items():
        tool, tracker = row.split(" ", 1)
        line = [tool, tracker, cell(f["write_us_per_page"]),
                cell(f["harvest_s_per_gib"], ".4g") if "harvest_s_per_gib" in f else "-",
                cell(f["vs_off_us_per_page"]) if "vs_off_us_per_page" in f else "-"]
        if a.upstream:
            theirs = got.get(f"upstream {tracker}")
            if tool == "uffdkvm" and theirs is not None:
                write_text, write_r = ratio(theirs["write_us_per_page"], f["write_us_per_page"])
                harvest_text, harvest_r = ratio(theirs["harvest_s_per_gib"],
                                                f["harvest_s_per_gib"])
                ratios[tracker] = {"write_us_per_page": write_r, "harvest_s_per_gib": harvest_r}
                line += [write_text, harvest_text]
            else:
                line += ["-", "-"]
        rows.append(line)
    head = ["tool", "tracker", "(a) write us/page", "(b) harvest+reprotect s/GiB",
            "vs off us/page"] + (["upstream / uffdkvm (a)", "upstream / uffdkvm (b)"]
                                 if a.upstream else [])
    print(f"\nDirty tracking, {a.flags}" + (f"; uffdkvm also {a.ours}" if a.ours else "") +
          f": {pages} pages per vCPU, {gib:.3g} GiB; median of {a.trials} trials "
          f"[{overhead.interval_name(a.trials)}]; iterations 2..N of each run")
    print(overhead.table(head, rows))
    print("(a) = (dirty time at -w 100 - at -w 0) / pages, same tool and tracker; "
          "vs off = uffdkvm's -w 100 over its own pass with tracking off; "
          "the 'off' row: untracked -w 100 over -w 0 (what a store adds, untracked)")
    if a.json:
        record: dict[str, Any] = {
            "trials": a.trials, "flags": a.flags, "ours": a.ours, "upstream": a.upstream,
            "pages_per_vcpu": pages, "gib": gib,
            "host": dataclasses.asdict(uffdkvm.HostInfo.current()),
            "commands": {n: shlex.join(c) for n, c in cmds.items()},
            "runs": {n: [None if r is None else dataclasses.asdict(r) for r in v]
                     for n, v in runs.items()},
            "figures": got, "ratios": ratios}
        with open(a.json, "w") as out:
            json.dump(record, out, indent=1)


if __name__ == "__main__":
    main()
