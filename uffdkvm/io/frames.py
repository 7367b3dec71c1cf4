"""Results as pandas DataFrames, built generically from the dataclass fields.

pandas is imported only when a frame is asked for; ``import uffdkvm`` never
loads it. The row builders (:func:`run_row`, :func:`table_rows`) return plain
dicts and need no pandas at all.

How fields become columns, at every level:

- a scalar field is a column of its own name; public properties too
  (``VcpuStats.first_pass_pages_per_s``, ``Result.per_vcpu_rate``);
- a dict field becomes one column per key, prefixed with the field's name
  less a trailing ``_stats``: ``kvm_stats["exits"]`` is ``kvm_exits``;
- a nested dataclass becomes its own columns prefixed with the field's name
  (``host.kernel_release`` is ``host_kernel_release``), except ``config``,
  whose fields keep their names (``readers``, ``wait``: the names you swept);
- a tuple of dataclasses is a table of its own (``vcpus``, ``readers``), with
  ``index`` renamed after the table (``vcpu``, ``reader``); a tuple of plain
  values stays one cell.

Result names that leave the unit open get it: ``paging_rate`` is
``pages_per_s``, ``per_vcpu_rate`` ``pages_per_s_per_vcpu``, ``page_size``
``page_size_bytes``.

A name means one thing in every frame: ``pages_per_s`` is the run's paging
rate, over the first pass (the one that demand-pages); a vCPU's rates are
``first_pass_pages_per_s`` and ``all_passes_pages_per_s``. ``faults`` counts
resolved faults (EEXIST ones are ``eexist``) for the run, each vCPU and each
reader alike.

This module takes Results but does not import uffdkvm.result (which imports
it): it works from the dataclasses' fields.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError, ResultError
from ..histogram import Histogram
from .serial import type_hints

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from ..config import Config

# A uffdkvm.Result (not imported: result.py imports this module).
Result = Any

# Result-level names that need a unit to say what they are.
RESULT_RENAMES = {
    "paging_rate": "pages_per_s",
    "per_vcpu_rate": "pages_per_s_per_vcpu",
    "page_size": "page_size_bytes",
}
# Per-thread columns that identify a thread rather than measure it.
IDENTIFIERS = frozenset({"index", "uffd", "tid", "iteration", "round"})

# How a column came to be, which decides how to_frame summarises it.
_FIELD, _DICT, _NESTED = "field", "dict", "nested"
# KVM statistics that are peaks, not counters: summarised by their max.
_PEAK = re.compile(r"(^|_)max_")


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        error = MissingDependencyError("DataFrames need pandas: pip install "
                                       "'uffdkvm[analysis]' (or pip install pandas)")
        error.name = "pandas"
        raise error from None
    return pandas


def _properties(cls: type) -> Iterator[str]:
    """Public properties of cls, in definition order, base classes first."""
    seen = set()
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            if isinstance(member, property) and not name.startswith("_") and name not in seen:
                seen.add(name)
                yield name


def _is_table(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        dataclasses.is_dataclass(v) for v in value)


def _columns(obj: Any, prefix: str = "", renames: dict[str, str] | None = None,
             skip: frozenset[str] = frozenset()) -> list[tuple[str, Any, str]]:
    """(column, value, kind) for every field and property of a dataclass:
    plain values first (fields, then properties), then the columns of dicts
    and nested dataclasses."""
    renames = renames or {}
    names = [f.name for f in dataclasses.fields(obj)]
    names += [p for p in _properties(type(obj)) if p not in names]
    plain: list[tuple[str, Any, str]] = []
    spread: list[tuple[str, Any, str]] = []
    hints = type_hints(typing.cast(type, type(obj)))
    for name in names:
        if name in skip:
            continue
        value = getattr(obj, name)
        column = prefix + renames.get(name, name)
        if isinstance(value, Histogram) or _is_histogram_hint(_hint(type(obj), hints, name)):
            spread += [(c, v, _NESTED) for c, v in _histogram_columns(value, column)]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            spread += [(c, v, _NESTED) for c, v, _ in _columns(value, column + "_")]
        elif isinstance(value, dict):
            stem = name[:-len("_stats")] if name.endswith("_stats") else name
            spread += [(c, v, _DICT) for c, v in _dict_columns(value, prefix + stem + "_")]
        elif _is_table(value) or (isinstance(value, (list, tuple)) and not value
                                   and _table_type(type(obj), name) is not None):
            continue  # a table of its own
        else:
            plain.append((column, value, _FIELD))
    return plain + spread


HISTOGRAM_PERCENTILES = (50, 90, 99)


def _is_histogram_hint(hint: Any) -> bool:
    if isinstance(hint, str):  # a property's annotation, unevaluated
        return "Histogram" in hint
    return hint is Histogram or Histogram in typing.get_args(hint)


def _hint(cls: type, hints: dict[str, Any], name: str) -> Any:
    """A field's type hint, or a property's return annotation."""
    if name in hints:
        return hints[name]
    prop = getattr(cls, name, None)
    return getattr(getattr(prop, "fget", None), "__annotations__", {}).get("return")


def _histogram_columns(h: Histogram | None, name: str) -> Iterator[tuple[str, Any]]:
    """A histogram in a row: its count and the numbers one plots, in its unit."""
    unit = h.unit if h is not None else "ns"
    yield f"{name}_count", None if h is None else h.count
    full = h if h is not None and h.count else None
    yield f"{name}_mean_{unit}", None if full is None else full.mean
    for q in HISTOGRAM_PERCENTILES:
        yield f"{name}_p{q}_{unit}", None if full is None else full.percentile(q)
    yield f"{name}_max_{unit}", None if full is None else full.max


def _dict_columns(d: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _dict_columns(v, f"{prefix}{k}_")
        else:
            yield f"{prefix}{k}", v


def _table_type(cls: type, name: str) -> type | None:
    """The dataclass a list field of cls holds (List[VcpuStats] -> VcpuStats)."""
    try:
        hint = type_hints(cls).get(name)
    except Exception:  # unresolvable annotations: treat as plain values
        return None
    if typing.get_origin(hint) in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        if len(args) == 1 and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _tables(r: Result) -> list[str]:
    """Result fields that are tables: lists of dataclasses (vcpus, readers)."""
    return [f.name for f in dataclasses.fields(r)
            if _is_table(getattr(r, f.name)) or _table_type(type(r), f.name) is not None]


def _singular(table: str) -> str:
    return table[:-1] if table.endswith("s") else table


# ---- one row per thread ---------------------------------------------------

def table_rows(r: Result, table: str) -> list[dict[str, Any]]:
    """One dict per element of the list field ``table`` (e.g. "vcpus")."""
    renames = {"index": _singular(table)}
    return [{c: v for c, v, _ in _columns(x, renames=renames)} for x in getattr(r, table)]


def _empty_columns(r: Result, table: str) -> list[str]:
    cls = _table_type(type(r), table)
    if cls is None:
        return []
    renames = {"index": _singular(table)}
    hints = type_hints(cls)
    return [renames.get(f.name, f.name) for f in dataclasses.fields(cls)
            if not _is_dict_hint(hints.get(f.name))]


def _is_dict_hint(hint: Any) -> bool:
    return hint is dict or typing.get_origin(hint) is dict


def table_frame(r: Result, table: str) -> pandas.DataFrame:
    pd = _pandas()
    rows = table_rows(r, table)
    df: pandas.DataFrame = pd.DataFrame(rows) if rows else \
        pd.DataFrame(columns=_empty_columns(r, table))
    return df


def vcpus_frame(r: Result) -> pandas.DataFrame:
    """One row per vCPU: ``vcpu``, ``seconds``, ``pages``,
    ``first_pass_pages_per_s``, ``all_passes_pages_per_s``, ``exits``, ...,
    and ``kvm_<name>`` for each of KVM's per-vCPU statistics."""
    return table_frame(r, "vcpus")


