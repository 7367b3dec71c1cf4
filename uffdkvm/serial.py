"""Results as JSON and back, generically from the dataclasses' type hints.

The JSON of a Result is its fields, recursively, as plain JSON values, with a
``"schema"`` number in front::

    {"schema": 1, "config": {"vcpus": 2, ...}, "seconds": 0.54, ...,
     "vcpus": [{"index": 0, ...}], "readers": [...], "kvm_stats": {...},
     "host": {"kernel_release": "6.12.0", ...}}

Dataclasses and NamedTuples become objects keyed by field name, lists and
tuples arrays, dicts objects (keys as strings), enums their values. Decoding
walks the type hints of the class, so a field added later, of any nested
dataclass type, round-trips without touching this module. Decoding is
tolerant where that keeps old files readable and strict where it catches
real mistakes:

- a key the class does not have (a derived value such as ``per_vcpu_rate``
  from ``to_dict()``, or a field a newer uffdkvm added) is ignored;
- a missing field takes its default (``host`` is None in JSON written before
  hosts were recorded); a missing field without a default is a ValueError;
- a value of the wrong type is a ValueError naming where it is
  (``$.vcpus[1].seconds``);
- a ``schema`` newer than this uffdkvm knows is a ValueError.

``schema`` is raised only when an existing field changes meaning or type;
added fields do not need it. Older schemas are read by migrating them first
(:data:`MIGRATIONS`).

Schema 2 (uffdkvm 0.2): a fault's stages got their own names. VcpuStats'
``fault_latency`` (read to resolved) became ``service_latency``, and
``fault_latency`` now means the whole fault, raised to resumed;
ReaderStats' ``latency`` became ``service_latency``; FaultTrace's
``start_ns``/``end_ns`` became ``read_ns``/``resolved_ns``; Result's
``seconds`` became demand_paging_test's window (threads created to joined),
the old narrower window being ``kvm_run_seconds``. A schema 1 file recorded
only that narrower window: it is read into both.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from collections import abc
from typing import Any, Union

SCHEMA = 2

_NoneType = type(None)


def encode(obj: Any) -> Any:
    """obj as plain JSON-ready values (dataclasses and NamedTuples as dicts)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {k: encode(v) for k, v in zip(obj._fields, obj)}
    if isinstance(obj, enum.Enum):
        return encode(obj.value)
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k) if isinstance(k, (int, float, bool)) else k: encode(v)
                for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON: {obj!r}")


def to_json(obj: Any, **dumps_kwargs: Any) -> str:
    """The JSON of a dataclass, ``schema`` first. Keywords go to json.dumps."""
    return json.dumps({"schema": SCHEMA, **encode(obj)}, **dumps_kwargs)


def from_json(cls: type, text: str | bytes) -> Any:
    """A cls from the JSON that :func:`to_json` wrote (or ``to_dict()`` output)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"$: expected a JSON object for {cls.__name__}, "
                         f"not {type(data).__name__}")
    schema = data.get("schema", SCHEMA)
    if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
        raise ValueError(f"$.schema: {schema!r} is not a schema this uffdkvm reads "
                         f"(1 to {SCHEMA}); upgrade uffdkvm to read this file")
    for version in range(schema, SCHEMA):
        data = MIGRATIONS[version](data)
    return decode(cls, data)


def _renamed(d: Any, renames: dict) -> Any:
    if not isinstance(d, dict):
        return d
    return {renames.get(k, k): v for k, v in d.items()}


def _migrate_1_to_2(data: dict) -> dict:
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


# MIGRATIONS[n]: JSON data of schema n -> schema n + 1.
MIGRATIONS = {1: _migrate_1_to_2}


@functools.cache
def type_hints(cls: type) -> dict:
    """cls's resolved type hints (cached)."""
    return typing.get_type_hints(cls)


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _fail(path: str, hint: Any, value: Any) -> ValueError:
    return ValueError(f"{path}: expected {_name(hint)}, not {value!r}")


def decode(hint: Any, value: Any, path: str = "$") -> Any:
    """value (plain JSON data) as an instance of the type ``hint``."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)

    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        if value is None:
            if _NoneType in args:
                return None
            raise _fail(path, hint, value)
        if type(value) in args:  # an exact match wins: Union[int, str] keeps 5 an int
            return value
        for arm in args:
            if arm is _NoneType:
                continue
            try:
                return decode(arm, value, path)
            except (ValueError, TypeError):
                continue
        raise _fail(path, hint, value)

    if origin is typing.Literal:
        if value in args:
            return value
        raise _fail(path, hint, value)

    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _fail(path, hint, value)
        hints = type_hints(hint)
        kwargs = {}
        for f in dataclasses.fields(hint):
            if not f.init:
                continue
            if f.name in value:
                kwargs[f.name] = decode(hints[f.name], value[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{path}: no {f.name!r}, which {hint.__name__} requires")
        return hint(**kwargs)

    if isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields"):
        hints = type_hints(hint)
        if isinstance(value, list):
            value = dict(zip(hint._fields, value))
        if not isinstance(value, dict):
            raise _fail(path, hint, value)
        return hint(**{k: decode(hints.get(k, Any), value[k], f"{path}.{k}")
                       for k in hint._fields if k in value})

    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise _fail(path, hint, value) from None

    if origin in (list, tuple, abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, list):
            raise _fail(path, hint, value)
        if origin is tuple or hint is tuple:
            if not args:
                return tuple(value)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
            if len(args) != len(value):
                raise _fail(path, hint, value)
            return tuple(decode(a, v, f"{path}[{i}]")
                         for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        return [decode(item, v, f"{path}[{i}]") for i, v in enumerate(value)]

    if origin in (dict, abc.Mapping) or hint is dict:
        if not isinstance(value, dict):
            raise _fail(path, hint, value)
        key_hint, value_hint = args if args else (Any, Any)
        return {_key(key_hint, k, path): decode(value_hint, v, f"{path}[{k!r}]")
                for k, v in value.items()}

    if hint is _NoneType or hint is None:
        if value is None:
            return None
        raise _fail(path, hint, value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, hint, value)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(path, hint, value)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(path, hint, value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise _fail(path, hint, value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _fail(path, hint, value)


def _key(hint: Any, key: str, path: str) -> Any:
    """A dict key back from its JSON string."""
    if hint in (Any, str):
        return key
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise ValueError(f"{path}: key {key!r} is not an int") from None
    if hint is float:
        return float(key)
    return decode(hint, key, path)
