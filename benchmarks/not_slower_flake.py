#!/usr/bin/env python3
"""How often does assert_not_slower fail two identical configs? (It should pass 19 of 20.)

Repeats uffdkvm.testing.assert_not_slower(c, c) REPS times for one Config and
counts the passes; prints each repetition's ratio b / a with its interval,
then the count.

    python benchmarks/not_slower_flake.py                     # 20 repetitions, defaults
    python benchmarks/not_slower_flake.py --reps 40 --trials 10 --tolerance 0.05 \\
        --metric overhead_ns_per_page -- vcpus=1 mem_per_vcpu=4M

Fields are FIELD=VALUE (Config's own forms; numbers as ints); default:
vcpus=1 mem_per_vcpu=4M, the suite's tiny config.
"""
import argparse
import sys

import uffdkvm
from uffdkvm.testing import assert_not_slower


def value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text == "None" else text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--trials", type=int, default=15)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--metric", default="pages_per_s")
    p.add_argument("fields", nargs="*", default=["vcpus=1", "mem_per_vcpu=4M"])
    a = p.parse_args()
    config = uffdkvm.Config(**{k: value(v) for k, v in (f.split("=", 1) for f in a.fields)})
    passed = 0
    for rep in range(a.reps):
        try:
            c = assert_not_slower(config, config, tolerance=a.tolerance, trials=a.trials,
                                  metric=a.metric, seed=rep)
            passed += 1
            verdict = "pass"
        except AssertionError as e:
            verdict = "FAIL"
            c = None
            print(e, file=sys.stderr)
        line = (f"{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}] cv a "
                f"{uffdkvm.spread_of(c.a).cv:.1%} b {uffdkvm.spread_of(c.b).cv:.1%}"
                if c else "")
        print(f"rep {rep + 1}/{a.reps}: {verdict} {line}", flush=True)
    print(f"assert_not_slower(c, c, tolerance={a.tolerance}, trials={a.trials}, "
          f"metric={a.metric!r}) with c = {' '.join(a.fields)}: "
          f"passed {passed} of {a.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
