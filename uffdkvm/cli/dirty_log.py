"""``uffdkvm dirty-log``: dirty-page tracking, with the flags and the lines
of the kernel's KVM selftest dirty_log_perf_test.

    uffdkvm dirty-log -v 2 -b 64M -i 3          # KVM_CLEAR_DIRTY_LOG, upstream's default
    uffdkvm dirty-log -g                        # KVM_GET_DIRTY_LOG clears as it reads
    uffdkvm dirty-log --tracking ring --dirty-ring-entries 1024
    uffdkvm dirty-log --tracking wp_async --json

Pass 1 populates the memory ("Populate memory time"), tracking is then
enabled, and each of the -i iterations is a dirtying pass, then a harvest
and a re-protect with every vCPU held at the boundary; so -i N is
``run(passes=N + 1, dirty_tracking=...)``. The text starts with upstream's
lines, in its words, order and number format (seconds.nanoseconds), so
scripts that parse upstream's output read this one; after them come the
memory check and a table of the tracked passes (what each harvest found,
what the guest wrote, the excess, the ring's full exits).

The flags keep upstream's meaning, which is not always that of the same
letter in ``uffdkvm`` (demand_paging_test's flags): here -a is random
access (upstream's; one uffd is ``--single-uffd``), -r the seed (readers
are ``--readers``) and -u defaults to NONE (dirty_log_perf_test has no
userfaultfd: its vCPUs fault the memory in themselves). Upstream flags
uffdkvm has no counterpart for (-e, -n, -p, -x but 1) are refused, naming
why. :data:`LINES` holds one regex per upstream line: the output is
checked against them (tests/cli/test_dirty_log.py, also against upstream's own
binary where it is built) and benchmarks/vs_dirty_log_perf.py parses both
tools' output with them.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import PIN_SCHEDULER, Config, parse_size
from ..io import tables
from ..result import Result
from ..run import run
from ..schema import fields as schema
from ..support import backing_support, fault_path_support
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    GUEST_MODE,
    GUEST_MODES,
    add_field_argument,
    add_run_arguments,
    alone,
    as_is,
    console_progress,
    format_backing_support,
    format_fault_path_support,
    guarded,
    pin_main_thread,
    pop_cli_options,
    split_pins,
    uffd_mode,
)

NAME = "dirty-log"
PROG = f"uffdkvm {NAME}"
HELP = "track the pages a guest dirties: dirty_log_perf_test's flags and lines"
# Config.dirty_tracking's values (the schema's): KVM_GET_DIRTY_LOG alone
# (upstream's -g), with KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 and KVM_CLEAR_DIRTY_LOG
# (upstream's default), the dirty ring, userfaultfd WP_ASYNC with PAGEMAP_SCAN.
DEFAULT_TRACKER = "bitmap_manual"
DEFAULT_ITERATIONS = 2  # upstream's TEST_HOST_LOOP_N
MIN_ITERATIONS = 2      # upstream asserts "The test should have at least two iterations"

# Upstream's lines (dirty_log_perf_test.c's pr_info calls), one regex each:
# what format_text prints, what the tests hold both tools' output to, and
# what benchmarks/vs_dirty_log_perf.py reads times from. A time is
# upstream's "%ld.%.9lds".
_T = r"(\d+\.\d{9})s"
LINES: dict[str, re.Pattern[str]] = {
    "iterations": re.compile(r"Test iterations: (\d+)"),
    "mode": re.compile(r"Testing guest mode: (.+)"),
    "populate": re.compile(rf"Populate memory time: {_T}"),
    "enable": re.compile(rf"Enabling dirty logging time: {_T}"),
    "dirty": re.compile(rf"Iteration (\d+) dirty memory time: {_T}"),
    "get": re.compile(rf"Iteration (\d+) get dirty log time: {_T}"),
    "clear": re.compile(rf"Iteration (\d+) clear dirty log time: {_T}"),
    "disable": re.compile(rf"Disabling dirty logging time: {_T}"),
    "get_total": re.compile(
        rf"Get dirty log over (\d+) iterations took {_T}\. \(Avg {_T}/iteration\)"),
    "clear_total": re.compile(
        rf"Clear dirty log over (\d+) iterations took {_T}\. \(Avg {_T}/iteration\)"),
}


def line_kinds(text: str) -> list[str]:
    """The LINES each line of text matches, in order (lines matching none,
    such as upstream's "Random seed" or uffdkvm's tables, left out)."""
    kinds = []
    for line in text.splitlines():
        kinds += [k for k, rx in LINES.items() if rx.fullmatch(line)]
    return kinds


def expected_kinds(iterations: int, manual: bool) -> list[str]:
    """The order upstream prints its lines in: ``manual`` is its default
    (KVM_CLEAR_DIRTY_LOG, the clear lines); -g prints no clear line."""
    per = ["dirty", "get"] + (["clear"] if manual else [])
    return (["iterations", "mode", "populate", "enable"] + per * iterations +
            ["disable", "get_total"] + (["clear_total"] if manual else []))


@dataclass
class Parsed:
    """The times of upstream's lines in one output (seconds; None, or empty,
    where the output has no such line)."""

    iterations: int | None = None
    populate_s: float | None = None
    enable_s: float | None = None
    disable_s: float | None = None
    dirty_s: list[float] = field(default_factory=list)
    get_s: list[float] = field(default_factory=list)
    clear_s: list[float] = field(default_factory=list)
    get_total_s: float | None = None
    clear_total_s: float | None = None


def parse(text: str) -> Parsed:
    """Upstream's lines out of text, either tool's. An iteration line out of
    order (iteration N where N - 1 were seen) is a ValueError: the parse
    never pairs a time with the wrong iteration."""
    p = Parsed()
    for line in text.splitlines():
        for kind, rx in LINES.items():
            m = rx.fullmatch(line)
            if m is None:
                continue
            if kind == "iterations":
                p.iterations = int(m[1])
            elif kind in ("populate", "enable", "disable"):
                setattr(p, f"{kind}_s", float(m[1]))
            elif kind in ("dirty", "get", "clear"):
                seen: list[float] = getattr(p, f"{kind}_s")
                if int(m[1]) != len(seen) + 1:
                    raise ValueError(f"{line!r}: iteration {m[1]} after {len(seen)}")
                seen.append(float(m[2]))
            elif kind in ("get_total", "clear_total"):
                setattr(p, f"{kind}_s", float(m[2]))
    return p


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _time(ns: int) -> str:
    """Upstream's "%ld.%.9lds" of a timespec."""
    whole, frac = divmod(ns, 10**9)
    return f"{whole}.{frac:09d}s"


