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
from collections.abc import Sequence

from .config import BACKINGS, DELAY_DISTS, GUEST_PAGE_SIZES, PATTERNS, RESOLVES, WAITS, Config
from .errors import ConfigError, HostUnsupportedError, UffdkvmError
from .result import Result
from .run import run
from .support import backing_support

EXIT_OK = 0
EXIT_UNVERIFIED = 1
EXIT_CONFIG = 2
EXIT_HOST = 3
EXIT_RUN = 4


def _uffd_mode(value: str) -> str | None:
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
                   help=f"backing memory: {', '.join(BACKINGS)} (default {d.backing}); "
                   "see --list-backings")
    p.add_argument("-v", dest="vcpus", type=int, default=d.vcpus, metavar="N",
                   help="vCPUs (default 1)")
    p.add_argument("-o", dest="overlap", action="store_true",
                   help="every vCPU walks the same memory (implies -a)")
    p.add_argument("-c", dest="cpus", default=None, metavar="CPULIST",
                   help="pin vCPUs to host CPUs, e.g. 0,1 (round-robin); one more entry "
                   "than vCPUs pins this process's main thread too, as upstream does")
    p.add_argument("--wait", default=d.wait, type=str.lower, choices=WAITS, metavar="MODE",
                   help=f"how readers wait: {', '.join(WAITS)} (default {d.wait})")
    p.add_argument("--pin-readers", dest="pin_readers", default=None, metavar="CPULIST",
                   help="pin reader threads to host CPUs, round-robin")
    p.add_argument("--guest-page-size", dest="guest_page_size", default=d.guest_page_size,
                   type=str.upper, choices=tuple(GUEST_PAGE_SIZES), metavar="SIZE",
                   help="how the guest maps its memory: 4K, 2M or 1G (default 4K)")
    p.add_argument("--pattern", default=d.pattern, type=str.lower, choices=PATTERNS,
                   metavar="ORDER", help=f"page order: {', '.join(PATTERNS)}")
    p.add_argument("--seed", type=int, default=d.seed, help="seed for everything random")
    p.add_argument("--write-percent", dest="write_percent", type=int,
                   default=d.write_percent, metavar="PCT",
                   help="share of pages written; the rest are read (default 100)")
    p.add_argument("--passes", type=int, default=d.passes, metavar="N",
                   help="walks of the memory per vCPU; only the first faults")
    p.add_argument("--resolve", default=d.resolve, type=str.lower, choices=RESOLVES,
                   metavar="HOW", help="missing faults: copy (default) or zeropage")
    p.add_argument("--delay-dist", dest="delay_dist", default=d.delay_dist, type=str.lower,
                   choices=DELAY_DISTS, metavar="DIST",
                   help=f"distribution of -d: {', '.join(DELAY_DISTS)}")
    p.add_argument("--prefault", action="store_true",
                   help="populate all memory before the vCPUs start (no faults)")
    p.add_argument("--guest-work", dest="guest_work", type=int, default=d.guest_work,
                   metavar="N", help="guest busy-loop iterations after each page access "
                   "(4 instructions each; default 0)")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=d.timeout_s,
                   metavar="SECONDS", help="abandon a run that takes longer than this")
    p.add_argument("--stats", default=d.stats, type=str.lower, choices=("full", "basic"),
                   help="full (default): time every fault; basic: counters only")
    p.add_argument("--guest-timing", dest="guest_timing", action="store_true",
                   help="the guest stamps every access with rdtsc: each fault's queue, "
                   "service and resume stages")
    p.add_argument("--trace-faults", dest="trace_faults", action="store_true",
                   help="keep every fault in the result (with --json)")
    p.add_argument("--json", action="store_true",
                   help="print the whole result as JSON instead of text")
    p.add_argument("--list-backings", action="store_true",
                   help="say which backings and uffd modes this host runs, and why not")
    return p


def format_backing_support(support) -> str:
    lines = []
    for backing, modes in support.items():
        works = [str(m or "none") for m, why in modes.items() if why is None]
        lines.append(f"{backing}: " + (f"runs with uffd_mode {', '.join(works)}"
                                       if works else "cannot run here"))
        reasons = {}
        for mode, why in modes.items():
            if why is not None:
                reasons.setdefault(why, []).append(str(mode or "none"))
        for why, ms in reasons.items():
            lines.append(f"    not {', '.join(ms)}: {why}")
    return "\n".join(lines)


