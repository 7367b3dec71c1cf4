"""The page server process's body: ``python -m uffdkvm.pages.process``.

:class:`uffdkvm.pages.server.PageServer` starts it; ``uffdkvm serve`` is the
same server as a user command (uffdkvm/cli/serve.py). A module of its own,
which the package never imports, so that running it does not run a module
the package has imported already.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m uffdkvm.pages.process",
        description="Serve a snapshot file's bytes to uffdkvm's readers (csrc/remote/protocol.h). "
                    "Prints 'ready ADDRESS' once listening; stops on SIGTERM, SIGINT or when "
                    "stdin closes.")
    parser.add_argument("--snapshot", required=True, help="the file to serve")
    parser.add_argument("--listen", required=True,
                        help="unix:/path or tcp:HOST:PORT (port 0: any free one)")
    parser.add_argument("--key-file", help="the key every client must prove it holds "
                        "(required for TCP)")
    parser.add_argument("--latency-us", type=int, default=0)
    parser.add_argument("--bandwidth-mbps", type=int, default=0,
                        help="megabits per second, 0 = unlimited")
    parser.add_argument("--max-inflight", type=int, default=0, help="0 = no cap")
    parser.add_argument("--handshake-timeout-s", type=float, default=0.0,
                        help="a new connection's handshake at most (0: 5 s)")
    parser.add_argument("--remove-dir", help="a directory to remove on exit (the socket's and "
                        "the key's: the key file in it is removed first)")
    args = parser.parse_args(argv)
    from ..errors import UffdkvmError
    from .server import serve

    try:
        serve(args.snapshot, args.listen, key_file=args.key_file, latency_us=args.latency_us,
              bandwidth_mbps=args.bandwidth_mbps, max_inflight=args.max_inflight,
              ready_fd=sys.stdout.fileno(), stop_fd=sys.stdin.fileno(),
              handshake_timeout_s=args.handshake_timeout_s)
    except UffdkvmError as e:
        print(f"uffdkvm.pages.process: {e}", file=sys.stderr)
        return 1
    finally:
        if args.remove_dir:
            if args.key_file and os.path.dirname(os.path.abspath(args.key_file)) == \
                    os.path.abspath(args.remove_dir):
                with contextlib.suppress(OSError):
                    os.unlink(args.key_file)
            with contextlib.suppress(OSError):
                os.rmdir(args.remove_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
