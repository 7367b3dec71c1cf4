"""``uffdkvm serve``: a page server for runs on this host or another one.

    uffdkvm serve snap.img --listen tcp:10.0.0.1:4000 --key-file ~/.uffdkvm.key --new-key
    ready tcp:10.0.0.1:4000

serves snap.img's bytes to runs with ``source="remote"`` and
``source_address="tcp:10.0.0.1:4000"``, ``source_key_file`` a copy of the key
(the same 0600 file on the other host). It runs in the foreground until
SIGTERM or Ctrl-C, prints "ready ADDRESS" once it listens (port 0: the port
the kernel chose), logs every refused connection on stderr, and on the way
out prints its counters there.

Every TCP server requires ``--key-file``: a file of 64 hex digits (32 random
bytes), mode 0600, of this user's; ``--new-key`` writes a fresh one at that
path first (and refuses to overwrite a file). A Unix socket may go without a
key: then only this user and root may connect (SO_PEERCRED). The link is
not encrypted (docs/robustness.md: tunnel it between hosts).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..pages.server import serve, write_key
from ._common import EXIT_OK, CliError, alone, guarded

NAME = "serve"
PROG = f"uffdkvm {NAME}"
HELP = "serve a snapshot's pages to runs here or on another host"
PARSER: dict[str, Any] = dict(
    description="Serve a snapshot's bytes to runs with source='remote' and "
                "source_address (and source_key_file) set, on this host or another.")


def build_parser() -> argparse.ArgumentParser:
    return alone(PROG, PARSER, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT", help="the file to serve "
                   "(uffdkvm.make_snapshot writes one; keep it mode 0600: it is guest memory)")
    p.add_argument("--listen", required=True, metavar="ADDRESS",
                   help="unix:/path/to/socket or tcp:HOST:PORT (PORT 0: any free one); "
                        "a TCP address needs --key-file")
    p.add_argument("--key-file", metavar="PATH", help="the key every client must prove it "
                   "holds: 64 to 128 hex digits, mode 0600 (chmod 600 PATH)")
    p.add_argument("--new-key", action="store_true", help="write a fresh random key at "
                   "--key-file first (refused if the file exists)")
    p.add_argument("--latency-us", type=int, default=0, metavar="N",
                   help="the model's time from taking up a request to its reply")
    p.add_argument("--bandwidth-mbps", type=int, default=0, metavar="N",
                   help="the model's one link, megabits per second (0: unlimited)")
    p.add_argument("--max-inflight", type=int, default=0, metavar="N",
                   help="requests served at once (0: no cap)")


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm serve`` once its flags are parsed: returns its exit status."""
    return guarded(PROG, argv, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.snapshot):
        raise ConfigError(f"snapshot {args.snapshot}: no such file; give the snapshot to serve "
                          "(uffdkvm.make_snapshot writes one)", field="snapshot_path")
    if args.new_key:
        if args.key_file is None:
            raise CliError("--new-key writes the key at --key-file PATH: give the path")
        try:
            write_key(args.key_file)
        except FileExistsError:
            raise CliError(f"--new-key: {args.key_file} exists; it is not overwritten: use it "
                           "(leave out --new-key), or give a new path") from None
        except OSError as e:
            raise CliError(f"--new-key: {args.key_file}: {e.strerror}") from None
        print(f"uffdkvm serve: a new key in {args.key_file} (copy it, mode 0600, to every "
              "client)", file=sys.stderr)
    sys.stdout.flush()
    stats = serve(args.snapshot, args.listen, key_file=args.key_file,
                  latency_us=args.latency_us, bandwidth_mbps=args.bandwidth_mbps,
                  max_inflight=args.max_inflight, ready_fd=sys.stdout.fileno(), stop_fd=-1)
    print(f"uffdkvm serve: stopped: {stats.served} replies ({stats.bytes} bytes) to "
          f"{stats.connections} connections, {stats.refused} refused", file=sys.stderr)
    return EXIT_OK
