"""The worker inside a Guest: runs the calls the host leaves in its directory.

    python -c START DIR IMPORT_PATH_JSON

DIR is the guest's job directory, shared with the host (9p). The host
writes each call as DIR/calls/NNNNNNNN.call, a pickle of (function,
args, kwargs), renamed into place whole; the worker runs the calls in order
and answers each with DIR/replies/NNNNNNNN.reply, a pickle of ("ok", value)
or ("error", exception), also renamed into place, then removes the call.
DIR/calls/stop ends it. DIR/ready.json, written once at the start, says
which kernel it runs on. Both sides are the same Python with the same
packages (the guest's / is the host's), so functions and results travel by
reference and by pickle; the directory is the host's own, mode 0700.
"""
from __future__ import annotations

import json
import os
import pathlib
import pickle
import platform
import time
import traceback
from typing import Any

# How often the calls directory is looked at: every 50 ms after a call,
# backing off to every 0.4 s while none comes. Under TCG each look over 9p
# is dear: at a steady 50 ms an idle guest took 13% of a host CPU, from
# whatever else ran beside it. A call that comes after a pause may so wait
# up to IDLE_POLL_S more to be taken (inside its call_timeout_s).
POLL_S = 0.05
IDLE_POLL_S = 0.4
CALL_SUFFIX = ".call"
REPLY_SUFFIX = ".reply"
STOP = "stop"
# What the guest's python runs: the host's import path (a JSON list) in
# place of its own, which would start with the directory it runs in.
START = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
         "from uffdkvm.kernels import _worker; sys.exit(_worker.main(sys.argv[1]))")


GIGANTIC = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"


def _pages(path: str) -> int:
    try:
        return int(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return 0


def write_whole(path: pathlib.Path, data: bytes) -> None:
    """``data`` at ``path``, appearing all at once to the other side."""
    part = path.with_name(f".{path.name}.part")
    with open(part, "wb") as f:
        f.write(data)
    os.replace(part, path)


def _reply(value: Any, error: BaseException | None) -> bytes:
    if error is None:
        try:
            return pickle.dumps(("ok", value))
        except Exception as e:  # a value that does not pickle is the call's failure
            error = e
    try:
        return pickle.dumps(("error", error))
    except Exception:
        from ..errors import RunError
        text = "".join(traceback.format_exception(error)).strip()
        return pickle.dumps(("error", RunError(f"in the guest: {text}")))


def serve(directory: pathlib.Path) -> int:
    calls, replies = directory / "calls", directory / "replies"
    calls.mkdir(exist_ok=True)
    replies.mkdir(exist_ok=True)
    hugepages = os.environ.get("UFFDKVM_GUEST_HUGEPAGES")
    if hugepages:
        pathlib.Path("/proc/sys/vm/nr_hugepages").write_text(hugepages)
    # What the kernel reserved, which may be fewer than asked: the Guest checks.
    write_whole(directory / "ready.json", json.dumps(
        {"release": platform.release(), "pid": os.getpid(), "cpus": os.cpu_count(),
         "hugepages": _pages("/proc/sys/vm/nr_hugepages"),
         "gigantic_pages": _pages(GIGANTIC)}).encode())
    poll_s = POLL_S
    while True:
        names = sorted(os.listdir(calls))
        if STOP in names:
            return 0
        todo = [n for n in names if n.endswith(CALL_SUFFIX)]
        if not todo:
            time.sleep(poll_s)
            poll_s = min(poll_s * 2, IDLE_POLL_S)
            continue
        poll_s = POLL_S
        for name in todo:
            taken = calls / f".{name}.taken"
            try:
                # Taken: from here the host can no longer take the call back.
                os.rename(calls / name, taken)
            except FileNotFoundError:
                continue    # cancelled before it was taken
            value, error = None, None
            try:
                fn, args, kwargs = pickle.loads(taken.read_bytes())
                value = fn(*args, **kwargs)
            except BaseException as e:  # every failure goes back to its caller
                error = e
            write_whole(replies / (name[:-len(CALL_SUFFIX)] + REPLY_SUFFIX),
                        _reply(value, error))
            taken.unlink()


def main(directory: str) -> int:
    return serve(pathlib.Path(directory))
