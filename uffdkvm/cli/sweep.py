"""``uffdkvm sweep``: the run command's flags, each taking a comma-separated
list, run over every combination and printed as one comparison table.

    uffdkvm sweep -a -v 2 -b 4M -r 1,4,16 --trials 6

    | readers | pages_per_s |
    |---|---|
    | 1 | 33.5k [29.8k, 34.6k] |
    | 4 | 32.8k [31.4k, 34.2k] |
    | 16 | 34.3k [32.9k, 34.5k] |

    median pages_per_s of 6 trials [bootstrap 95% confidence interval of the median]; 18 runs
    cv (stdev/mean of the trials): 2.4%-7.1%

(Real output of that command on a 2-CPU development VM whose KVM is software
virtualization, under load from other jobs: hence the low rates.
tests/cli/test_sweep.py runs the command and compares the shape.)

One row per combination of the swept fields, one column per --wait mode (or,
when --wait is fixed, per value of the last swept field; with one swept field,
one column); each cell the median of the metric (default pages_per_s) over
the trials, with the bootstrap 95% confidence interval of that median beside
it (uffdkvm.spread_of; --spread iqr or minmax for the quartiles or the
extremes instead). Below the table, what the cells are and the coefficient of
variation of the trials, per column.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..analysis.spread import Spread, spread_of
from ..analysis.sweep import SweepWarning, points, sweep
from ..config import BACKING_PAGE_SIZES, GUEST_PAGE_SIZES, PIN_SCHEDULER, Config, format_size
from ..errors import HostUnsupportedError, UffdkvmError
from ..io import tables
from ..run import probe, run
from ..support import backing_support
from ._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIP,
    EXIT_STATUS_HELP,
    MAIN_CPU_IN_GUEST,
    Boot,
    CliError,
    Convert,
    add_run_arguments,
    alone,
    booted,
    called,
    console_progress,
    format_backing_support,
    guarded,
    pin_main_thread,
    pop_cli_options,
    split_pins,
)

FIELDS = [f.name for f in dataclasses.fields(Config)]
# --spread: what a cell shows beside the median, and how the footer says it.
SPREADS = {
    "ci": "[bootstrap 95% confidence interval of the median]",
    "iqr": "(interquartile range: 25th-75th percentile)",
    "minmax": "(min-max)",
}
NAME = "sweep"
PROG = f"uffdkvm {NAME}"
HELP = "many runs over a grid of values, one comparison table"


def _list_of(convert: Convert) -> Convert:
    """An argparse type: "a,b,c" -> [convert(a), convert(b), convert(c)]."""
    def parse(text: str) -> list[Any]:
        return [convert(item.strip()) for item in text.split(",")]
    parse.__name__ = getattr(convert, "__name__", "value")  # for argparse's messages
    return parse


def _convert(field: str, hint: Any, text: str) -> Any:
    """text as a value of the Config field's type (bool, int, float, None, str)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    if text.lower() == "none" and type(None) in options:
        return None
    for t in options:
        if t is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
        elif t is int:
            try:
                return int(text)
            except ValueError:
                pass
        elif t is float:
            try:
                return float(text)
            except ValueError:
                pass
        elif t is str:
            return text
    raise argparse.ArgumentTypeError(
        f"{field}: {text!r} is not a {getattr(hint, '__name__', hint)}")


def _setting(text: str) -> tuple[str, list[Any]]:
    """--set FIELD=V1,V2: any Config field, with values parsed by its type."""
    field, sep, values = text.partition("=")
    field = field.strip().replace("-", "_")
    if not sep or field not in FIELDS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected FIELD=VALUE[,VALUE...] with FIELD one of {', '.join(FIELDS)}")
    hint = typing.get_type_hints(Config)[field]
    return field, [_convert(field, hint, v.strip()) for v in values.split(",")]


