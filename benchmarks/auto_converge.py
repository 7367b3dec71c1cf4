#!/usr/bin/env python3
"""What auto_converge buys a pre-copy that does not converge: the same
guest, the same link, with and without QEMU's throttle.

    python benchmarks/auto_converge.py --trials 5 --json out.json

The guest writes every page it walks every pass (write_percent=100), so
without the throttle each round resends about what the last one did and
the rounds end at --max-rounds with the whole working set left for the
stop-copy. With it, the throttle climbs (throttle_initial_percent, then
throttle_increment_percent a round, up to throttle_max_percent) until the
dirty set fits downtime_target_ms. Trials are interleaved (off, on, off,
on, ...); each cell is a median with a bootstrap 95% interval, and
"on/off" is the paired ratio (the median of per-trial ratios). The exit
status is 1 when any run failed (its error goes to stderr).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uffdkvm
from uffdkvm import ratio_of, spread_of

# Each migration's row in --json: the figures above, not both sides' Results.
KEPT = ("trial", "auto_converge", "converged", "round_count", "downtime_seconds",
        "total_seconds", "precopy_bytes", "stopcopy_bytes", "postcopy_bytes", "verified")


def _cell(values) -> str:
    s = spread_of(values)
    return f"{s.median:.3g} [{s.ci_low:.3g}, {s.ci_high:.3g}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--vcpus", type=int, default=2)
    ap.add_argument("--mem", default="64M", help="memory per vCPU (default 64M)")
    ap.add_argument("--bandwidth", type=int, default=1000, help="link, Mbit/s")
    ap.add_argument("--downtime-target-ms", type=int, default=300)
    ap.add_argument("--max-rounds", type=int, default=30)
    ap.add_argument("--json", type=Path, help="write every migration's row here (JSON)")
    args = ap.parse_args(argv)
    df = uffdkvm.migration_sweep(
        mode="precopy", auto_converge=[False, True], trials=args.trials, vcpus=args.vcpus,
        mem_per_vcpu=args.mem, write_percent=100, link_bandwidth_mbps=args.bandwidth,
        downtime_target_ms=args.downtime_target_ms, max_rounds=args.max_rounds)
    if df["error"].notna().any():
        print(df[df["error"].notna()][["auto_converge", "error"]].to_string(), file=sys.stderr)
    ok = df[df["error"].isna()]
    print(f"precopy, {args.vcpus} vCPUs x {args.mem}, write_percent 100, link "
          f"{args.bandwidth} Mbit/s, downtime_target_ms {args.downtime_target_ms}, "
          f"max_rounds {args.max_rounds}, {args.trials} interleaved trials; "
          f"median [95% CI]\n")
    print("| auto_converge | converged | rounds | downtime s | total s | stop-copy MiB | "
          "verified |")
    print("|---|---|---|---|---|---|---|")
    by = {on: ok[ok["auto_converge"] == on].sort_values("trial") for on in (False, True)}
    for on, rows in by.items():
        if rows.empty:
            continue
        print(f"| {on} | {int(rows['converged'].sum())}/{len(rows)} | "
              f"{_cell(rows['round_count'])} | {_cell(rows['downtime_seconds'])} | "
              f"{_cell(rows['total_seconds'])} | {_cell(rows['stopcopy_bytes'] / 2**20)} | "
              f"{'yes' if rows['verified'].all() else 'NO'} |")
    if len(by[True]) == len(by[False]) and not by[True].empty:
        down, total = (ratio_of(by[True][c], by[False][c], paired=True)
                       for c in ("downtime_seconds", "total_seconds"))
        print(f"\n| on/off | downtime | total |\n|---|---|---|\n| paired | {down} | {total} |")
    if args.json:
        args.json.write_text(ok[list(KEPT)].to_json(orient="records", indent=1) + "\n")
    return 1 if df["error"].notna().any() else 0


if __name__ == "__main__":
    sys.exit(main())