def upstream_lines(r: Result) -> list[str]:
    """dirty_log_perf_test's lines for a tracked run, in its order and words:
    the harvest (a get, a ring collect, a PAGEMAP_SCAN) is its "get dirty
    log time", the re-protect its "clear dirty log time", printed only for
    bitmap_manual as upstream prints it only with manual protect."""
    manual = r.config.dirty_tracking == "bitmap_manual"
    passes = r.dirty_passes
    lines = [f"Test iterations: {len(passes)}",
             f"Testing guest mode: {GUEST_MODES[GUEST_MODE]}",
             f"Populate memory time: {_time(_ns(r.pass_seconds[0]))}",
             f"Enabling dirty logging time: {_time(_ns(r.dirty_enable_seconds or 0.0))}",
             ""]
    get_ns = clear_ns = 0
    for p in passes:
        lines.append(f"Iteration {p.iteration} dirty memory time: {_time(_ns(p.dirty_seconds))}")
        get_ns += _ns(p.harvest_seconds)
        lines.append(f"Iteration {p.iteration} get dirty log time: "
                     f"{_time(_ns(p.harvest_seconds))}")
        if manual:
            clear_ns += _ns(p.reprotect_seconds)
            lines.append(f"Iteration {p.iteration} clear dirty log time: "
                         f"{_time(_ns(p.reprotect_seconds))}")
    lines.append(f"Disabling dirty logging time: {_time(_ns(r.dirty_disable_seconds or 0.0))}")
    n = max(len(passes), 1)  # upstream's timespec_div: nanoseconds, integer division
    lines.append(f"Get dirty log over {len(passes)} iterations took {_time(get_ns)}. "
                 f"(Avg {_time(get_ns // n)}/iteration)")
    if manual:
        lines.append(f"Clear dirty log over {len(passes)} iterations took {_time(clear_ns)}. "
                     f"(Avg {_time(clear_ns // n)}/iteration)")
    return lines


