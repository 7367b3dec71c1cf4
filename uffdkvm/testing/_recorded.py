"""The runs a pytest session recorded (``pytest --uffdkvm-results PATH``):
one JSON line per run, written by the plugin (uffdkvm.testing.pytest_plugin), read
back by :func:`load_results`."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from ..errors import ResultError
from ..io.frames import _pandas, run_row
from ..io.serial import MAX_JSON_BYTES, encode
from ..result import Result

if TYPE_CHECKING:
    import pandas

PathLike = str | os.PathLike[str]


def record_line(nodeid: str, result: Result) -> str:
    """One run as the line --uffdkvm-results writes: the test's node id, the
    config, the host and the whole Result (which holds both again)."""
    return json.dumps({"nodeid": nodeid, "config": encode(result.config),
                       "host": encode(result.host), "result": encode(result)},
                      sort_keys=True)


def load_results(path: PathLike, max_bytes: int = MAX_JSON_BYTES) -> pandas.DataFrame:
    """The runs in a file ``pytest --uffdkvm-results PATH`` wrote, as a
    DataFrame: one row per run, a ``nodeid`` column (the test that ran it)
    and the columns of :meth:`Result.to_frame`.

    A line that is not such a record raises ResultError naming the file and
    the line."""
    rows: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{os.fspath(path)}:{lineno}"
            if len(line) > max_bytes:
                raise ResultError(f"{where}: a line longer than the {max_bytes} bytes "
                                  "read at most (max_bytes=)")
            try:
                record = json.loads(line)
                nodeid = record["nodeid"]
                result = Result.from_json(json.dumps(record["result"]), max_bytes)
            except (ValueError, KeyError, TypeError, ResultError) as e:
                raise ResultError(f"{where}: not a line that pytest --uffdkvm-results "
                                  f"writes: {type(e).__name__}: {e}") from None
            rows.append({"nodeid": nodeid, **run_row(result)})
    frame: pandas.DataFrame = _pandas().DataFrame(rows, columns=None if rows else ["nodeid"])
    return frame
