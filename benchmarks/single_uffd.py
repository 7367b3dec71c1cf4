#!/usr/bin/env python3
"""One shared uffd against one uffd per vCPU, and where the shared one loses.

    python benchmarks/single_uffd.py --trials 8 [--vcpus 2,4] [--mem 32M]

For each vCPU count, the same memory is paged in through one uffd per vCPU
(a reader each) and through one uffd for all of them (a reader per vCPU),
for every sleeping wait mode, with readers left to the scheduler and placed
with the vCPUs (pin_readers="vcpus", vCPU i pinned to CPU i modulo the CPUs
this process may use), and with no readers at all (resolver="vcpu"). The
settings alternate run by run; the table gives
median pages/s [bootstrap 95% interval] and single / per-vCPU, the ratio of
medians at the same wait mode and placement.

Then, once per wait mode, one traced run of the shared uffd placed with the
vCPUs (guest timing on: it slows the guest, so its rates are not the
table's) splits the faults by whether the reader that resolved a fault ran
on its vCPU's CPU, with the median fault time (the guest's access raised to
its resume) of each: on a host where a wakeup across CPUs is dear, a shared
uffd is as fast as the share of its faults that its wait mode hands to the
reader beside the faulting vCPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import uffdkvm

WAITS = ("epoll_exclusive", "epoll", "poll", "read", "io_uring")


def configs(vcpus: int, cpus: list[int]) -> dict[str, dict[str, Any]]:
    pins = tuple(cpus[i % len(cpus)] for i in range(vcpus))
    out: dict[str, dict[str, Any]] = {}
    for wait in WAITS:
        for place, fields in (("scheduler", {}),
                              ("with vCPUs", {"pin_vcpus": pins, "pin_readers": "vcpus"})):
            out[f"{wait}, per-vCPU, {place}"] = dict(wait=wait, readers=1, **fields)
            out[f"{wait}, single, {place}"] = dict(wait=wait, readers=vcpus,
                                                    single_uffd=True, **fields)
    # No readers at all: each vCPU resolves its own faults (placement moot).
    out["resolver vcpu, per-vCPU, scheduler"] = dict(resolver="vcpu")
    out["resolver vcpu, single, scheduler"] = dict(resolver="vcpu", single_uffd=True)
    return out


def shares(vcpus: int, mem: str, cpus: list[int]) -> list[str]:
    pins = tuple(cpus[i % len(cpus)] for i in range(vcpus))
    lines = []
    runs_here = uffdkvm.fault_path_support()["wait"]
    for wait in WAITS:
        if runs_here[wait] is not None:
            continue  # this host or build cannot run it: its rows say so already
        r = uffdkvm.run(vcpus=vcpus, mem_per_vcpu=mem, single_uffd=True, readers=vcpus,
                        wait=wait, pin_vcpus=pins, pin_readers="vcpus", guest_timing=True,
                        trace_faults=True)
        f = r.faults_frame()
        f = f[~f.eexist]
        reader_cpu = [r.config.reader_cpus[i % len(r.config.reader_cpus)]  # type: ignore[index]
                      for i in f.reader]
        same = [rc == pins[v % len(pins)] for rc, v in zip(reader_cpu, f.vcpu, strict=True)]
        f = f.assign(same=same)
        near, far = f[f.same], f[~f.same]
        lines.append(f"| {vcpus} | `{wait}` | {len(near) / len(f):.2f} | "
                     f"{near.fault_ns.median() / 1e3:.1f} | {far.fault_ns.median() / 1e3:.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--vcpus", default="2,4")
    ap.add_argument("--mem", default="32M", help="mem_per_vcpu (default 32M)")
    ap.add_argument("--json", help="write every rate here")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    table, share_lines, raw = [], [], {}
    for vcpus in (int(v) for v in a.vcpus.split(",")):
        points = configs(vcpus, cpus)
        rates: dict[str, list[float | None]] = {k: [] for k in points}
        for t in range(a.trials):
            names = list(points)
            k = t % len(names)
            for name in names[k:] + names[:k]:  # rotate, so drift hits all alike
                try:
                    r = uffdkvm.run(vcpus=vcpus, mem_per_vcpu=a.mem, **points[name])
                except uffdkvm.UffdkvmError as e:
                    print(f"{name}: {e}", file=sys.stderr)
                    rates[name].append(None)
                    continue
                rates[name].append(r.paging_rate if r.verified else None)
        raw[vcpus] = rates
        rows = [(w, p) for w in WAITS for p in ("scheduler", "with vCPUs")]
        for wait, place in rows + [("resolver vcpu", "scheduler")]:
            per = uffdkvm.spread_of(rates[f"{wait}, per-vCPU, {place}"])
            one = uffdkvm.spread_of(rates[f"{wait}, single, {place}"])
            shown = "none: no readers" if wait == "resolver vcpu" else place
            table.append(f"| {vcpus} | `{wait}` | {shown} | {per.median / 1e3:.1f}k "
                         f"[{per.ci_low / 1e3:.1f}k, {per.ci_high / 1e3:.1f}k] | "
                         f"{one.median / 1e3:.1f}k [{one.ci_low / 1e3:.1f}k, "
                         f"{one.ci_high / 1e3:.1f}k] | {one.median / per.median:.2f} |")
        share_lines += shares(vcpus, a.mem, cpus)
    print("| vCPUs | wait | readers | per-vCPU uffds | one uffd | one / per-vCPU |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))
    print()
    print("| vCPUs | wait | share beside its vCPU | fault us, beside | fault us, across |")
    print("|---|---|---|---|---|")
    print("\n".join(share_lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "rates": raw}, f, indent=1)


if __name__ == "__main__":
    main()
