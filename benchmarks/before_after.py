#!/usr/bin/env python3
"""The same uffdkvm command under two installs, interleaved: did a change move the rate?

Each trial runs the command once under each interpreter, in alternating order
(A B, B A, A B, ...), so drift of the host falls on both. Prints each install's
median pages/s with the bootstrap 95% interval of the median, and the ratio
after/before with its own interval (resampled pairs of trials).

    python benchmarks/before_after.py /venvs/before/bin/python /venvs/after/bin/python
    python benchmarks/before_after.py A B --trials 25 -- -b 256M -c 0 -u NONE

The command is the CLI's (`python -m uffdkvm ARGS --json`), run from / so that
neither install's source tree shadows the other's; default ARGS: -b 256M -c 0.
"""
import argparse
import json
import random
import statistics
import subprocess
import sys


def rate(python: str, args: list[str]) -> float:
    out = subprocess.run([python, "-P", "-m", "uffdkvm", *args, "--json"], cwd="/",
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"{python} -m uffdkvm {' '.join(args)} failed:\n{out.stderr}")
    result = json.loads(out.stdout)
    if not result["verified"]:
        raise SystemExit(f"{python}: the run did not verify: {result['verify_message']}")
    return float(result["paging_rate"])


def interval(values: list[float], stat, n: int = 4000) -> tuple[float, float]:
    rng = random.Random(0)
    boots = sorted(stat(rng.choices(values, k=len(values))) for _ in range(n))
    return boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--trials", type=int, default=15)
    # The command's own flags (-v 2, -b 256M, ...) are not this script's:
    # argparse would give a "*" positional nothing once before and after
    # are matched, and refuse the rest, so they are taken as they come.
    a, rest = p.parse_known_args()
    a.args = (rest[1:] if rest[:1] == ["--"] else rest) or ["-b", "256M", "-c", "0"]
    pairs = []
    for t in range(a.trials):
        order = (a.before, a.after) if t % 2 == 0 else (a.after, a.before)
        got = {py: rate(py, a.args) for py in order}
        pairs.append((got[a.before], got[a.after]))
        print(f"trial {t + 1}: before {got[a.before]:.0f}  after {got[a.after]:.0f} pages/s",
              file=sys.stderr)
    before = [b for b, _ in pairs]
    after = [x for _, x in pairs]
    med = statistics.median
    lo, hi = interval(before, med)
    print(f"before: median {med(before):.0f} pages/s [{lo:.0f}, {hi:.0f}]")
    lo, hi = interval(after, med)
    print(f"after:  median {med(after):.0f} pages/s [{lo:.0f}, {hi:.0f}]")
    ratios = [x / b for b, x in pairs]
    lo, hi = interval(ratios, med)
    print(f"after/before: median of paired ratios {med(ratios):.3f} [{lo:.3f}, {hi:.3f}] "
          f"({a.trials} trials, {' '.join(a.args)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
