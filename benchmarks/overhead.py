#!/usr/bin/env python3
"""Per-page userfault overhead, uffdkvm beside the kernel's demand_paging_test.

On a host that emulates guest instructions (PVM here) a tool's paging rate
is as much its guest loop as its fault path. Each tool's own run without
userfaultfd, same settings, cancels the guest:

    overhead per page = vcpus * (1 / rate(uffd mode) - 1 / rate(no uffd))

(rates are the tools' "Overall demand paging rate", pages/s over all vCPUs,
so vcpus / rate is the time one vCPU spends per page). Every trial runs the
four commands (upstream with and without -u, uffdkvm with and without) in an
order that rotates from trial to trial, so drift hits all alike; the table
gives the median of the per-trial overheads with a bootstrap 95% interval,
and upstream / uffdkvm as the median of the per-trial ratios (paired) with
its interval: above 1 means uffdkvm's fault path costs less.

    python benchmarks/overhead.py --upstream PATH/demand_paging_test \\
        --trials 15 --json overhead.json

Configurations are upstream's flags, "LABEL=FLAGS" (--config, repeatable;
the default is the three of benchmarks/RESULTS.md). --ours FLAGS adds
flags to every uffdkvm command (any Config field). --variant LABEL=FLAGS
(repeatable) measures several uffdkvm fault paths in the same trials: each
adds its flags to uffdkvm's userfaultfd run only, so they must be fields of
the fault path (--wait, --resolver, --pin-readers, --read-batch, ...), and
all share one run without userfaultfd per trial (what changes the guest,
such as -c, belongs in the configuration or --ours). Without --upstream only
uffdkvm is measured. uffdkvm runs with its CLI's defaults, stats="full"
among them: its userfaultfd runs pay for timing every fault, which
upstream's do not. With -c (and no main-thread entry) that default puts each
reader on its vCPU's CPU (issue 21), spinning at SCHED_IDLE there with a uffd
per vCPU (wait="spin_idle") and asleep in epoll_exclusive with one shared
uffd; --variant "scheduler=--pin-readers scheduler" measures upstream's
design, epoll_exclusive readers where the scheduler puts them, in the same
trials.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
from typing import Any

import uffdkvm
from uffdkvm._spawn import child_env, python_command

RATE = re.compile(r"Overall demand paging rate:\s+([\d.]+) pgs/sec")
CONFIGS = {
    "MISSING, one uffd per vCPU, 1 reader": "-u MISSING -v 2 -b 64M -r 1",
    "MISSING, one uffd, 4 readers": "-u MISSING -v 2 -b 64M -a -r 4",
    "MINOR shmem, one uffd per vCPU, 2 readers": "-u MINOR -s shmem -v 2 -b 64M -r 2",
}


def table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: every benchmark script prints its results so."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                     ["| " + " | ".join(r) + " |" for r in rows])


def rate_of(cmd: list[str]) -> float | None:
    """The command's paging rate, or None (said on stderr) if it failed: the
    trial then counts as failed on that side, and the others stand."""
    # The uffdkvm this script imported, never a uffdkvm/ in the working directory.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=child_env())
    m = RATE.search(p.stdout)
    if p.returncode != 0 or not m:
        print(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}",
              file=sys.stderr)
        return None
    return float(m.group(1))


def without_uffd(flags: list[str]) -> list[str]:
    """The same flags with no userfaultfd: upstream's -u dropped."""
    out = list(flags)
    if "-u" in out:
        i = out.index("-u")
        del out[i:i + 2]
    return out


def vcpus_of(flags: list[str]) -> int:
    return int(flags[flags.index("-v") + 1]) if "-v" in flags else 1


def commands(flags: list[str], ours: list[str], variants: dict[str, list[str]],
             upstream: str | None) -> dict[str, list[str]]:
    me = python_command(module="uffdkvm")
    cmds = {f"{label} uffd": me + flags + ours + extra for label, extra in variants.items()}
    cmds["uffdkvm none"] = me + without_uffd(flags) + ["-u", "NONE"] + ours
    if upstream:
        cmds["upstream uffd"] = [upstream] + flags
        cmds["upstream none"] = [upstream] + without_uffd(flags)
    return cmds


def rotated(names: list[Any], t: int) -> list[Any]:
    """Trial t's order of names: rotated by t, so that no command always runs first."""
    k = t % len(names) if names else 0
    return names[k:] + names[:k]


def measure(flags: list[str], ours: list[str], variants: dict[str, list[str]],
            upstream: str | None, trials: int) -> dict[str, list[float | None]]:
    cmds = commands(flags, ours, variants, upstream)
    names = list(cmds)
    rates: dict[str, list[float | None]] = {n: [] for n in names}
    for t in range(trials):
        for name in rotated(names, t):
            rates[name].append(rate_of(cmds[name]))
        print(f"  trial {t + 1}/{trials}: " +
              "  ".join(f"{n} {rates[n][-1] or 0:.0f}" for n in names), file=sys.stderr)
    return rates


