"""The command line: upstream demand_paging_test's flags, plus uffdkvm's own.

    uffdkvm -u MISSING -v 4 -b 256M -r 2 --wait poll
    uffdkvm -u MINOR -s shmem -o --json

Text output starts with upstream's three lines, so existing scripts that
parse them keep working, then adds the per-thread tables upstream never
printed.

One module per command: run.py is ``uffdkvm`` itself, whose parser holds
the others as argparse subcommands (sweep.py, serve.py, dirty_log.py,
migrate.py, kernel.py); _common.py has what they share (the run flags built
from the schema, the exit codes, the guard that maps exceptions to them).
Each command module has NAME, HELP, PARSER (its parser's description and
epilog), add_arguments(parser) and command(args, argv). Internal, but for
main() and the EXIT_* codes.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from . import dirty_log, kernel, migrate, run, serve, sweep
from ._common import (  # noqa: F401 - the exit codes, for callers of main()
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIP,
    EXIT_USAGE,
    CliError,
    guarded,
)
from .run import format_text, remote_line  # noqa: F401 - for callers of uffdkvm.cli

# uffdkvm NAME ...: each command's module, in the order --help lists them.
COMMANDS: dict[str, ModuleType] = {c.NAME: c for c in (sweep, serve, dirty_log, migrate, kernel)}


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser that keeps its values to itself. argparse copies
    a subparser's values into the namespace above, where the run command's
    defaults already are; this one hands them over as one value,
    ``command_args``, so that a command sees its own flags and no others."""

    def parse_known_args(  # type: ignore[override]
            self, args: Sequence[str] | None = None,
            namespace: None = None) -> tuple[argparse.Namespace, list[str]]:
        own, rest = super().parse_known_args(args, namespace)
        return argparse.Namespace(command_args=own), rest


def build_parser() -> argparse.ArgumentParser:
    """uffdkvm's parser: the run command's flags, and the other commands as
    its subcommands."""
    p = run.build_parser()
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Subcommand,
                           title="commands (uffdkvm COMMAND --help)")
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, **command.PARSER))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The ``uffdkvm`` command: returns its exit status (see EXIT_STATUS_HELP)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return guarded("uffdkvm", argv, lambda: _dispatch(build_parser(), argv))


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args = parser.parse_args(argv)
    name = args.command
    if name is None:
        del args.command
        return int(run.command(args, argv))
    _refuse_run_flags(parser, args, name)
    return int(COMMANDS[name].command(args.command_args, argv))


def _refuse_run_flags(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      name: str) -> None:
    """The run command's flags before a subcommand (``uffdkvm -v 2 sweep``)
    would be parsed into the run's namespace and dropped: refuse them,
    saying where they go. --debug is read from argv by guarded(), so it may
    stand anywhere."""
    given = [a for a in parser._actions  # argparse keeps no public list of them
             if a.option_strings and a.dest not in ("help", "debug", "command")
             and getattr(args, a.dest, a.default) != a.default]
    if given:
        flags = ", ".join(a.option_strings[0] for a in given)
        raise CliError(f"{flags} before '{name}' would be ignored: "
                       f"put {name}'s flags after it (uffdkvm {name} --help lists them)")
