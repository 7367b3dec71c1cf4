#!/usr/bin/env python3
"""What measuring costs: paging rate with stats="full" against stats="basic".

Runs the two alternately (basic, full, basic, ...) at the same settings, so
drift on a noisy host hits both alike, and prints the medians and their
ratio: the median of the per-trial ratios with its bootstrap 95% interval
(uffdkvm.ratio_of, paired). The target: full costs under 3% of the rate.

    python benchmarks/stats_cost.py --trials 7 vcpus=2 mem_per_vcpu=256M readers=4
"""
import argparse
import ast
import statistics

import uffdkvm


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--compare", default="stats=basic,stats=full",
                    help="two field=value settings to compare (default the stats modes)")
    ap.add_argument("fields", nargs="*", help="Config fields as field=value")
    a = ap.parse_args()
    base = {}
    for item in a.fields:
        k, v = item.split("=", 1)
        try:
            base[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            base[k] = v
    variants = []
    for item in a.compare.split(","):
        k, v = item.split("=", 1)
        try:
            variants.append((item, {k: ast.literal_eval(v)}))
        except (ValueError, SyntaxError):
            variants.append((item, {k: v}))
    rates = {name: [] for name, _ in variants}
    for _ in range(a.trials):
        for name, extra in variants:
            r = uffdkvm.run(**base, **extra)
            assert r.verified, r.verify_message
            rates[name].append(r.paging_rate)
    print(f"settings: {base}")
    medians = {}
    for name, values in rates.items():
        medians[name] = statistics.median(values)
        print(f"{name:>16}: median {medians[name]:9.0f} pages/s  runs "
              + " ".join(f"{v:.0f}" for v in values))
    n0, n1 = list(rates)[:2]
    print(f"ratio {n1} / {n0}: {uffdkvm.ratio_of(rates[n1], rates[n0], paired=True)}  "
          f"(median of the per-trial ratios [bootstrap 95% CI])")


if __name__ == "__main__":
    main()