# What each tracker's harvest and re-protect are, for the table's title and note.
_HOW = {
    "bitmap": ("KVM_GET_DIRTY_LOG, which re-protects as it reads", "none (the get)"),
    "bitmap_manual": ("KVM_GET_DIRTY_LOG", "KVM_CLEAR_DIRTY_LOG"),
    "ring": ("the vCPUs' dirty rings collected", "KVM_RESET_DIRTY_RINGS"),
    "wp_async": ("PAGEMAP_SCAN", "none (the scan write-protects what it reports)"),
}


def _tracking_title(r: Result) -> str:
    c = r.config
    what = c.dirty_tracking
    if what == "bitmap_manual":
        what += (", cleared in one call per iteration" if not c.dirty_clear_pages else
                 f", cleared {c.dirty_clear_pages} pages a call")
    elif what == "ring":
        what += f", {c.dirty_ring_entries} entries per vCPU"
    return f"Tracked passes ({what}):"


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.9f}"
    return str(v)


def format_text(r: Result) -> str:
    """Upstream's lines, the memory check, then a row per tracked pass."""
    lines = upstream_lines(r)
    pages = r.config.region_bytes // 4096
    written = sum(p.written_pages for p in r.dirty_passes)
    lines.append("")
    # A harvest that misses a page the guest wrote fails the run (RunError):
    # a result is one whose every harvest held every page written.
    if r.verified:
        lines.append(f"Memory verified:\t{pages} pages hold what they must, and every "
                     f"iteration's harvest found the pages written in it ({written} in all)")
    else:
        lines.append(f"MEMORY VERIFICATION FAILED:\t{r.bad_pages} bad pages; {r.verify_message}")
    harvest, reprotect = _HOW[str(r.config.dirty_tracking)]
    lines += ["", _tracking_title(r), *tables.aligned(
        ["iteration", "dirty_s", "harvest_s", "reprotect_s", "found", "written", "excess",
         "ring_full_exits"],
        [[p.iteration, p.dirty_seconds, p.harvest_seconds, p.reprotect_seconds, p.found_pages,
          p.written_pages, p.excess_pages, p.ring_full_exits] for p in r.dirty_passes],
        cell=_cell)]
    lines += ["", f"dirty = the vCPUs let go to the last one ending its pass; harvest = "
              f"{harvest}; reprotect = {reprotect}; excess = found, not written in the pass."]
    return "\n".join(lines)


# ---- the flags ----

class _Refuse(argparse.Action):
    """An upstream flag with no counterpart here: a usage error naming why."""

    def __init__(self, option_strings: Sequence[str], dest: str, why: str = "",
                 **kwargs: Any) -> None:
        self.why = why
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, self.why)