def overheads_us(rates: dict[str, list[float | None]], variant: str, tool: str,
                 vcpus: int) -> list[float | None]:
    """Per trial; None where either run of the trial failed."""
    return [vcpus * (1 / u - 1 / n) * 1e6 if u and n else None
            for u, n in zip(rates[f"{variant} uffd"], rates[f"{tool} none"], strict=True)]


# Below this many trials a table gives the range (min-max), labelled as such,
# not a bootstrap interval.
RANGE_BELOW = 5


def interval_name(n: int) -> str:
    """What the [low, high] beside a median of n trials is."""
    return "range (min-max)" if n < RANGE_BELOW else "bootstrap 95% interval"


def bounds(values: list[float | None]) -> tuple[float, float]:
    """(low, high) of the trials that did not fail: min and max below
    RANGE_BELOW trials, else the bootstrap 95% interval of the median (NaN
    where there is none)."""
    ok = [v for v in values if v is not None and v == v]
    if not ok:
        return float("nan"), float("nan")
    if len(ok) < RANGE_BELOW:
        return min(ok), max(ok)
    s = uffdkvm.spread_of(ok)
    return s.ci_low, s.ci_high


def ratio_text(value: float | None, low: float | None, high: float | None,
               by: float, fmt: str = ".2f") -> str:
    """value / by, or "-" where there is no value or its interval spans 0
    (a ratio of an overhead not distinguishable from none)."""
    if value is None or low is None or high is None or low <= 0 <= high:
        return "-"
    return format(value / by, fmt)


def cell(values: list[float | None]) -> str:
    s = uffdkvm.spread_of(values)
    failed = f" ({s.failed} failed)" if s.failed else ""
    return f"{s.median:.1f} [{s.ci_low:.1f}, {s.ci_high:.1f}]{failed}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="path to demand_paging_test (else uffdkvm only)")
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--config", action="append", metavar="LABEL=FLAGS",
                    help="a configuration in upstream's flags (repeatable)")
    ap.add_argument("--ours", default="", metavar="FLAGS",
                    help="extra flags for every uffdkvm command, e.g. '--stats basic'")
    ap.add_argument("--variant", action="append", metavar="LABEL=FLAGS",
                    help="a uffdkvm fault path, flags for its userfaultfd run only, e.g. "
                    "'spin=--wait spin' (repeatable; default: uffdkvm as it is)")
    ap.add_argument("--json", metavar="PATH", help="write every rate and overhead here")
    a = ap.parse_args()
    if a.trials < 15:
        print(f"note: {a.trials} trials; 15 or more give intervals worth quoting here",
              file=sys.stderr)
    configs = dict(c.split("=", 1) for c in a.config) if a.config else CONFIGS
    ours = shlex.split(a.ours)
    variants: dict[str, list[str]] = {}
    for v in a.variant or ["uffdkvm="]:
        label, eq, text = v.partition("=")
        if not eq or not label or label == "upstream" or label in variants:
            ap.error(f"--variant {v!r}: LABEL=FLAGS, a label of its own (not 'upstream')")
        variants[label] = shlex.split(text)
    host = dataclasses.asdict(uffdkvm.HostInfo.current())
    rows: list[list[str]] = []
    record: dict[str, Any] = {"trials": a.trials, "ours": a.ours,
                              "variants": {k: shlex.join(v) for k, v in variants.items()},
                              "upstream": a.upstream, "host": host, "configs": []}
    for label, text in configs.items():
        flags = shlex.split(text)
        print(f"{label}: {text}", file=sys.stderr)
        rates = measure(flags, ours, variants, a.upstream, a.trials)
        vcpus = vcpus_of(flags)
        entry: dict[str, Any] = {"label": label, "flags": text, "vcpus": vcpus,
                                 "rates": rates, "variants": {}}
        theirs = overheads_us(rates, "upstream", "upstream", vcpus) if a.upstream else []
        if a.upstream:
            entry["upstream_us_per_page"] = theirs
        for variant in variants:
            mine = overheads_us(rates, variant, "uffdkvm", vcpus)
            got: dict[str, Any] = {"us_per_page": mine}
            row = [label, variant, cell(mine)]
            if a.upstream:
                ratio = uffdkvm.ratio_of(theirs, mine, paired=True)
                got["upstream_over_uffdkvm"] = {"estimate": ratio.estimate,
                                                "ci_low": ratio.ci_low,
                                                "ci_high": ratio.ci_high}
                row = [label, variant, cell(theirs), cell(mine), str(ratio)]
            entry["variants"][variant] = got
            rows.append(row)
        entry["median_rates"] = {n: statistics.median([x for x in v if x] or [math.nan])
                                 for n, v in rates.items()}
        record["configs"].append(entry)
    head = ["config", "uffdkvm", "upstream us/page", "uffdkvm us/page",
            "upstream / uffdkvm"] if a.upstream else ["config", "uffdkvm", "uffdkvm us/page"]
    print(f"\nPer-page userfault overhead, median of {a.trials} [bootstrap 95% interval]"
          + (f"; uffdkvm also: {a.ours}" if a.ours else "") + "; "
          + "; ".join(f"{k}: {shlex.join(v) or '(as it is)'}" for k, v in variants.items()))
    print(table(head, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
