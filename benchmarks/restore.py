#!/usr/bin/env python3
"""Prefetch policies for a restore: faults avoided, waste, time to resident, guest stall.

    python benchmarks/restore.py --trials 5 [--latencies 30,200] [--mem 32M]
                                 [--json benchmarks/results/restore_policies.json]

A VM of two vCPUs restores its memory from a snapshot (uffdkvm.make_snapshot):
from the file with its page cache dropped, and from a page server process
over a Unix socket at each remote latency. The guest touches half of its
pages (touch_percent=50, a seeded subset) in address order, so a prefetcher
that installs pages the guest never asks for wastes them. Each source runs
every prefetch policy:

  none        every page the guest touches faults
  readahead   each fault also installs the next 8 pages (prefetch_pages=8)
  background  a pusher installs every page in address order while the
              readers serve faults (QEMU's post-copy stream)
  replay      the pusher installs the pages in the order a run before the
              trials (the cold file, no prefetch) faulted them
              (Result.touch_order: REAP/FaaSnap)

Runs alternate configuration by configuration within a trial. Per policy
and source the table gives medians over the trials of: the pages the vCPUs
faulted on and waited for, whoever installed them (faulted_pages), faults
avoided (pages touched less those), pages prefetched and wasted (installed,
never touched), seconds until every page of the region was resident (the
policies that install all of it), the run's time, and the guest's stall on
its own clock (guest_timing=True): stall_seconds, each vCPU's time with a
fault outstanding (VcpuStats.blocked_seconds) summed, and blocktime_seconds,
the time during which every vCPU had one at once (QEMU's postcopy
blocktime).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import uffdkvm

POLICIES: dict[str, dict[str, Any]] = {
    "none": {},
    "readahead": {"prefetch": "readahead", "prefetch_pages": 8},
    "background": {"prefetch": "background"},
    "replay": {"prefetch": "replay"},
}
METRICS = ("faulted_pages", "faults_avoided", "prefetched_pages", "wasted_prefetch_pages",
           "resident_seconds", "seconds", "stall_seconds", "blocktime_seconds")


def sources(snapshot: str, latencies: list[int]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        "file (cold cache)": {"source": "file", "source_path": snapshot, "source_cache": "cold"}}
    for us in latencies:
        out[f"remote {us} us"] = {"source": "remote", "source_path": snapshot,
                                  "remote_latency_us": us}
    return out


def row(r: uffdkvm.Result) -> dict[str, Any]:
    if not r.verified:
        sys.exit(f"a run did not verify: {r.verify_message}")
    # The guest's stall: each vCPU's time with a fault outstanding, summed.
    stall = sum(v.blocked_seconds or 0.0 for v in r.vcpus)
    return {m: stall if m == "stall_seconds" else getattr(r, m) for m in METRICS}


def median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if len(present) == len(values) and present else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--latencies", default="30,200", help="remote latencies in us")
    ap.add_argument("--mem", default="32M", help="mem_per_vcpu (default 32M)")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    latencies = [int(x) for x in a.latencies.split(",")]
    base = dict(vcpus=2, mem_per_vcpu=a.mem, touch_percent=50, guest_timing=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = str(Path(tmp) / "snapshot.img")
        size = uffdkvm.Config(**base).region_bytes
        uffdkvm.make_snapshot(snapshot, size, seed=1)
        srcs = sources(snapshot, latencies)
        # The order replay installs: what the guest faulted with no prefetch.
        first = uffdkvm.run(**base, **srcs["file (cold cache)"], record_touch_order=True)
        order = list(first.touch_order)
        for trial in range(a.trials):
            for sname, sfields in srcs.items():
                for pname, pfields in POLICIES.items():
                    fields = dict(base, **sfields, **pfields)
                    if pname == "replay":
                        fields["replay_from"] = order
                    r = uffdkvm.run(**fields)
                    runs.setdefault(f"{sname}|{pname}", []).append(row(r))
            print(f"trial {trial + 1}/{a.trials} done", file=sys.stderr)
    print(f"`{' '.join(sys.argv)}`: vCPUs 2, {a.mem} each, touch_percent 50, "
          f"sequential, median of {a.trials}\n")
    print("| source | prefetch | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for key, rows in runs.items():
        sname, pname = key.split("|")
        cells = []
        for m in METRICS:
            v = median([x[m] for x in rows])
            cells.append("-" if v is None else (f"{v:.3f}" if isinstance(v, float) else f"{v:,}"))
        print(f"| {sname} | {pname} | " + " | ".join(cells) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