PARSER: dict[str, Any] = dict(
    description="Run KVM demand-paging experiments over every combination of the "
    "given values and print one comparison table. Takes the flags of the run command "
    "(uffdkvm --help); each flag that sets one Config field also takes a "
    "comma-separated list (-r 1,2,4 --wait poll,epoll_exclusive), and --set sweeps any "
    "Config field.",
    epilog="Table: one row per combination of the swept fields, one column per --wait "
    "mode (or, when --wait is fixed, per value of the last swept field); each cell is "
    "the median of --metric over the trials with, in brackets, the bootstrap 95% "
    "confidence interval of that median (--spread). Below it: the coefficient of "
    "variation (stdev/mean) of the trials per column. Every argument, --metric "
    "included, is checked and the host probed before the first run; a run that fails "
    "is reported and the sweep goes on. " + EXIT_STATUS_HELP.replace(
        "1 the run failed or its memory did not verify", "1 some run failed or did not "
        "verify").replace("4 this host", "4 pandas is missing, or this host") +
    " After an interrupt the finished runs are in --out.")


def build_parser() -> argparse.ArgumentParser:
    return alone(PROG, PARSER, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep command's flags: the run command's, each taking a list, and its own."""
    add_run_arguments(p, _list_of, "print every run as one line of JSON (the frame's rows) "
                      "instead of the table")
    p.add_argument("--set", dest="settings", type=_setting, action="append", default=[],
                   metavar="FIELD=V1,V2", help="sweep any Config field, e.g. --set "
                   "single_uffd=false,true; overrides the flag for that field")
    p.add_argument("--trials", type=int, default=1, metavar="N",
                   help="runs per combination (default 1)")
    p.add_argument("--out", metavar="FILE.jsonl",
                   help="append each finished run to this file as one line of JSON; "
                   "a rerun skips the runs it holds")
    p.add_argument("--metric", default="pages_per_s", metavar="COLUMN",
                   help="what the table shows: any numeric column of Result.to_frame(), "
                   "e.g. context_switches_per_fault (default pages_per_s)")
    p.add_argument("--spread", choices=list(SPREADS), default="ci",
                   help="what each cell shows beside the median: ci, the bootstrap 95%% "
                   "confidence interval of the median (default; with under 6 trials it is "
                   "the min-max); iqr, the 25th-75th percentiles; minmax, the extremes")


def _si(x: float) -> str:
    """249123 -> '249k', 18512 -> '18.5k', 1.0254 -> '1.03'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _show(field: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if field == "mem_per_vcpu":
        return format_size(int(value))
    return str(value)


def _heading(field: str | None, value: Any) -> str:
    """A column's heading: the wait mode alone ("poll"), else field=value."""
    if field is None:
        return str(value)
    return _show(field, value) if field == "wait" else f"{field}={_show(field, value)}"


def _cell(s: Spread, failed: int, spread: str) -> str:
    if not s.n:
        return f"{failed} failed" if failed else "-"
    text = _si(s.median)
    if s.n > 1:
        if spread == "ci":
            text += f" [{_si(s.ci_low)}, {_si(s.ci_high)}]"
        elif spread == "iqr":
            text += f" ({_si(s.q1)}-{_si(s.q3)})"
        else:
            text += f" ({_si(s.min)}-{_si(s.max)})"
    return f"{text}, {failed} failed" if failed else text


class Grid:
    """A sweep's frame laid out as the table shows it: the fields of its
    rows, the field of its columns, and per cell the Spread of its trials'
    metric and how many of its runs failed (a run that did not fail but has
    no value for the metric is left out, not counted as failed)."""

    def __init__(self, df: Any, swept: list[str], metric: str) -> None:
        self.column_field = "wait" if "wait" in swept else (
            swept[-1] if len(swept) > 1 else None)
        self.row_fields = [f for f in swept if f != self.column_field]
        keys = list(df[[*self.row_fields, *([self.column_field] if self.column_field
                                            else [])]].itertuples(index=False, name=None)) \
            if swept else [()] * len(df)
        values: dict[tuple[Any, ...], list[Any]] = {}
        self.failed: dict[tuple[Any, ...], int] = {}
        self.row_keys: dict[tuple[Any, ...], None] = {}
        self.column_keys: dict[Any, None] = {}
        errors = df["error"] if "error" in df else [None] * len(df)
        measured = df[metric] if metric in df else [None] * len(df)
        for key, error, value in zip(keys, errors, measured, strict=True):
            row_key = tuple(key[:len(self.row_fields)])
            column_key = key[len(self.row_fields)] if self.column_field else metric
            self.row_keys.setdefault(row_key)
            self.column_keys.setdefault(column_key)
            cell = values.setdefault((row_key, column_key), [])
            if isinstance(error, str):
                self.failed[row_key, column_key] = self.failed.get((row_key, column_key), 0) + 1
            else:
                cell.append(value)
        # ValueError for a metric that is not numeric, naming the value.
        self.cells: dict[tuple[Any, ...], Spread] = {k: spread_of(v) for k, v in values.items()}

    def cell(self, row_key: tuple[Any, ...], column_key: Any) -> Spread:
        return self.cells.get((row_key, column_key)) or spread_of([])

    def heading(self, column_key: Any) -> str:
        return _heading(self.column_field, column_key)


def format_table(grid: Grid, spread: str = "ci") -> str:
    """The markdown comparison table of a sweep's Grid: each cell the
    median and, with more than one trial, its ``spread`` (a key of SPREADS)."""
    header = [*grid.row_fields, *(grid.heading(c) for c in grid.column_keys)]
    rows = [[*(_show(f, v) for f, v in zip(grid.row_fields, row_key, strict=True)),
             *(_cell(grid.cell(row_key, c), grid.failed.get((row_key, c), 0), spread)
               for c in grid.column_keys)] for row_key in grid.row_keys]
    return "\n".join(tables.markdown_grid(header, rows))


def _percent(x: float) -> str:
    return f"{100 * x:.2g}%" if abs(x) < 0.1 else f"{100 * x:.0f}%"


def format_footer(metric: str, trials: int, spread: str = "ci") -> str:
    """What the table's cells are: the footer's first line."""
    plural = "s" if trials != 1 else ""
    return f"median {metric} of {trials} trial{plural}" + (
        f" {SPREADS[spread]}" if trials > 1 else "")


def format_notes(grid: Grid, spread: str = "ci") -> list[str]:
    """The lines under the footer: how far to trust a short interval, and
    the coefficient of variation (stdev/mean) of each column's trials (its
    lowest and highest cell)."""
    notes = []
    fewest = min((s.n for s in grid.cells.values() if s.n > 1), default=0)
    if spread == "ci" and 1 < fewest < 6:
        notes.append(f"with {fewest} trials the interval is the trials' min-max: it holds the "
                     f"true median {100 * (1 - 2 ** (1 - fewest)):.4g}% of the time "
                     "(6 or more trials for 95%)")
    parts = []
    for c in grid.column_keys:
        cvs = sorted(s.cv for (_, column), s in grid.cells.items()
                     if column == c and s.n > 1 and not _isnan(s.cv))
        if not cvs:
            continue
        low, high = _percent(cvs[0]), _percent(cvs[-1])
        span = low if low == high else f"{low}-{high}"
        parts.append(span if grid.column_field is None else f"{grid.heading(c)} {span}")
    if parts:
        which = "" if grid.column_field is None else ", lowest-highest cell per column"
        notes.append(f"cv (stdev/mean of the trials{which}): " + ", ".join(parts))
    return notes


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)




def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``uffdkvm sweep`` once its flags are parsed: returns its exit status."""
    return guarded(PROG, argv, lambda: sweep_fields(vars(args)))


def sweep_fields(options: dict[str, Any], boot: Boot | None = None) -> int:
    """The sweep command once its flags are parsed: its runs here, or, with
    ``boot`` (which boots a uffdkvm.kernels.Guest, once the flags have been
    checked), in that guest's kernel."""
    pop_cli_options(options)
    trials, out, metric = options.pop("trials"), options.pop("out"), options.pop("metric")
    spread, quiet, as_json = options.pop("spread"), options.pop("quiet"), options.pop("json")
    settings = options.pop("settings")
    if options.pop("list_backings"):
        with booted(boot) as guest:
            print(format_backing_support(called(guest, backing_support)))
        return EXIT_OK
    if trials < 1:
        raise CliError("--trials: must be at least 1")
    try:
        import pandas  # noqa: F401 - the sweep's frame; here so that nothing runs without it
    except ImportError as e:
        print(f"{PROG}: needs pandas ({e}): pip install 'uffdkvm[analysis]'", file=sys.stderr)
        return EXIT_SKIP
    cpus = options.pop("cpus")
    grid: dict[str, Any] = dict(options)  # lists are swept, the rest held fixed
    grid.update(settings)
    main_cpu = None
    if cpus is not None:
        grid["pin_vcpus"], main_cpu = _sweep_pins(cpus, grid["vcpus"])
    if main_cpu is not None and grid.get("pin_readers") is None:
        # -c's main-thread entry: the readers inherit its CPU, as upstream's do
        # (resolver="vcpu" has no readers, and pin_readers applies to none).
        resolver = grid.get("resolver", "readers")
        resolvers = set(resolver) if isinstance(resolver, list) else {resolver}
        if resolvers == {"readers"}:
            grid["pin_readers"] = PIN_SCHEDULER
        elif "readers" in resolvers:
            raise CliError("-c: a main-thread CPU leaves the readers to the scheduler "
                           "(pin_readers='scheduler'), which applies to resolver='readers' "
                           "only: sweep --resolver readers and vcpu apart, or give -c one "
                           "CPU per vCPU")
    if main_cpu is not None and boot is not None:
        raise CliError(MAIN_CPU_IN_GUEST)
    configs = points(**grid)  # ConfigError for a bad value, before anything runs
    _check_out(out)
    if main_cpu is not None:
        pin_main_thread(main_cpu)
    with booted(boot) as guest:
        # HostUnsupportedError (exit 4) if no point can run here
        columns = _preflight(configs, lambda fn, *args: called(guest, fn, *args))
        if columns is not None and not as_json:
            _check_metric(metric, columns)
        progress = console_progress(quiet) is not None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SweepWarning)  # summarised below instead
                df = sweep(trials=trials, progress=progress, out=out, executor=guest, **grid)
        except KeyboardInterrupt:
            if guest is not None:  # its queued runs were taken back; the one running ends
                guest.shutdown(wait=False, cancel_futures=True)
            kept = f"; finished runs are in {out}" if out else ""
            print(f"{PROG}: interrupted{kept}", file=sys.stderr)
            return EXIT_INTERRUPTED
    return _report(df, grid, trials, out, metric, spread, as_json)


