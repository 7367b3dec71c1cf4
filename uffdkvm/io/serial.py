"""Results as strict JSON and back, from the dataclasses' type hints.

The JSON of a Result is its fields, recursively, as plain JSON values, with a
``"schema"`` number in front::

    {"schema": 4, "config": {"vcpus": 2, ..., "timeout_s": "inf"}, "seconds": 0.54,
     ..., "vcpus": [{"index": 0, ...}], "readers": [...], "host": {...}}

It is strict JSON that jq and every other reader accepts: a float that is not
finite (``timeout_s=math.inf``) is written as the string "inf", "-inf" or
"nan", and read back as that float wherever the field is a float.

Only what uffdkvm's own types hold is handled: frozen dataclasses, tuples
(``tuple[X, ...]``), ``dict[str, X]``, ``X | None``, int, float, str and
bool. Decoding is tolerant where that keeps old files readable and strict
where it catches real mistakes:

- a key the class does not have is a ResultError (a field a newer uffdkvm
  added: upgrade), but for what uffdkvm itself wrote there: the derived
  values of ``to_dict()`` (``per_vcpu_rate``) and the fields older versions
  had (:data:`FORMER_KEYS`), which are dropped;
- a missing field takes its default (``host`` is None in JSON written before
  hosts were recorded); a missing field without a default is a ResultError;
- a value of the wrong type is a ResultError naming where it is
  (``$.vcpus[1].seconds``), and so is one its class refuses (a Config
  field out of range, a histogram whose counts do not add up);
- a ``schema`` newer than this uffdkvm knows is a ResultError;
- so is text over ``max_bytes`` (:data:`MAX_JSON_BYTES`), bytes that are
  not UTF-8, and JSON nested deeper than Python's recursion limit: whatever
  the input, from_json raises a ResultError and nothing else.

What the values mean (counts non-negative, totals the sums of their parts)
is checked after decoding, by the class's own check (Result's is
uffdkvm._invariants).

``schema`` is raised when an existing field changes meaning or type; older
schemas are read by migrating them first (:data:`MIGRATIONS`).

Schema 2 (uffdkvm 0.2): a fault's stages got their own names. VcpuStats'
``fault_latency`` (read to resolved) became ``service_latency``, and
``fault_latency`` now means the whole fault, raised to resumed;
ReaderStats' ``latency`` became ``service_latency``; FaultTrace's
``start_ns``/``end_ns`` became ``read_ns``/``resolved_ns``; Result's
``seconds`` became demand_paging_test's window (threads created to joined),
the old narrower window being ``kvm_run_seconds``. A schema 1 file recorded
only that narrower window: it is read into both.

Schema 3: VcpuStats' ``faults`` counts resolved faults, as Result's and
ReaderStats' do, and ``eexist`` the vCPU's messages found already resolved;
schema 2 counted both in ``faults``. A schema 2 file whose readers met no
EEXIST is read exactly (``eexist`` 0); otherwise its per-vCPU split is
unknown and read as None. Non-finite floats are strings (schema 2 wrote
``Infinity``, which is still read).

Schema 4: one name per counter from the core to the Result, and the
run's sums of its readers' counters counted by the core. Result's
``prefetch_wakes`` (every reader's UFFDIO_WAKEs after EEXIST, which happen
with or without prefetch) is ``wakes``, as ReaderStats names the same
count; ``eexist``, ``spurious_wakeups``, ``source_bytes`` and
``source_seconds``, which schema 3 left for Python to sum from the
readers, are fields, and a schema 3 file gets them summed from its
readers.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import reprlib
import sys
import types
import typing
from typing import Any

from ..errors import ResultError

SCHEMA = 4

#: The most text from_json reads, by default: 1 GiB. A Result's JSON is some
#: kilobytes, a fault trace adds about 100 bytes a fault and the touch order
#: 6 a page (4 GiB of 4 KiB pages traced: some 110 MiB); past this, parsing
#: alone would take the memory of the machine (Python's objects are some ten
#: times the text).
MAX_JSON_BYTES = 1 << 30

#: Keys uffdkvm itself wrote that are not fields (any more), by class:
#: to_dict()'s derived values, and fields older versions had (found in
#: git history), dropped when read. Any other unknown key is a ResultError.
FORMER_KEYS: dict[str, frozenset[str]] = {
    "Result": frozenset({"per_vcpu_rate"}),
    "PageServerStats": frozenset({"queue_seconds_total", "queue_seconds_max"}),
}

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _float_text(x: float) -> str:
    return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def encode(obj: Any) -> Any:
    """obj as plain, strict JSON values: dataclasses as dicts, tuples as
    lists, non-finite floats as "inf", "-inf" or "nan"."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return _float_text(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise ResultError(f"cannot write a {type(obj).__name__} as JSON: {obj!r}")