def _iterations(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of iterations") from None
    if n < MIN_ITERATIONS:
        raise argparse.ArgumentTypeError(
            f"{n}: at least {MIN_ITERATIONS} iterations, as upstream's dirty_log_perf_test "
            "requires; uffdkvm.run(dirty_tracking=..., passes=2) runs one")
    return n


def _slots(value: str) -> int:
    if value.strip() != "1":
        raise argparse.ArgumentTypeError(
            f"{value!r}: uffdkvm keeps the test memory in one memslot (upstream's default, "
            "-x 1); splitting it is not supported")
    return 1


def _not_used(value: str) -> None:
    raise argparse.ArgumentTypeError(
        f"{value!r}: uffdkvm places the test memory itself (and upstream's "
        "dirty_log_perf_test parses -p but never uses it)")


# "resolve": the flags added after add_run_arguments take their letters
# from the run command's (-a, -r, -u), as upstream's letters mean here.
PARSER: dict[str, Any] = dict(
    conflict_handler="resolve",
    description="Track the pages a KVM guest dirties: dirty_log_perf_test's "
    "experiment and flags, its lines first, then uffdkvm's table of every tracked "
    "pass. Pass 1 populates memory, dirty tracking is enabled, then each of -i "
    "iterations dirties memory, harvests the dirty pages and re-protects them.",
    epilog="Upstream's letters keep upstream's meaning here: -a is random access (one "
    "userfaultfd is --single-uffd), -r the seed (readers per uffd are --readers), and "
    "-u defaults to NONE, as dirty_log_perf_test has no userfaultfd. -o: every vCPU "
    "walks all the memory, vcpus x -b, as upstream's. Upstream's -e, -n, -p and -x "
    "(but -x 1) are refused. " + EXIT_STATUS_HELP)


def build_parser() -> argparse.ArgumentParser:
    return alone(PROG, PARSER, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p, as_is, "print the whole result as one line of JSON "
                      "(Result.to_json(): Result.dirty_passes, one per iteration) instead "
                      "of text")
    d = Config()
    _add_upstream_arguments(p.add_argument_group("dirty_log_perf_test's flags"), d)
    _add_own_arguments(p.add_argument_group("uffdkvm's own"), d)


def _add_upstream_arguments(up: argparse._ArgumentGroup, d: Config) -> None:
    """dirty_log_perf_test's letters, with upstream's meaning."""
    track = up.add_mutually_exclusive_group()
    track.add_argument("-g", dest="tracking", action="store_const", const="bitmap",
                       help="KVM_GET_DIRTY_LOG alone, which clears as it reads (no "
                       "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2): --tracking bitmap")
    add_field_argument(track, "dirty-log", "dirty_tracking", default=None, dest="tracking",
                       shown=DEFAULT_TRACKER)
    up.add_argument("-i", dest="iterations", type=_iterations, default=DEFAULT_ITERATIONS,
                    metavar="N", help="tracked iterations, each a dirtying pass, a harvest "
                    f"and a re-protect (default {DEFAULT_ITERATIONS}, at least "
                    f"{MIN_ITERATIONS} as upstream); the run has N + 1 passes")
    up.add_argument("-o", dest="overlap", action="store_true",
                    help="every vCPU walks all the memory (-v x -b bytes) instead of its own "
                    "-b, as upstream's -o")
    up.add_argument("-a", dest="pattern", action="store_const", const="random",
                    default=d.pattern,
                    help="access memory in random order (--pattern random: a seeded "
                    "permutation, every page once a pass; upstream draws pages with "
                    "replacement)")
    up.add_argument("-r", "--seed", dest="seed", type=int, default=d.seed, metavar="SEED",
                    help="the seed of everything random (upstream's random seed)")
    up.add_argument("-w", "--write-percent", dest="write_percent", type=int,
                    default=d.write_percent, metavar="PCT",
                    help="share of pages written in each pass, the rest read (default "
                    f"{d.write_percent}); "
                    "each pass writes a subset of its own (--write-set per_pass), as "
                    "upstream draws each access; uffdkvm's populating pass writes the same "
                    "share, upstream's writes every page")
    up.add_argument("-x", dest="slots", type=_slots, default=1, metavar="SLOTS",
                    help="memslots: 1 only (the test memory is one memslot)")
    up.add_argument("-p", dest="phys_offset", type=_not_used, default=None, metavar="OFFSET",
                    help="refused: uffdkvm places the test memory itself")
    up.add_argument("-e", action=_Refuse, nargs=0, default=None, dest="evil",
                    why="running the vCPUs while dirty logging is disabled is not supported: "
                    "uffdkvm disables it after the last pass, the vCPUs done",
                    help="refused: logging is disabled after the vCPUs are done")
    up.add_argument("-n", action=_Refuse, nargs=0, default=None, dest="nested",
                    why="nested (L2) vCPUs are not supported: uffdkvm's guest runs in L1",
                    help="refused: the guest runs in L1")


def _add_own_arguments(own: argparse._ArgumentGroup, d: Config) -> None:
    """uffdkvm's flags, beside upstream's (and the run's it takes a letter from)."""
    own.add_argument("-u", dest="uffd_mode", type=uffd_mode, default=None, metavar="MODE",
                     help="userfaultfd for the populating pass: NONE (the default: the vCPUs "
                     "fault memory in, as upstream's do), MISSING, MINOR or WP")
    # The tracker's and the write set's flags, from the schema entries that
    # name this command (Field.cli); one not given is Config's default, but
    # the write set's (per_pass here) and the tracker's (-g or --tracking).
    for f in schema.CONFIG_FIELDS:
        if "dirty-log" in f.cli and f.name != "dirty_tracking":
            add_field_argument(own, "dirty-log", f.name,
                               default="per_pass" if f.name == "write_set" else None)
    own.add_argument("--single-uffd", dest="single_uffd", action="store_true",
                     help="with -u: one userfaultfd for all memory (uffdkvm's -a)")
    own.add_argument("--readers", dest="readers", type=int, default=d.readers,
                     metavar="N", help="with -u: reader threads per userfaultfd (uffdkvm's -r)")
    own.add_argument("--passes", action=_Refuse, nargs=1, default=None, dest="passes",
                     why="the passes are -i iterations plus the populating one: give -i",
                     help="refused: give -i (the run has -i + 1 passes)")
    own.add_argument("--wp-async", action=_Refuse, nargs=0, default=None, dest="wp_async",
                     why="give --tracking wp_async", help="refused: --tracking wp_async")



def fields_of(args: argparse.Namespace) -> tuple[dict[str, Any], int | None]:
    """The parsed flags as Config fields, and the main thread's CPU (-c's
    extra entry) or None. Makes no Config: that checks the values."""
    fields = vars(args).copy()
    pop_cli_options(fields)
    for flag in ("json", "quiet", "list_backings", "slots", "phys_offset", "evil", "nested",
                 "passes", "wp_async"):
        fields.pop(flag, None)
    fields["dirty_tracking"] = fields.pop("tracking") or DEFAULT_TRACKER
    fields["passes"] = fields.pop("iterations") + 1
    for name in ("dirty_clear_pages", "dirty_ring_entries"):
        if fields[name] is None:  # not given: Config's default
            del fields[name]
    if fields["overlap"]:
        # Upstream's -o: every vCPU walks all of the vcpus x -b bytes; uffdkvm's
        # overlap walks mem_per_vcpu.
        fields["mem_per_vcpu"] = fields["vcpus"] * parse_size(fields["mem_per_vcpu"],
                                                              "mem_per_vcpu")
    cpus = fields.pop("cpus")
    main_cpu = None
    if cpus is not None:
        fields["pin_vcpus"], main_cpu = split_pins(cpus, fields["vcpus"])
    if main_cpu is not None and fields["pin_readers"] is None and \
            fields["resolver"] == "readers":
        fields["pin_readers"] = PIN_SCHEDULER  # the readers inherit the main thread's CPU
    return fields, main_cpu


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm dirty-log`` once its flags are parsed: returns its exit status
    (EXIT_STATUS_HELP)."""
    return guarded(PROG, argv, lambda: _run_command(args))


def _run_command(args: argparse.Namespace) -> int:
    if args.list_backings:
        print(format_backing_support(backing_support()))
        print(format_fault_path_support(fault_path_support()))
        return EXIT_OK
    fields, main_cpu = fields_of(args)
    config = Config(**fields)  # ConfigError for a bad value, before anything is pinned
    if main_cpu is not None:
        pin_main_thread(main_cpu)
    result = run(config, progress=console_progress(args.quiet))
    print(result.to_json() if args.json else format_text(result))
    return EXIT_OK if result.verified else EXIT_FAILED
