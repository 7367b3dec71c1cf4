"""``uffdkvm migrate``: a whole live migration (uffdkvm.migrate), from the
command line.

    uffdkvm migrate --mode precopy -v 2 -b 64M --write-percent 20
    uffdkvm migrate --mode postcopy --link-bandwidth-mbps 10000 --link-latency-us 50
    uffdkvm migrate --mode hybrid --precopy-rounds 2 --json

The workload's flags are the run command's (``uffdkvm --help``: -v, -b,
--write-percent, --passes for the destination's walk, the readers and their
wait for its faults, ...); the flags below set the link, the rounds and the
tracker. The text gives the rounds, one line each, then the switch-over and
the totals; --json prints MigrationResult.to_json(). The exit status is
uffdkvm's: 0 when the migration verified, 1 when it did not.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ..config import PAGE_SIZE
from ..io import tables
from ..migration.migrate import DEFAULT_TRACKER, KNOBS, MODES, MigrationResult, migrate
from ..schema import fields as schema
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    add_field_argument,
    add_run_arguments,
    alone,
    as_is,
    choice,
    guarded,
    pop_cli_options,
)

NAME = "migrate"
PROG = f"uffdkvm {NAME}"
HELP = "migrate a running guest live (pre-copy, post-copy or hybrid)"
PARSER: dict[str, Any] = dict(
    description="Migrate a running guest live: a source VM whose guest keeps writing while "
    "its memory crosses a modelled link, then a destination VM that runs on from it "
    "(docs/migration.md).", epilog=EXIT_STATUS_HELP)
DEFAULT_MEM = "64M"
PREFETCHES = schema.choices("prefetch")



def build_parser() -> argparse.ArgumentParser:
    return alone(PROG, PARSER, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p, as_is, "print the whole migration as one line of JSON "
                      "(MigrationResult.to_json()) instead of text")
    p.set_defaults(mem_per_vcpu=DEFAULT_MEM)
    m = p.add_argument_group("migration")
    m.add_argument("--mode", type=choice(MODES), default="precopy",
                   help="precopy (rounds, then stop-and-copy; the default), postcopy (stop "
                   "at once, the destination faults in the rest) or hybrid (--precopy-rounds "
                   "rounds, then post-copy)")
    # The knobs' flags, from the schema entries that name this command
    # (Field.cli); a knob not given is migrate()'s default, as in the Python
    # API: the schema's, but the tracker's.
    for f in schema.CONFIG_FIELDS:
        if "migrate" in f.cli:
            add_field_argument(m, "migrate", f.name,
                               default=DEFAULT_TRACKER if f.name == "dirty_tracking" else None)
    m.add_argument("--postcopy-prefetch", dest="postcopy_prefetch", type=choice(PREFETCHES),
                   default="background", help="the destination's prefetch for what it does "
                   "not hold (default %(default)s: stream it behind the faults)")


def format_text(m: MigrationResult) -> str:
    c = m.config
    lines = [f"Migration: {m.mode}, {c.vcpus} vCPU(s) x {c.mem_per_vcpu >> 20} MiB, link "
             f"{c.link_bandwidth_mbps or 'unlimited'} Mbit/s, {c.link_latency_us} us, "
             f"tracking {c.dirty_tracking}"]
    if m.rounds:
        rows = [(r.round, r.sent_pages, r.dirty_pages, f"{r.seconds:.6f}",
                 f"{r.dirty_rate * PAGE_SIZE / 1e6:.1f}", r.throttle_percent)
                for r in m.rounds]
        lines += tables.aligned(("round", "sent_pages", "dirty_pages", "seconds",
                                 "dirty_MBps", "throttle_percent"), rows)
    lines += [
        f"Converged: {'yes' if m.converged else 'no'}",
        f"Downtime: {m.downtime_seconds:.6f}s (stop-and-copy {m.stopcopy_bytes >> 10} KiB)",
        f"Total time: {m.total_seconds:.6f}s",
        f"Bytes: precopy {m.precopy_bytes}, stopcopy {m.stopcopy_bytes}, "
        f"postcopy {m.postcopy_bytes}",
        f"Post-copy faults: {m.postcopy_faults}",
        f"Verified: {'yes' if m.verified else 'NO'}",
    ]
    if not m.verified:
        why = m.source.verify_message or m.destination.verify_message
        if why:
            lines.append(f"  {why}")
    return "\n".join(lines)


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm migrate`` once its flags are parsed: returns its exit status."""
    return guarded(PROG, argv, lambda: _run_command(vars(args)))


def _run_command(fields: dict[str, Any]) -> int:
    pop_cli_options(fields)
    as_json = fields.pop("json")
    fields.pop("quiet")
    fields.pop("list_backings")
    if fields.pop("cpus") is not None:
        raise SystemExit(f"{PROG}: -c pins one run's threads; use --pin-vcpus")
    mode, prefetch = fields.pop("mode"), fields.pop("postcopy_prefetch")
    # A knob's flag left unset: migrate()'s default (the schema's), not None.
    fields = {k: v for k, v in fields.items() if v is not None or k not in KNOBS}
    m = migrate(mode=mode, postcopy_prefetch=prefetch, **fields)
    print(m.to_json() if as_json else format_text(m))
    return EXIT_OK if m.verified else EXIT_FAILED