def _sweep_pins(cpus: tuple[int, ...], vcpus: Any) -> tuple[tuple[int, ...], int | None]:
    """-c, upstream's rule (cli_common.split_pins), for the sweep's one vCPU count."""
    counts = vcpus if isinstance(vcpus, list) else [vcpus]
    if len(set(counts)) != 1:
        raise CliError(f"-c: one CPU per vCPU needs one -v, not {','.join(map(str, counts))}; "
                       "--pin-vcpus pins any number of vCPUs round-robin")
    return split_pins(cpus, counts[0])


def _check_out(out: str | None) -> None:
    """--out must be a file this process can append to (not made yet)."""
    if out is None:
        return
    if os.path.exists(out):
        if os.path.isdir(out) or not os.access(out, os.W_OK):
            raise CliError(f"--out: cannot append to {out!r}: "
                           + ("a directory" if os.path.isdir(out) else "not writable"))
        return
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"--out: cannot create {out!r}: {parent} is not a directory "
                       "this process may write to")


def _tiny(config: Config) -> Config:
    """The point shrunk to one vCPU walking one page of its backing: the same
    host needs and the same columns, in milliseconds."""
    unit = max(BACKING_PAGE_SIZES[config.backing], GUEST_PAGE_SIZES[config.guest_page_size])
    return config.replace(vcpus=1, mem_per_vcpu=unit, readers=1, passes=1, delay_us=0,
                          guest_work=0, trace_faults=False, pin_readers=None)


