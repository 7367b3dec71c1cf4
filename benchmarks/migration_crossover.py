#!/usr/bin/env python3
"""Where post-copy overtakes pre-copy: total time and downtime of the three
migration modes against the guest's dirty rate, at one link bandwidth.

    python benchmarks/migration_crossover.py --trials 7 --json out.json

The dirty rate is set by write_percent (the share of its pages the guest
writes every pass); the rate each point actually had is what the pre-copy
source's tracker saw in round 1 (MigrationRound.dirty_rate), reported in
MB/s beside the link's own rate. Trials are interleaved (trial 1 of every
point, then trial 2, ...): a host that drifts moves every point alike. Each
cell is a median with a bootstrap 95% interval; "post/pre" is the paired
ratio of postcopy's total time to precopy's (the median of per-trial
ratios), and where it falls below 1 post-copy has overtaken. The exit
status is 1 when any run failed (its error goes to stderr).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import uffdkvm
from uffdkvm import ratio_of, spread_of

MODES = ("precopy", "postcopy", "hybrid")


def _cell(values) -> str:
    s = spread_of(values)
    return f"{s.median:.3g} [{s.ci_low:.3g}, {s.ci_high:.3g}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--vcpus", type=int, default=2)
    ap.add_argument("--mem", default="64M", help="memory per vCPU (default 64M)")
    ap.add_argument("--bandwidth", type=int, default=1000, help="link, Mbit/s")
    ap.add_argument("--latency", type=int, default=0, help="link latency, us")
    ap.add_argument("--write-percent", default="0,5,10,20,40,70,100",
                    help="the dirty rates, as write_percent values (default 0,5,...,100)")
    ap.add_argument("--json", type=Path, help="write each point's trials here (JSON)")
    args = ap.parse_args(argv)
    percents = [int(p) for p in args.write_percent.split(",")]
    df = uffdkvm.migration_sweep(
        mode=list(MODES), write_percent=percents, trials=args.trials, vcpus=args.vcpus,
        mem_per_vcpu=args.mem, link_bandwidth_mbps=args.bandwidth,
        link_latency_us=args.latency)
    if df["error"].notna().any():
        print(df[df["error"].notna()][["mode", "write_percent", "error"]].to_string(),
              file=sys.stderr)
    ok = df[df["error"].isna()]
    link_mbs = args.bandwidth / 8
    print(f"{args.vcpus} vCPUs x {args.mem}, link {args.bandwidth} Mbit/s "
          f"({link_mbs:g} MB/s), latency {args.latency} us, {args.trials} interleaved "
          f"trials; seconds, median [95% CI]\n")
    print("| write_percent | dirty rate MB/s | mode | total_seconds | downtime_seconds | "
          "rounds | converged | postcopy_faults | verified |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = []
    for p in percents:
        pre = ok[(ok["mode"] == "precopy") & (ok["write_percent"] == p)]
        rates = list(pre["dirty_rate"] * 4096 / 1e6)  # round 1's, MB/s
        for mode in MODES:
            rows = ok[(ok["mode"] == mode) & (ok["write_percent"] == p)]
            if rows.empty:
                continue
            entry = {"write_percent": p, "mode": mode, "dirty_rate_mbs": rates,
                     "total_seconds": list(rows["total_seconds"]),
                     "downtime_seconds": list(rows["downtime_seconds"]),
                     "round_count": list(rows["round_count"]),
                     "converged": list(rows["converged"]),
                     "postcopy_faults": list(rows["postcopy_faults"]),
                     "postcopy_bytes": list(rows["postcopy_bytes"]),
                     "verified": bool(rows["verified"].all())}
            summary.append(entry)
            print(f"| {p} | {_cell(rates) if rates else '-'} | {mode} | "
                  f"{_cell(entry['total_seconds'])} | {_cell(entry['downtime_seconds'])} | "
                  f"{int(spread_of(entry['round_count']).median)} | "
                  f"{sum(entry['converged'])}/{len(entry['converged'])} | "
                  f"{int(spread_of(entry['postcopy_faults']).median)} | "
                  f"{'yes' if entry['verified'] else 'NO'} |")
    print("\n| write_percent | post/pre total | hybrid/pre total | post/pre downtime |")
    print("|---|---|---|---|")
    for p in percents:
        by = {m: ok[(ok["mode"] == m) & (ok["write_percent"] == p)].sort_values("trial")
              for m in MODES}
        if any(len(by[m]) != len(by["precopy"]) or by[m].empty for m in MODES):
            continue
        r_post = ratio_of(by["postcopy"]["total_seconds"], by["precopy"]["total_seconds"],
                          paired=True)
        r_hyb = ratio_of(by["hybrid"]["total_seconds"], by["precopy"]["total_seconds"],
                         paired=True)
        r_down = ratio_of(by["postcopy"]["downtime_seconds"],
                          by["precopy"]["downtime_seconds"], paired=True)
        print(f"| {p} | {r_post} | {r_hyb} | {r_down} |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "points": summary}, indent=1, default=str))
    # A point whose runs failed is not measured: say so in the status too.
    return 1 if df["error"].notna().any() else 0


if __name__ == "__main__":
    sys.exit(main())
