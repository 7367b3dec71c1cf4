#!/usr/bin/env python3
"""Run-to-run spread of the paging rate at three fixed settings.

Runs the three settings in turn, trial after trial (A, B, C, A, B, C, ...),
so slow drift of the host spreads over all of them, and prints per setting
the median pages/s, the interquartile range, the coefficient of variation
(stdev/mean) and the bootstrap 95% confidence interval of the median
(uffdkvm.spread_of), then the same as a markdown table for
benchmarks/RESULTS.md.

    python benchmarks/spread.py                      # 15 trials each: minutes
    python benchmarks/spread.py --trials 25 --json spread.json
    python benchmarks/spread.py --trials 3 --mem-per-vcpu 1M   # does it work?

The settings, as upstream's demand_paging_test flags:

    -u MISSING -v 1 -b 256M
    -u MINOR -s shmem -v 2 -b 128M -r 2
    -u MISSING -v 2 -b 64M -a -r 4

A run that raises or does not verify is reported on stderr and counted as
failed; the others go on. Exit status 0, or 1 when some run failed.
"""
import argparse
import dataclasses
import json
import sys
import time

import uffdkvm
from uffdkvm.io.serial import encode

SETTINGS = {
    "-u MISSING -v 1 -b 256M": dict(vcpus=1, mem_per_vcpu="256M"),
    "-u MINOR -s shmem -v 2 -b 128M -r 2": dict(vcpus=2, mem_per_vcpu="128M", uffd_mode="minor",
                                                backing="shmem", readers=2),
    "-u MISSING -v 2 -b 64M -a -r 4": dict(vcpus=2, mem_per_vcpu="64M", single_uffd=True,
                                           readers=4),
}


def k(x):
    """29123.4 -> '29.1k'."""
    return "-" if x != x else f"{x / 1e3:.3g}k" if abs(x) >= 1e3 else f"{x:.3g}"


def measure(configs, trials):
    """{name: [pages/s or None]} and {name: [error messages]}, trial by trial."""
    rates = {name: [] for name in configs}
    errors = {name: [] for name in configs}
    for trial in range(trials):
        start = time.monotonic()
        for name, config in configs.items():
            try:
                r = uffdkvm.run(config)
                if not r.verified:
                    raise uffdkvm.RunError(f"memory did not verify: {r.verify_message}")
                rates[name].append(r.paging_rate)
            except uffdkvm.UffdkvmError as e:
                rates[name].append(None)
                errors[name].append(f"{type(e).__name__}: {e}")
                print(f"{name}: trial {trial}: {errors[name][-1]}", file=sys.stderr)
        print(f"trial {trial + 1}/{trials} done in {time.monotonic() - start:.1f} s",
              file=sys.stderr)
    return rates, errors


def markdown(spreads):
    lines = ["| flags | median pages/s | 95% CI of the median | IQR (q1-q3) | CV | runs |",
             "|---|---|---|---|---|---|"]
    for name, s in spreads.items():
        runs = f"{s.n}" + (f" ({s.failed} failed)" if s.failed else "")
        if not s.n:
            lines.append(f"| `{name}` | - | - | - | - | {runs} |")
            continue
        ci = "-" if s.n < 2 else f"[{k(s.ci_low)}, {k(s.ci_high)}]"
        cv = "-" if s.n < 2 else f"{s.cv:.1%}"
        lines.append(f"| `{name}` | {k(s.median)} | {ci} | {k(s.q1)}-{k(s.q3)} | {cv} | {runs} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=15, help="runs of each setting (default 15)")
    ap.add_argument("--mem-per-vcpu", metavar="SIZE",
                    help="replace every setting's memory per vCPU (e.g. 1M for a quick check)")
    ap.add_argument("--resamples", type=int, default=2000,
                    help="bootstrap resamples for the interval (default 2000)")
    ap.add_argument("--json", metavar="FILE", help="also write every rate and statistic here")
    a = ap.parse_args()
    if a.trials < 1:
        ap.error("--trials: must be at least 1")

    configs = {}
    for name, fields in SETTINGS.items():
        if a.mem_per_vcpu:
            fields = dict(fields, mem_per_vcpu=a.mem_per_vcpu)
            name = name.replace(name.split("-b ")[1].split()[0], a.mem_per_vcpu)
        try:
            configs[name] = uffdkvm.Config(**fields)
        except uffdkvm.ConfigError as e:
            ap.error(str(e))

    host = uffdkvm.HostInfo.current()
    print(f"uffdkvm {uffdkvm.__version__}, {host.name}: Linux {host.kernel_release}, "
          f"{host.cpu_model}, {host.usable_cpus} usable CPUs"
          + (", itself a VM" if host.hypervisor else ""))
    print(f"{a.trials} trials of each setting, interleaved\n")
    rates, errors = measure(configs, a.trials)
    spreads = {name: uffdkvm.spread_of(values, resamples=a.resamples)
               for name, values in rates.items()}

    for name, s in spreads.items():
        print(f"{name}")
        print(f"    median {s.median:10.0f} pages/s   95% CI [{s.ci_low:.0f}, {s.ci_high:.0f}]")
        print(f"    IQR    {s.q1:10.0f} - {s.q3:.0f}   cv {s.cv:.1%}   min {s.min:.0f}   "
              f"max {s.max:.0f}   n {s.n}" + (f", {s.failed} failed" if s.failed else ""))
        print("    runs   " + " ".join("failed" if v is None else f"{v:.0f}"
                                     for v in rates[name]))
    print()
    print(markdown(spreads))
    print(f"\nMedian pages/s of {a.trials} interleaved trials; in brackets the bootstrap 95% "
          f"confidence interval of the median ({a.resamples} resamples"
          + (", which for fewer than 6 trials is the min-max" if a.trials < 6 else "")
          + "); IQR the 25th-75th percentiles; CV stdev/mean.")

    if a.json:
        with open(a.json, "w") as f:
            json.dump({
                "command": sys.argv,
                "host": dataclasses.asdict(host),
                "trials": a.trials,
                "resamples": a.resamples,
                "settings": [{"flags": name, "config": encode(configs[name]),
                              "pages_per_s": rates[name], "errors": errors[name],
                              "spread": dataclasses.asdict(spreads[name])}
                             for name in configs],
            }, f, indent=1)
            f.write("\n")
    return 1 if any(errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
