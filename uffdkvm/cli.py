"""The command line: upstream demand_paging_test's flags, plus uffdkvm's own.

    uffdkvm -u MISSING -v 4 -b 256M -r 2 --wait poll
    uffdkvm -u MINOR -s shmem -o --json

Text output starts with upstream's three lines, so existing scripts that
parse them keep working, then adds the per-thread tables upstream never
printed.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

from .config import BACKINGS, WAITS, Config
from .errors import ConfigError, HostUnsupportedError, UffdkvmError
from .result import Result
from .run import run

EXIT_OK = 0
EXIT_UNVERIFIED = 1
EXIT_CONFIG = 2
EXIT_HOST = 3
EXIT_RUN = 4


def _uffd_mode(value: str) -> Optional[str]:
    v = value.lower()
    if v == "none":
        return None
    if v in ("missing", "minor"):
        return v
    raise argparse.ArgumentTypeError("UFFD mode must be 'MISSING', 'MINOR' or 'NONE'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="uffdkvm",
        description="Run one KVM demand-paging experiment over userfaultfd. The flags "
                    "are those of the kernel's KVM selftest demand_paging_test, plus "
                    "long options for what uffdkvm adds.",
        epilog="Unlike upstream, the default is -u MISSING (upstream runs without "
               "userfaultfd unless -u is given; here that is -u NONE). Exit status: 0 "
               "ok, 1 memory failed verification, 2 bad arguments, 3 host lacks "
               "something, 4 the run failed. To run a grid of experiments and compare "
               "them in one table: uffdkvm sweep --help.")
    d = Config()
    p.add_argument("-u", dest="uffd_mode", type=_uffd_mode, default=d.uffd_mode,
                   metavar="MODE", help="MISSING (UFFDIO_COPY), MINOR (UFFDIO_CONTINUE, "
                   "shared backings) or NONE (no userfaultfd). Default: MISSING")
    p.add_argument("-a", dest="single_uffd", action="store_true",
                   help="one userfaultfd for all guest memory instead of one per vCPU")
    p.add_argument("-d", dest="delay_us", type=int, default=d.delay_us, metavar="USEC",
                   help="delay per fault before resolving it, in microseconds")
    p.add_argument("-r", dest="readers", type=int, default=d.readers, metavar="N",
                   help="reader threads per userfaultfd (default 1)")
    p.add_argument("-b", dest="mem_per_vcpu", default="1G", metavar="SIZE",
                   help="memory each vCPU demand-pages, e.g. 64M or 2G (default 1G)")
    p.add_argument("-s", dest="backing", default=d.backing, type=str.lower,
                   choices=BACKINGS, metavar="TYPE",
                   help=f"backing memory: {', '.join(BACKINGS)} (default {d.backing})")
    p.add_argument("-v", dest="vcpus", type=int, default=d.vcpus, metavar="N",
                   help="vCPUs (default 1)")
    p.add_argument("-o", dest="overlap", action="store_true",
                   help="every vCPU walks the same memory (implies -a)")
    p.add_argument("--wait", default=d.wait, type=str.lower, choices=WAITS, metavar="MODE",
                   help=f"how readers wait: {', '.join(WAITS)} (default {d.wait})")
    p.add_argument("--guest-work", dest="guest_work", type=int, default=d.guest_work,
                   metavar="N", help="guest busy-loop iterations after each page access "
                   "(4 instructions each; default 0)")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=d.timeout_s,
                   metavar="SECONDS", help="abandon a run that takes longer than this")
    p.add_argument("--json", action="store_true",
                   help="print the whole result as JSON instead of text")
    return p


def _table(headers: Sequence[str], rows: List[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6f}" if v < 10 else f"{v:.1f}"
    return str(v)


def format_text(r: Result) -> str:
    """Upstream's three lines, then the memory check and per-thread tables."""
    whole, frac = divmod(round(r.seconds * 1e9), 10**9)
    lines = [
        f"Total guest execution time:\t{whole}.{frac:09d}s",
        f"Per-vcpu demand paging rate:\t{r.per_vcpu_rate:f} pgs/sec/vcpu",
        f"Overall demand paging rate:\t{r.paging_rate:f} pgs/sec",
        "",
    ]
    if r.verified:
        lines.append(f"Memory verified:\t{r.config.region_bytes // 4096} pages hold what they must")
    else:
        lines.append(f"MEMORY VERIFICATION FAILED:\t{r.bad_pages} bad pages; {r.verify_message}")
    lines += ["", "vCPUs:", _table(
        ["vcpu", "seconds", "pages", "pages/s", "exits", "userspace_exits"],
        [[v.index, v.seconds, v.pages, round(v.pages_per_s), v.exits, v.userspace_exits]
         for v in r.vcpus])]
    if r.readers:
        lines += ["", f"Readers ({r.config.wait}, {r.uffds} uffd(s) x {r.config.readers}):",
                  _table(["uffd", "reader", "faults", "wakeups", "spurious", "eexist",
                          "busy_s", "ctx_switches", "cpu_s"],
                         [[x.uffd, x.index, x.faults, x.wakeups, x.spurious_wakeups,
                           x.eexist, x.busy_seconds, x.context_switches, x.cpu_seconds]
                          for x in r.readers])]
        lines.append(f"Total faults resolved: {r.faults}, eexist: {r.eexist}, "
                     f"spurious wakeups: {r.spurious_wakeups}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:  # uffdkvm sweep ...: many runs, one table
        from .cli_sweep import main as sweep_main
        return sweep_main(argv[1:])
    args = build_parser().parse_args(argv)
    fields = vars(args)
    as_json = fields.pop("json")
    try:
        result = run(Config(**fields))
    except ConfigError as e:
        print(f"uffdkvm: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except HostUnsupportedError as e:
        print(f"uffdkvm: this host cannot run the experiment: {e}", file=sys.stderr)
        return EXIT_HOST
    except UffdkvmError as e:
        print(f"uffdkvm: the run failed: {e}", file=sys.stderr)
        return EXIT_RUN
    except KeyboardInterrupt:
        print("uffdkvm: interrupted", file=sys.stderr)
        return 130
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_text(result))
    return EXIT_OK if result.verified else EXIT_UNVERIFIED