def _preflight(configs: list[Config],
               call: Callable[..., Any] = lambda fn, *args: fn(*args)
               ) -> dict[str, Any] | None:
    """One tiny run of the first point this host can run: its to_frame() row,
    for --metric. Raises HostUnsupportedError when no point can run here (a
    host without KVM, say), so that the sweep does not run every point to
    fail each; None when the tiny run failed otherwise (the sweep will say)."""
    from ..io.frames import run_row

    first: HostUnsupportedError | None = None
    for i, config in enumerate(configs):
        try:
            if i == 0:
                return run_row(call(run, _tiny(config)))
            call(probe, _tiny(config))
        except HostUnsupportedError as e:
            first = first or e
            continue
        except UffdkvmError:
            return None
        # A later point can run here: run it tiny for the columns.
        try:
            return run_row(call(run, _tiny(config)))
        except UffdkvmError:
            return None
    assert first is not None
    if len(configs) > 1:
        raise HostUnsupportedError(f"none of the {len(configs)} points can run here; the "
                                   f"first: {first}", first.errno)
    raise first


def _check_metric(metric: str, row: dict[str, Any]) -> None:
    """--metric names a numeric column of to_frame(), as the tiny run made it
    (a measurement may be None there, as latencies are without guest timing)."""
    def numeric(column: str) -> bool:
        v = row[column]
        if v is None:
            return column not in FIELDS  # an empty measurement, not an unset pin list
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if metric in row and numeric(metric):
        return
    shown = [c for c in row if numeric(c) and c not in FIELDS and not c.endswith(("_min", "_max"))
             and not c.startswith(("kvm_", "vcpus_kvm_", "host_"))]
    what = f"column {metric!r} is not numeric" if metric in row else f"no column {metric!r}"
    raise CliError(f"--metric: {what}; the numeric columns are {', '.join(shown)}, their "
                   "_min and _max over threads, the Config's numeric fields, and kvm_*, "
                   "vcpus_kvm_* for KVM's statistics")