def _pins(args) -> None:
    """-c: upstream's vCPU list, plus optionally one CPU for the main thread."""
    cpus = args.pop("cpus")
    if cpus is None:
        return
    try:
        cpu_list = [int(x) for x in cpus.split(",")]
    except ValueError:
        raise ConfigError(f"pin_vcpus: -c {cpus!r} is not a list of CPU numbers like 0,1") \
            from None
    if len(cpu_list) == args["vcpus"] + 1:
        import os
        main_cpu = cpu_list.pop()
        try:
            os.sched_setaffinity(0, {main_cpu})
        except OSError as e:
            raise ConfigError(f"pin_vcpus: cannot pin the main thread to CPU {main_cpu} "
                              f"(the last entry of -c): {e.strerror}") from None
    args["pin_vcpus"] = cpu_list


def _table(headers: Sequence[str], rows: list[Sequence[object]]) -> str:
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
        how = (", and userfaultfd resolved each page once"
               if r.config.uffd_mode is not None and not r.config.prefault else "")
        lines.append(f"Memory verified:\t{r.config.region_bytes // 4096} pages hold what "
                     f"they must{how}")
    else:
        lines.append(f"MEMORY VERIFICATION FAILED:\t{r.bad_pages} bad pages; {r.verify_message}")
    timed = r.config.guest_timing and r.config.stats == "full"
    lines += ["", "vCPUs:", _table(
        ["vcpu", "seconds", "pages", "pages/s", "exits", "userspace_exits", "faults",
         "blocked_s", "service_p50_us", "service_p99_us"] +
        (["queue_p50_us", "queue_p99_us", "resume_p50_us", "resume_p99_us",
          "fault_p50_us", "fault_p99_us", "access_p50_us", "access_p99_us"] if timed else []),
        [[v.index, v.seconds, v.pages, round(v.all_passes_pages_per_s), v.exits, v.userspace_exits,
          v.faults, v.blocked_seconds, _us(v.service_latency, 50),
          _us(v.service_latency, 99)] +
         ([_us(v.queue_latency, 50), _us(v.queue_latency, 99), _us(v.resume_latency, 50),
           _us(v.resume_latency, 99), _us(v.fault_latency, 50), _us(v.fault_latency, 99),
           _us(v.access_latency, 50), _us(v.access_latency, 99)] if timed else [])
         for v in r.vcpus])]
    if r.readers:
        lines += ["", f"Readers ({r.config.wait}, {r.uffds} uffd(s) x {r.config.readers}):",
                  _table(["uffd", "reader", "faults", "wakeups", "spurious", "eexist",
                          "busy_s", "ctx_switches", "cpu_s", "service_p50_us",
                          "service_p99_us", "service_max_us"] +
                         (["queue_p50_us", "queue_p99_us"] if timed else []),
                         [[x.uffd, x.index, x.faults, x.wakeups, x.spurious_wakeups,
                           x.eexist, x.busy_seconds, x.context_switches, x.cpu_seconds,
                           _us(x.service_latency, 50), _us(x.service_latency, 99),
                           _us(x.service_latency, 100)] +
                          ([_us(x.queue_latency, 50), _us(x.queue_latency, 99)] if timed else [])
                          for x in r.readers])]
        lines.append(f"Total faults resolved: {r.faults}, eexist: {r.eexist}, "
                     f"spurious wakeups: {r.spurious_wakeups}")
    if r.blocktime_seconds is not None:
        lines.append(f"Blocktime (every vCPU blocked at once): {r.blocktime_seconds:.6f}s")
    if r.config.stats == "full" and r.config.uffd_mode is not None:
        lines += ["", "Service = a reader's read() of the fault message to its resolving ioctl "
                      "returning (delay included)" +
                      ("; a vCPU's ends at its resume if that came first." if timed else ".")]
        lines.append("Queue = the guest raising the fault to that read; resume = the ioctl to "
                     "the guest's access completing; fault = the whole stall." if timed else
                     "The wait before the read (queue) and the vCPU's return after it (resume) "
                     "need --guest-timing.")
    return "\n".join(lines)


def _us(h, q):
    """Percentile q of a nanosecond histogram, in microseconds (None if none)."""
    if h is None or not h.count:
        return None
    return f"{h.percentile(q) / 1000:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:  # uffdkvm sweep ...: many runs, one table
        from .cli_sweep import main as sweep_main
        return sweep_main(argv[1:])
    args = build_parser().parse_args(argv)
    fields = vars(args)
    as_json = fields.pop("json")
    if fields.pop("list_backings"):
        print(format_backing_support(backing_support()))
        return EXIT_OK
    try:
        _pins(fields)
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
