"""sweep(): every combination of some Config fields, repeated, as one DataFrame.

    df = uffdkvm.sweep(uffdkvm.Config(vcpus=4, single_uffd=True),
                       readers=[1, 2, 4, 8, 16, 32], wait=["poll", "epoll_exclusive"],
                       trials=5, out="herd.jsonl")
    df.pivot_table(index="readers", columns="wait", values="pages_per_s",
                   aggfunc="median")

Made for sweeps that run all night:

- every point is checked (made into a Config) before anything runs, so a bad
  value fails at once, not at 3 a.m.;
- with ``out``, each finished run is appended to the file as one line of
  ``Result.to_json()`` and flushed to disk, and a rerun with the same ``out``
  skips the runs the file already holds;
- a run that raises does not stop the sweep: its row carries the exception
  in the ``error`` column (measurements empty), a SweepWarning at the end
  counts the failures, and, not being in ``out``, the run is tried again when
  the sweep is rerun. Ctrl-C (KeyboardInterrupt) stops the sweep; what
  finished is in ``out``.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import uuid
import warnings
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any, Union

from ..config import Config
from ..errors import ConfigError, UffdkvmError
from ..io.frames import _pandas, config_row, run_row
from ..io.serial import MAX_JSON_BYTES, encode
from ..result import Result
from ..run import run

if TYPE_CHECKING:  # pragma: no cover
    import pandas

PathLike = Union[str, "os.PathLike[str]"]


class SweepWarning(UserWarning):
    """Some runs of a sweep failed or did not verify, or a line of its out
    file could not be read."""


def read_results(path: PathLike, max_bytes: int = MAX_JSON_BYTES) -> list[Result]:
    """The Results in a JSON-lines file, such as sweep(out=...) writes.

    A line that is not a Result (a run cut off mid-write, say, or one over
    max_bytes, which is skipped unread) is skipped with a SweepWarning
    naming the line.
    """
    results = []
    with open(path, "rb") as f:
        lineno = 0
        while line := f.readline(max_bytes + 1):
            lineno += 1
            if len(line) > max_bytes and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                warnings.warn(f"{path}:{lineno}: skipped, not a uffdkvm Result: a line "
                              f"longer than the {max_bytes} bytes read at most (max_bytes=)",
                              SweepWarning, stacklevel=2)
                continue
            if not line.strip():
                continue
            try:
                results.append(Result.from_json(line.rstrip(b"\r\n"), max_bytes))
            except UffdkvmError as e:
                warnings.warn(f"{path}:{lineno}: skipped, not a uffdkvm Result: {e}",
                              SweepWarning, stacklevel=2)
    return results


def _run_point(config: Config, token: str = "") -> Result:
    """What an executor runs. ``token`` makes every submission unique, so an
    executor that caches by arguments (dask's pure tasks) runs each trial."""
    return run(config)


def _key(config: Config) -> str:
    """A hashable, canonical spelling of a Config."""
    return json.dumps(encode(config), sort_keys=True)


def _axis(value: Any) -> list[Any]:
    """The values of one grid entry: any iterable but a string (a list, range,
    generator, numpy array, pandas Series) is an axis; anything else is held
    fixed."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        return list(value)
    return [value]


def points(base: Config | None = None, **grid: Any) -> list[Config]:
    """The distinct Configs of a grid, in order (the last field varies fastest).

    Any iterable but a string (a list, tuple, range, generator, numpy array,
    pandas Series) is an axis; any other value is held fixed. To hold a field
    fixed at a list, wrap it: ``field=[[a, b]]``.
    """
    if base is None:
        base = Config()
    elif not isinstance(base, Config):
        raise ConfigError(f"base: sweep() takes a uffdkvm.Config as base, not "
                          f"{type(base).__name__}")
    keys = list(grid)
    configs: dict[str, Config] = {}
    for combo in itertools.product(*(_axis(v) for v in grid.values())):
        config = base.replace(**dict(zip(keys, combo, strict=True)))
        configs.setdefault(_key(config), config)
    return list(configs.values())


class _Bar:
    """A tqdm bar, or nothing (progress=False, or tqdm not installed)."""

    def __init__(self, enabled: bool, total: int, initial: int):
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # the bar is a nicety: run without it
                return
            self._bar = tqdm(total=total, initial=initial, desc="sweep", unit="run")

    def update(self, failed: int) -> None:
        if self._bar is not None:
            if failed:
                self._bar.set_postfix(failed=failed, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Out:
    """The JSON-lines file, appended to one flushed line at a time."""

    def __init__(self, path: PathLike | None):
        self._f = None
        if path is not None:
            self._f = open(path, "a+b")
            size = self._f.seek(0, os.SEEK_END)
            if size:
                self._f.seek(size - 1)
                if self._f.read(1) != b"\n":  # a line cut off mid-write: end it
                    self._f.write(b"\n")

    def write(self, r: Result) -> None:
        if self._f is not None:
            self._f.write(r.to_json().encode() + b"\n")
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def sweep(base: Config | None = None, *, trials: int = 1, progress: bool = True,
          out: PathLike | None = None,
          executor: concurrent.futures.Executor | None = None,
          **grid: Any) -> pandas.DataFrame:
    """Run every combination of the grid ``trials`` times; one row per run.

    base      the Config the grid changes (default: Config())
    trials    runs per point
    progress  a tqdm progress bar on stderr while it runs
    out       a .jsonl file: each finished run is appended as one line of
              Result.to_json(); runs already in it are not run again (a point
              counts as done for as many trials as the file holds Results with
              an equal Config, whatever host wrote them), and their rows are
              in the frame. read_results(out) gives the Results back.
    executor  any concurrent.futures.Executor (a dask.distributed client's
              get_executor(), a ProcessPoolExecutor): runs go there and are
              collected as they finish. Runs that share a host disturb each
              other's timings: for measurements, one worker per host.
    grid      Config fields: any iterable but a string (a list, range, numpy
              array, pandas Series) is an axis, any other value is held fixed

    Returns the to_frame() rows of the runs, with ``trial`` in front and
    ``error`` last (None, or "ExceptionType: message" for a run that raised),
    ordered by point, then trial. ``trial`` numbers a point's runs 0, 1, ...:
    its Results in the order they finished (the order of ``out``), then its
    failures. Runs go trial by trial (every point once, then every point again),
    so an interrupted sweep has covered the grid evenly and slow drift of the
    host spreads over all points.

    A ConfigError for a bad grid value is raised before anything runs. A run
    that raises is recorded in ``error`` and the sweep goes on; a SweepWarning
    at the end says how many failed (and how many did not verify). Ctrl-C
    stops the sweep and raises KeyboardInterrupt.
    """
    pd = _pandas()
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"trials: expected a positive int, not {trials!r}")
    configs = points(base, **grid)

    # Per point: its Results (the file's first, in file order, then this
    # call's in the order they finished, which is the order they are
    # appended) and its errors. A run's trial is its place in that order, so
    # a rerun numbers the rows it loads as the sweep that ran them did.
    results = _done(configs, trials, out)
    errors: list[list[str]] = [[] for _ in configs]
    # Trial by trial: every point once, then every point again.
    todo = [(i, config) for t in range(trials) for i, config in enumerate(configs)
            if t >= len(results[i])]

    failed = 0
    sink = _Out(out if todo else None)
    bar = _Bar(progress and bool(todo), len(configs) * trials,
               len(configs) * trials - len(todo))
    outcomes = _outcomes(todo, executor)
    try:
        for i, outcome in outcomes:
            if isinstance(outcome, Result):
                sink.write(outcome)
                results[i].append(outcome)
            else:
                errors[i].append(outcome)
                failed += 1
            bar.update(failed)
    finally:
        outcomes.close()  # with an executor: cancels what is still queued
        bar.close()
        sink.close()
    return _frame(pd, configs, results, errors, out)


def _done(configs: list[Config], trials: int, out: PathLike | None) -> list[list[Result]]:
    """Per point, the Results ``out`` already holds for it, in file order, at
    most ``trials``."""
    results: list[list[Result]] = [[] for _ in configs]
    if out is not None and os.path.exists(out):
        index = {_key(config): i for i, config in enumerate(configs)}
        for r in read_results(out):
            i = index.get(_key(r.config))
            if i is not None and len(results[i]) < trials:
                results[i].append(r)
    return results


def _frame(pd: Any, configs: list[Config], results: list[list[Result]],
           errors: list[list[str]], out: PathLike | None) -> pandas.DataFrame:
    """sweep()'s frame: per point its Results' rows, then its errors'; and
    the warning of how many failed."""
    ordered = []
    for i, config in enumerate(configs):
        ordered += [_row(r, t) for t, r in enumerate(results[i])]
        ordered += [_error_row(config, len(results[i]) + t, e) for t, e in enumerate(errors[i])]
    _warn(ordered, [e for errs in errors for e in errs], out)
    columns: dict[str, None] = {}
    for row in sorted(ordered, key=lambda row: row["error"] is not None):
        columns.update(dict.fromkeys(row))
    columns.pop("error", None)
    df: pandas.DataFrame = pd.DataFrame(
        ordered, columns=["trial", *(c for c in columns if c != "trial"), "error"])
    return df


def _outcomes(todo: list[tuple[int, Config]],
              executor: concurrent.futures.Executor | None
              ) -> Generator[tuple[int, Result | str], None, None]:
    """(point, Result or error message) as each run finishes."""
    if executor is None:
        for i, config in todo:
            try:
                yield i, _run_point(config)
            except Exception as e:
                yield i, _error(e)
        return
    futures = {executor.submit(_run_point, config, uuid.uuid4().hex): i for i, config in todo}
    try:
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                yield i, future.result()
            except Exception as e:
                yield i, _error(e)
    finally:  # Ctrl-C, or the caller gave up: do not leave runs queued
        for future in futures:
            future.cancel()


def _row(r: Result, trial: int) -> dict[str, Any]:
    return {"trial": trial, **run_row(r), "error": None}


def _error_row(config: Config, trial: int, error: str) -> dict[str, Any]:
    return {"trial": trial, **config_row(config), "error": error}


def _warn(rows: list[dict[str, Any]], errors: list[str], out: PathLike | None) -> None:
    unverified = sum(1 for row in rows if row.get("verified") is False)
    problems = []
    if errors:
        again = f"; rerunning with out={os.fspath(out)!r} tries them again" if out else ""
        problems.append(f"{len(errors)} of {len(rows)} runs failed (see the error "
                        f"column{again}); the first: {errors[0]}")
    if unverified:
        problems.append(f"{unverified} of {len(rows)} runs did not verify their memory "
                        f"(see the verified and verify_message columns)")
    if problems:
        warnings.warn("sweep: " + "; ".join(problems), SweepWarning, stacklevel=3)
