"""The command line: upstream demand_paging_test's flags, plus uffdkvm's own.

    uffdkvm -u MISSING -v 4 -b 256M -r 2 --wait poll
    uffdkvm -u MINOR -s shmem -o --json

Text output starts with upstream's three lines, so existing scripts that
parse them keep working, then adds the per-thread tables upstream never
printed.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from . import cli_dirty, cli_kernel, cli_migrate, cli_serve, cli_sweep
from .cli_common import (  # noqa: F401 - the exit codes, for callers of main()
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIP,
    EXIT_USAGE,
    guarded,
)
from .cli_run import (  # noqa: F401 - the run command, for callers of uffdkvm.cli
    _run_command,
    build_parser,
    format_text,
    remote_line,
)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``uffdkvm`` command: returns its exit status (see EXIT_STATUS_HELP)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:  # uffdkvm sweep ...: many runs, one table
        return cli_sweep.main(argv[1:])
    if argv[:1] == ["serve"]:  # uffdkvm serve SNAPSHOT --listen ...: a page server
        return cli_serve.main(argv[1:])
    if argv[:1] == ["dirty-log"]:  # uffdkvm dirty-log -i 3 ...: dirty_log_perf_test's
        return cli_dirty.main(argv[1:])
    if argv[:1] == ["migrate"]:  # uffdkvm migrate --mode precopy ...: a live migration
        return cli_migrate.main(argv[1:])
    if argv[:1] == ["kernel"]:  # uffdkvm kernel run 6.18 ...: in another kernel, under QEMU
        return cli_kernel.main(argv[1:])
    return guarded("uffdkvm", argv, lambda: _run_command(argv))


