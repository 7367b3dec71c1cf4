"""The page server process's body: ``python -m uffdkvm.serve_pages``.

:class:`uffdkvm.pageserver.PageServer` starts it. A module of its own, which
the package never imports, so that running it does not run a module the
package has imported already.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m uffdkvm.serve_pages",
        description="Serve a snapshot file's bytes to uffdkvm's readers (csrc/remote/protocol.h). "
                    "Prints 'ready ADDRESS' once listening; stops on SIGTERM, SIGINT or when "
                    "stdin closes.")
    parser.add_argument("--snapshot", required=True, help="the file to serve")
    parser.add_argument("--listen", required=True,
                        help="unix:/path or tcp:HOST:PORT (port 0: any free one)")
    parser.add_argument("--latency-us", type=int, default=0)
    parser.add_argument("--bandwidth-mbps", type=int, default=0,
                        help="megabits per second, 0 = unlimited")
    parser.add_argument("--max-inflight", type=int, default=0, help="0 = no cap")
    parser.add_argument("--remove-dir", help="a directory to remove on exit (the socket's)")
    args = parser.parse_args(argv)
    from . import _core

    try:
        # The core checks the limits (ukvm_pageserver_check), naming the field.
        _core.pageserver_serve(args.snapshot, args.listen, args.latency_us * 1000,
                               args.bandwidth_mbps, args.max_inflight, sys.stdout.fileno(),
                               sys.stdin.fileno())
    except _core.CoreError as e:
        message = e.args[2]
        print(f"uffdkvm.serve_pages: {message}", file=sys.stderr)
        return 1
    finally:
        if args.remove_dir:
            with contextlib.suppress(OSError):
                os.rmdir(args.remove_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