def to_json(obj: Any, **dumps_kwargs: Any) -> str:
    """The JSON of a dataclass, ``schema`` first. Keywords go to json.dumps;
    the output is strict JSON (allow_nan=False)."""
    return json.dumps({"schema": SCHEMA, **encode(obj)}, allow_nan=False, **dumps_kwargs)


def from_json(cls: type, text: str | bytes, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A cls from the JSON that :func:`to_json` wrote (or ``to_dict()`` output).
    Raises ResultError, and only that, for anything else (see the module
    docstring)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ResultError(f"$: expected JSON text (str or bytes), not {type(text).__name__}")
    if len(text) > max_bytes:
        unit = "characters" if isinstance(text, str) else "bytes"
        raise ResultError(f"$: {len(text)} {unit} of JSON, more than the {max_bytes} "
                          f"read at most (max_bytes=): not a Result, or pass a larger "
                          f"max_bytes")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResultError(f"$: not UTF-8 text: {e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError; an integer of over 4300 digits
        raise ResultError(f"$: not JSON: {_short(str(e))}") from None
    except RecursionError:
        raise ResultError(f"$: nested deeper than Python's recursion limit "
                          f"({sys.getrecursionlimit()}): not a Result") from None
    if not isinstance(data, dict):
        raise ResultError(f"$: expected a JSON object for {cls.__name__}, "
                          f"not {type(data).__name__}")
    try:
        schema = data.get("schema", _schema_of_unmarked(data))
    except (TypeError, AttributeError) as e:
        raise ResultError(f"$: not a {cls.__name__} of any schema ({e})") from None
    if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
        raise ResultError(f"$.schema: {_shown(schema)} is not a schema this uffdkvm "
                          f"reads (1 to {SCHEMA}); upgrade uffdkvm to read this file")
    for version in range(schema, SCHEMA):
        try:
            data = MIGRATIONS[version](data)
        except (TypeError, AttributeError, ValueError) as e:
            # a migration sums and renames what the old schema held; values
            # of the wrong type there are decode's to name, this is the rest
            raise ResultError(f"$: not a {cls.__name__} of schema {version} "
                              f"({type(e).__name__}: {_short(str(e))})") from None
    return decode(cls, data)


def _short(text: str, limit: int = 120) -> str:
    """text cut to limit characters: a message names a value, it does not
    repeat a megabyte of it."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# A value's repr in a message: a few levels and items of it, made without
# walking the rest (a repr of the whole would take as long as the value is
# large, and recurse as deep as it nests).
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 6, 60, 60


def _shown(value: Any) -> str:
    return _short(_REPR.repr(value))


def _schema_of_unmarked(data: dict[str, Any]) -> int:
    """The schema of a dict with no "schema" key (older ``to_dict()`` output
    and ``uffdkvm --json`` of before schema 3), told by its shape: schema 3
    gave every vCPU an eexist count, schema 2 renamed the latency fields;
    schema 4 gave the run an eexist count of its own."""
    vcpus = [v for v in data.get("vcpus") or [] if isinstance(v, dict)]
    readers = [r for r in data.get("readers") or [] if isinstance(r, dict)]
    if not vcpus or all("eexist" in v for v in vcpus):
        return SCHEMA if "eexist" in data and "prefetch_wakes" not in data else 3
    # Schema 2 has fault_latency too (raised -> resumed); schema 1 had it
    # where service_latency is now, and readers' latency.
    if any("fault_latency" in v and "service_latency" not in v for v in vcpus) or \
            any("latency" in r for r in readers):
        return 1
    return 2


def _renamed(d: Any, renames: dict[str, str]) -> Any:
    if not isinstance(d, dict):
        return d
    return {renames.get(k, k): v for k, v in d.items()}


def _migrate_1_to_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: the stage names (see the module docstring)."""
    data = dict(data)
    if isinstance(data.get("vcpus"), list):
        data["vcpus"] = [_renamed(v, {"fault_latency": "service_latency"})
                         for v in data["vcpus"]]
    if isinstance(data.get("readers"), list):
        data["readers"] = [_renamed(r, {"latency": "service_latency"})
                           for r in data["readers"]]
    trace = data.get("fault_trace")
    if isinstance(trace, dict):
        trace = _renamed(trace, {"start_ns": "read_ns", "end_ns": "resolved_ns"})
        n = len(trace.get("read_ns") or [])
        trace.setdefault("raised_ns", [None] * n)
        trace.setdefault("resumed_ns", [None] * n)
        trace.setdefault("write", [None] * n)
        data["fault_trace"] = trace
    if "seconds" in data and "kvm_run_seconds" not in data:
        data["kvm_run_seconds"] = data["seconds"]
    return data


def _migrate_2_to_3(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: VcpuStats' faults without EEXIST (see the module docstring)."""
    data = dict(data)
    readers = data.get("readers")
    eexist = sum(r.get("eexist", 0) for r in readers if isinstance(r, dict)) \
        if isinstance(readers, list) else None
    if isinstance(data.get("vcpus"), list):
        vcpus = []
        for v in data["vcpus"]:
            if isinstance(v, dict) and v.get("faults") is not None:
                # No EEXIST anywhere: every message was a resolved fault.
                v = {**v, "eexist": 0} if eexist == 0 else {**v, "faults": None}
            vcpus.append(v)
        data["vcpus"] = vcpus
    return data


def _migrate_3_to_4(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 -> 4: Result's prefetch_wakes is wakes, and the readers'
    sums are fields (see the module docstring)."""
    data = {"wakes" if k == "prefetch_wakes" else k: v for k, v in data.items()}
    readers = [r for r in data.get("readers") or [] if isinstance(r, dict)]

    def total(name: str) -> Any:
        values = [r[name] for r in readers if isinstance(r.get(name), (int, float))]
        return sum(values) if values else None

    data.setdefault("eexist", total("eexist") or 0)
    data.setdefault("spurious_wakeups", total("spurious_wakeups") or 0)
    pusher = data.get("pusher_source_bytes")
    data.setdefault("source_bytes", (total("source_bytes") or 0) +
                    (pusher if isinstance(pusher, int) else 0))
    data.setdefault("source_seconds", total("source_seconds"))
    return data


# MIGRATIONS[n]: JSON data of schema n -> schema n + 1.
MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4}


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """cls's resolved type hints (cached)."""
    return typing.get_type_hints(cls)


def _fail(path: str, hint: Any, value: Any) -> ResultError:
    name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    return ResultError(f"{path}: expected {name}, not {_shown(value)}")


def decode(hint: Any, value: Any, path: str = "$") -> Any:
    """value (plain JSON data) as an instance of the type ``hint``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin is typing.Union or origin is types.UnionType:  # X | None
        if value is None and type(None) in args:
            return None
        arms = [arm for arm in args if arm is not type(None)]
        if len(arms) == 1:  # X | None: X's own error, which says where inside
            return decode(arms[0], value, path)
        for arm in args:
            if arm is not type(None):
                try:
                    return decode(arm, value, path)
                except ResultError:
                    continue
        raise _fail(path, hint, value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _fail(path, hint, value)
        hints = type_hints(hint)
        fields = dataclasses.fields(hint)
        unknown = set(value) - {f.name for f in fields} - \
            FORMER_KEYS.get(hint.__name__, frozenset())
        if path == "$":
            unknown.discard("schema")
        if unknown:
            key = sorted(unknown)[0]
            raise ResultError(f"{path}.{_short(key, 60)}: not a field of {hint.__name__} "
                              f"({len(unknown)} unknown key{'s' * (len(unknown) > 1)}): "
                              f"written by a newer uffdkvm (upgrade it), or not a "
                              f"{hint.__name__}")
        kwargs = {}
        for f in fields:
            if f.name in value:
                kwargs[f.name] = decode(hints[f.name], value[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ResultError(f"{path}: no {f.name!r}, which {hint.__name__} requires")
        try:
            return hint(**kwargs)
        except ResultError as e:
            raise ResultError(f"{path}: {e}") from None
        except (ValueError, TypeError) as e:  # ConfigError is a ValueError
            raise ResultError(f"{path}: not a valid {hint.__name__}: {_short(str(e), 300)}") \
                from None
    if origin is tuple:  # tuple[X, ...]
        if not isinstance(value, list):
            raise _fail(path, hint, value)
        return tuple(decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:  # dict[str, X]
        if not isinstance(value, dict):
            raise _fail(path, hint, value)
        return {k: decode(args[1], v, f"{path}[{k!r}]") for k, v in value.items()}
    if hint is float:
        if isinstance(value, str) and value in _NONFINITE:
            return _NONFINITE[value]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint in (str, bool) and isinstance(value, hint):
        return value
    raise _fail(path, hint, value)