def _report(df: Any, grid: dict[str, Any], trials: int, out: str | None, metric: str,
            spread: str, as_json: bool) -> int:
    failed = df[df["error"].notna()]
    unverified = int((df["verified"] == False).sum()) if "verified" in df else 0  # noqa: E712
    if as_json:
        # Strict JSON, as --out and Result.to_json() write it: pandas would
        # write an infinite float (timeout_s=inf) as null, which reads back as
        # missing; "inf"/"-inf" say what it was. NaN stays null: missing.
        inf = float("inf")
        shown = df.replace({inf: "inf", -inf: "-inf"})
        text = shown.to_json(orient="records", lines=True, double_precision=15)
        print(text.rstrip("\n"))
    else:
        ok = df[df["error"].isna()]
        if len(ok) and metric not in df.columns:  # the preflight could not tell
            _check_metric(metric, dict.fromkeys(c for c in ok.columns if _is_numeric(ok[c])))
        swept = [f for f in FIELDS if f in df and isinstance(grid.get(f), list)
                 and df[f].nunique(dropna=False) > 1]
        try:
            table = Grid(df, swept, metric)
        except ValueError as e:
            raise CliError(f"--metric: column {metric!r} is not numeric ({e})") from None
        print(format_table(table, spread))
        runs = f"{len(df)} run" + ("s" if len(df) != 1 else "")
        print(f"\n{format_footer(metric, trials, spread)}; {runs}"
              + (f", {len(failed)} failed" if len(failed) else "")
              + (f", {unverified} did not verify" if unverified else "")
              + (f"; every run is in {out}" if out else ""))
        for note in format_notes(table, spread):
            print(note)
    if len(failed):
        counts = failed["error"].value_counts()
        for message, n in list(counts.items())[:5]:
            print(f"{PROG}: {n} run(s) failed: {message}", file=sys.stderr)
        if len(counts) > 5:
            print(f"{PROG}: ... and {len(counts) - 5} other errors", file=sys.stderr)
    return EXIT_FAILED if unverified or len(failed) else EXIT_OK


def _is_numeric(series: Any) -> bool:
    from pandas.api.types import is_bool_dtype, is_numeric_dtype
    return bool(is_numeric_dtype(series) and not is_bool_dtype(series))