def dirty_passes_frame(r: Result) -> pandas.DataFrame:
    """One row per tracked pass (dirty_tracking): every field of DirtyPass
    (``iteration``, ``dirty_seconds``, ...)."""
    return table_frame(r, "dirty_passes")


def readers_frame(r: Result) -> pandas.DataFrame:
    """One row per reader thread: ``uffd``, ``reader``, ``faults``,
    ``wakeups``, ``spurious_wakeups``, ..., ``busy_seconds``, ``cpu_seconds``."""
    return table_frame(r, "readers")


# ---- one row per run ------------------------------------------------------

def config_row(config: Config, shadowed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The Config's fields (and properties not in ``shadowed``) as columns."""
    return {c: v for c, v, _ in _columns(config, skip=shadowed)}


def _result_names(r: Any) -> frozenset[str]:
    names = {f.name for f in dataclasses.fields(r)} | set(_properties(type(r)))
    return frozenset(RESULT_RENAMES.get(n, n) for n in names) | names


def run_row(r: Result) -> dict[str, Any]:
    """One run as one flat dict: what :func:`run_frame` puts in its row."""
    config_fields = {f.name for f in dataclasses.fields(r.config)}
    # A Config property the Result also measures (uffds, pages_per_vcpu) is
    # given once, as measured.
    row = config_row(r.config, shadowed=_result_names(r) - config_fields)
    for column, value, _ in _columns(r, renames=RESULT_RENAMES,
                                     skip=frozenset({"config", "fault_trace", "page_visits",
                                                     "touch_order", "migrated_pages"})):
        row["result_" + column if column in config_fields else column] = value
    for table in _tables(r):
        row.update(_aggregates(r, table))
    return row


def migration_row(m: Any, knobs: tuple[str, ...]) -> dict[str, Any]:
    """One migration (a uffdkvm.MigrationResult) as one flat dict: the
    workload as the destination ran it (its Config's fields), the knobs as
    the source had them, the migration's scalars, and each side's Result
    columns prefixed ``source_`` and ``destination_``."""
    row = config_row(m.destination.config)
    row.update({k: getattr(m.source.config, k) for k in knobs})
    row["migration"] = m.mode
    for f in dataclasses.fields(m):
        if f.name not in ("rounds", "source", "destination"):
            row[f.name] = getattr(m, f.name)
    row["round_count"] = m.round_count
    row["dirty_rate"] = m.dirty_rate
    for side in ("source", "destination"):
        r = getattr(m, side)
        config_fields = {f.name for f in dataclasses.fields(r.config)}
        row.update({f"{side}_{k}": v for k, v in run_row(r).items() if k not in config_fields})
    return row


def migration_frame(m: Any, knobs: tuple[str, ...]) -> pandas.DataFrame:
    """One row for a migration: :func:`migration_row`."""
    df: pandas.DataFrame = _pandas().DataFrame([migration_row(m, knobs)])
    return df


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _aggregates(r: Result, table: str) -> dict[str, Any]:
    """Per-thread numbers summarised over the threads of one table:
    ``<table>_<x>`` the sum, ``_min`` and ``_max`` beside it; for dict-born
    columns (``kvm_*``) the sum only (the max for peaks named ``max_*``); and,
    for tables that count faults, ``<x>_per_fault`` = sum / faults."""
    items = getattr(r, table)
    renames = {"index": _singular(table)}
    per_thread = [_columns(x, renames=renames) for x in items]
    kinds: dict[str, str] = {}
    values: dict[str, list[float]] = {}
    zero: dict[str, float] = {}
    if per_thread:
        for cols in per_thread:
            for c, v, kind in cols:
                if c in IDENTIFIERS or c == renames["index"] or kind == _NESTED:
                    continue
                kinds.setdefault(c, kind)
                values.setdefault(c, [])
                if _number(v):
                    values[c].append(v)
        values = {c: vs for c, vs in values.items() if vs}
    else:  # no threads (no userfaultfd: no readers): the numeric fields, summed to 0
        cls = _table_type(type(r), table)
        if cls is None:
            return {}
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in IDENTIFIERS and _numeric_hint(hints.get(f.name)):
                kinds[f.name] = _FIELD
                values[f.name] = []
                zero[f.name] = 0.0 if float in _hint_types(hints[f.name]) else 0

    out: dict[str, Any] = {}
    for c, vs in values.items():
        if kinds[c] == _DICT:
            peak = _PEAK.search(c) is not None
            out[f"{table}_{c}"] = (max(vs) if vs else math.nan) if peak else sum(vs)
        elif vs or table not in ("dirty_passes", "migration_rounds"):
            out[f"{table}_{c}"] = sum(vs, zero.get(c, 0))
            out[f"{table}_{c}_min"] = min(vs) if vs else math.nan
            out[f"{table}_{c}_max"] = max(vs) if vs else math.nan
        else:  # no tracked passes or rounds: nothing was found or sent, and no extremes
            out[f"{table}_{c}"] = zero.get(c, 0)
    if "faults" in values and kinds.get("faults") == _FIELD:
        faults = sum(values["faults"])
        for c, vs in values.items():
            if c != "faults" and kinds[c] == _FIELD:
                out[f"{c}_per_fault"] = sum(vs) / faults if faults else math.nan
    return out


def _hint_types(hint: Any) -> tuple[Any, ...]:
    """The types a hint allows: Optional[int] -> (int, NoneType)."""
    if typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _numeric_hint(hint: Any) -> bool:
    """int, float, or an Optional of one of them."""
    types = _hint_types(hint)
    return all(t in (int, float, type(None)) for t in types) and \
        any(t in (int, float) for t in types)


def faults_frame(r: Result) -> pandas.DataFrame:
    """One row per fault (trace_faults=True), by read time: ``t_s`` (seconds
    from the run's start, the vCPU threads' creation where Result.seconds
    begins, to the fault's read; NA in JSON from before uffdkvm recorded the
    start), the trace's columns (every field of FaultTrace but ``start_ns``:
    ``raised_ns``, ``read_ns``, ...) and each fault's stages in ns:
    ``service_ns`` (read to the page's arrival: resolved, or resumed if the
    vCPU resumed before the reader saw its ioctl return) always;
    ``queue_ns`` (raised to read), ``resume_ns`` (arrival to resumed) and
    ``fault_ns`` (raised to resumed) with guest_timing, except for faults
    whose stamps contradict the readers' clock (Result.misordered_faults);
    ``woken``: an EEXIST message read after its vCPU resumed, woken by
    another fault's resolution of the page (overlap), which has ``fault_ns``
    and no stages of its own.
    Columns that can be unknown use pandas' nullable Int64."""
    pd = _pandas()
    if r.fault_trace is None:
        raise ResultError("fault_trace: this run kept no trace; run with trace_faults=True")
    t = r.fault_trace
    df = pd.DataFrame({f.name: list(getattr(t, f.name)) for f in dataclasses.fields(t)
                       if f.name != "start_ns"})
    for stamp in ("raised_ns", "resumed_ns"):
        df[stamp] = df[stamp].astype("Int64")
    resolved = df["resolved_ns"].astype("Int64")
    # Stamps that contradict the readers' clock (Result.misordered_faults)
    # give no stages here, as they give none to the histograms.
    timed = ((df["raised_ns"] < df["read_ns"]) & (df["resumed_ns"] > df["read_ns"])) \
        .fillna(False).astype(bool)
    woken = _woken_by_other(df, r.page_size)
    # The page arrived when the ioctl returned, or when the vCPU resumed if
    # that came first (the ioctl wakes the vCPU before it returns; see
    # VcpuStats): the stages then partition raised -> resumed.
    arrived = resolved.where(~timed | (resolved <= df["resumed_ns"]), df["resumed_ns"])
    df["queue_ns"] = (df["read_ns"] - df["raised_ns"]).where(timed)
    df["service_ns"] = arrived - df["read_ns"]
    df["resume_ns"] = (df["resumed_ns"] - arrived).where(timed)
    df["fault_ns"] = (df["resumed_ns"] - df["raised_ns"]).where(timed | woken)
    df.loc[woken, "service_ns"] = pd.NA
    df["woken"] = woken
    if t.start_ns is None:
        df.insert(0, "t_s", pd.Series([None] * len(df), dtype="Float64"))
    else:
        df.insert(0, "t_s", (df["read_ns"] - t.start_ns) / 1e9)
    frame: pandas.DataFrame = df
    return frame


def _woken_by_other(df: pandas.DataFrame, page_size: int) -> pandas.Series[bool]:
    """EEXIST messages read after their vCPU resumed because another fault's
    resolution of the page woke it (overlap), as the core tells them
    (csrc/uffd/faultlog.c): that resolving fault was read before this vCPU
    resumed and resolved after it raised."""
    page = df["gpa"] // page_size
    by = df.loc[~df["eexist"].astype(bool)].assign(page=page).drop_duplicates("page", keep="last")
    by = by.set_index("page")
    by_read = page.map(by["read_ns"]).astype("Int64")
    by_resolved = page.map(by["resolved_ns"]).astype("Int64")
    raised, read, resumed = df["raised_ns"], df["read_ns"], df["resumed_ns"]
    woken = (df["eexist"].astype(bool) & (raised < resumed) & (resumed <= read)
             & (by_read < resumed) & (raised < by_resolved))
    result: pandas.Series[bool] = woken.fillna(False).astype(bool)
    return result


def run_frame(r: Result) -> pandas.DataFrame:
    """One row for the run: the Config's fields, the Result's scalars (units
    in the names), ``host_*``, KVM's VM-wide ``kvm_*``, and per-thread
    aggregates: ``vcpus_*`` and ``readers_*`` (sum, ``_min``, ``_max``) and
    ``*_per_fault`` (``spurious_wakeups_per_fault``,
    ``context_switches_per_fault``, ...)."""
    df: pandas.DataFrame = _pandas().DataFrame([run_row(r)])
    return df
