#!/usr/bin/env python3
"""Where a sleeping reader's cost lies: one vCPU, its reader placed three ways.

    python benchmarks/wake_cost.py --trials 8 [--mem 64M]

The reader sleeps (epoll_exclusive) on the vCPU's own CPU, sleeps on the
other CPU, or spins on the other CPU; plus both left to the scheduler. If
waking a reader that sleeps on another, idle, CPU is the cost, the reader on
the vCPU's own CPU (the vCPU blocks, the scheduler runs the reader there,
no cross-CPU wakeup) is fast, and so is the spinner (it never sleeps). The
settings alternate run by run; median pages/s [bootstrap 95% interval].
Needs two CPUs (0 and 1) this process may use.
"""
from __future__ import annotations

import argparse

import uffdkvm

PLACES = {
    "sleeping, left to the scheduler": dict(),
    "sleeping, on the vCPU's CPU": dict(pin_vcpus=(0,), pin_readers=(0,)),
    "sleeping, on the other CPU": dict(pin_vcpus=(0,), pin_readers=(1,)),
    "spinning, on the other CPU": dict(wait="spin", pin_vcpus=(0,), pin_readers=(1,)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--mem", default="64M", help="mem_per_vcpu (default 64M)")
    a = ap.parse_args()
    rates: dict[str, list[float]] = {k: [] for k in PLACES}
    for _ in range(a.trials):
        for name, fields in PLACES.items():
            r = uffdkvm.run(vcpus=1, mem_per_vcpu=a.mem, readers=1,
                            **({"wait": "epoll_exclusive"} | fields))
            if not r.verified:
                raise SystemExit(f"{name}: {r.verify_message}")
            rates[name].append(r.paging_rate)
    for name, values in rates.items():
        s = uffdkvm.spread_of(values)
        print(f"| {name} | {s.median:.0f} [{s.ci_low:.0f}, {s.ci_high:.0f}] |")


if __name__ == "__main__":
    main()
