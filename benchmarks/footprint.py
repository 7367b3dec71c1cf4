#!/usr/bin/env python3
"""What uffdkvm keeps per guest page: peak RSS less the guest region, by stats mode.

For each setting (stats="basic", stats="full", stats="full" with
trace_faults=True) and each region size (256 MiB, 1 GiB, 4 GiB, one vCPU,
every other field at its default) runs uffdkvm once per trial in a fresh
child process, which reports its peak RSS (VmHWM, read after the run and
after the Result was built, so the Result's Python objects count) and its
RSS after ``import uffdkvm`` (the interpreter's own, before the run). The
child's peak less its baseline less the guest region (the bytes the guest
touched: every page, once) is what the run kept besides the guest's memory:
"overhead". The margin is what one more guest page costs:

    (overhead(4 GiB) - overhead(1 GiB)) / (pages(4 GiB) - pages(1 GiB))

in bytes per 4 KiB guest page, the smallest overhead over trials at each
size (RSS only grows with what is kept; noise is upward). "of which guest
page tables" is the guest's own 4 KiB-page mapping of the region (8 B of
PTE per page, in guest system memory, which the upstream demand_paging_test's
guest carries too); "bookkeeping" is the margin without it, what the goal
(issue 21: at most 8 B/page with stats="full", 4 with "basic") is stated
against.

    python benchmarks/footprint.py --trials 1 --json footprint.json

RSS is not timing: a loaded machine gives the same numbers. One trial (nine
runs, 15.75 GiB of guest memory paged in all) takes about 5 minutes on the
development host.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from uffdkvm import _spawn  # noqa: E402

SIZES = (("256M", 256 << 20), ("1G", 1 << 30), ("4G", 4 << 30))
SETTINGS = (("basic", {"stats": "basic"}),
            ("full", {"stats": "full"}),
            ("full+trace_faults", {"stats": "full", "trace_faults": True}))
PAGE = 4096
PTE_BYTES = 8	# the guest's 4 KiB leaf entry per page (vm.c maps the region with 4 KiB pages)

# The child: baseline RSS after the import, then the run, then the peak.
CHILD = r"""
import json, resource, sys
def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(key)
import uffdkvm
base = kib("VmRSS")
fields = json.loads(sys.argv[1])
r = uffdkvm.run(**fields)
assert r.verified, r.verify_message
peak = kib("VmHWM")
print(json.dumps({"baseline_kib": base, "peak_kib": peak,
                  "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "faults": r.faults,
                  "has_trace": r.fault_trace is not None,
                  "touch_order": len(r.touch_order)}))
"""


def run_child(fields: dict) -> dict:
    cmd = _spawn.python_command(code=CHILD, args=[json.dumps(fields)])
    p = subprocess.run(cmd, env=_spawn.child_env(), capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"child {fields} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1, help="runs per cell (the smallest kept)")
    ap.add_argument("--json", type=Path, help="write every run and the table's numbers here")
    ap.add_argument("--sizes", default=",".join(s for s, _ in SIZES),
                    help="region sizes among 256M,1G,4G (the margin needs 1G and 4G)")
    ap.add_argument("--settings", default=",".join(s for s, _ in SETTINGS))
    a = ap.parse_args()
    if a.trials < 1:
        ap.error("--trials: at least 1")
    sizes = [(n, b) for n, b in SIZES if n in a.sizes.split(",")]
    settings = [(n, f) for n, f in SETTINGS if n in a.settings.split(",")]
    runs: list[dict] = []
    best: dict[tuple[str, str], int] = {}
    for _ in range(a.trials):
        for sname, extra in settings:
            for zname, zbytes in sizes:
                fields = {"vcpus": 1, "mem_per_vcpu": zbytes, **extra}
                out = run_child(fields)
                over = (out["peak_kib"] - out["baseline_kib"]) * 1024 - zbytes
                out.update(setting=sname, size=zname, region_bytes=zbytes, overhead_bytes=over)
                runs.append(out)
                key = (sname, zname)
                best[key] = min(best.get(key, over), over)
                print(f"# {sname} {zname}: overhead {over / 2**20:.1f} MiB "
                      f"(peak {out['peak_kib'] / 1024:.0f} MiB)", file=sys.stderr)
    rows = []
    for sname, _ in settings:
        row: dict = {"setting": sname}
        for zname, _ in sizes:
            row[f"overhead_{zname}_mib"] = best[(sname, zname)] / 2**20
        if ("1G" in dict(sizes)) and ("4G" in dict(sizes)):
            margin = (best[(sname, "4G")] - best[(sname, "1G")]) / ((3 << 30) // PAGE)
            row["margin_b_per_page"] = margin
            row["guest_page_tables_b_per_page"] = PTE_BYTES
            row["bookkeeping_b_per_page"] = margin - PTE_BYTES
        rows.append(row)
    head = ["setting"] + [f"overhead at {z} (MiB)" for z, _ in sizes]
    if rows and "margin_b_per_page" in rows[0]:
        head += ["margin (B/page)", "of which guest page tables", "bookkeeping (B/page)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row["setting"]] + [f"{row[f'overhead_{z}_mib']:.1f}" for z, _ in sizes]
        if "margin_b_per_page" in row:
            cells += [f"{row['margin_b_per_page']:.1f}", f"{row['guest_page_tables_b_per_page']}",
                      f"{row['bookkeeping_b_per_page']:.1f}"]
        print("| " + " | ".join(cells) + " |")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
