#!/usr/bin/env python3
"""Side-by-side paging rate: uffdkvm against the kernel's demand_paging_test.

Both tools run the same settings, alternating (upstream, uffdkvm, upstream,
...), so drift on a noisy host hits both alike. Reports the median
"Overall demand paging rate" of each, both over upstream's window (the vCPU
threads' creation to their join), and their ratio: the median of the
per-trial ratios with its bootstrap 95% interval (uffdkvm.ratio_of, paired).

    python benchmarks/vs_upstream.py --upstream PATH/demand_paging_test \\
        --trials 7 -- -u MISSING -v 2 -b 256M

Everything after -- is passed to both tools unchanged (upstream's flags);
-u NONE stands for "no -u" on the upstream side. Building upstream's binary:
see benchmarks/RESULTS.md.
"""
import argparse
import re
import statistics
import subprocess
import sys

import uffdkvm
from uffdkvm._spawn import child_env, python_command

RATE = re.compile(r"Overall demand paging rate:\s+([\d.]+) pgs/sec")


def rate_of(cmd):
    # The uffdkvm this script imported, never a uffdkvm/ in the working directory.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=child_env())
    m = RATE.search(p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="path to demand_paging_test")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--ours", default="", metavar="FLAGS",
                    help="extra flags for uffdkvm only, e.g. '--guest-work 3'")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then upstream's flags")
    a = ap.parse_args()
    flags = a.args[1:] if a.args[:1] == ["--"] else a.args
    upstream_flags = list(flags)
    if "-u" in flags and flags[flags.index("-u") + 1].upper() == "NONE":
        i = flags.index("-u")
        del upstream_flags[i:i + 2]
    ours, theirs = [], []
    for _ in range(a.trials):
        theirs.append(rate_of([a.upstream] + upstream_flags))
        ours.append(rate_of(python_command(module="uffdkvm", args=flags + a.ours.split())))
    mu, mt = statistics.median(ours), statistics.median(theirs)
    print(f"settings:  {' '.join(flags)}" + (f"  (uffdkvm also: {a.ours})" if a.ours else ""))
    print(f"upstream:  median {mt:10.0f} pgs/s  runs {' '.join(f'{x:.0f}' for x in theirs)}")
    print(f"uffdkvm:   median {mu:10.0f} pgs/s  runs {' '.join(f'{x:.0f}' for x in ours)}")
    print(f"ratio uffdkvm/upstream: {uffdkvm.ratio_of(ours, theirs, paired=True)}  "
          f"(median of the per-trial ratios [bootstrap 95% CI])")


if __name__ == "__main__":
    main()
