"""What one experiment does: :class:`Config`, validated on construction.

Its fields come from uffdkvm/schema/fields.py, the one declaration of every field;
the rules come from the core's validator (uffdkvm._core.validate), the one
validator: Config normalizes each field's Python form (written once per kind
of field) and hands the result to it.
"""
from __future__ import annotations

import dataclasses
import numbers
import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsIndex

from . import _core
from . import _touchorder as touchorder
from .errors import ConfigError
from .schema import fields as schema

# From the schema, under the names callers of this module have used.
BACKING_PAGE_SIZES = schema.BACKING_PAGE_SIZES
GUEST_PAGE_SIZES = schema.GUEST_PAGE_SIZES
MAX_ZIPF_THETA = schema.MAX_ZIPF_THETA
MAX_CPU = schema.LIMITS["MAX_CPU"]

PAGE_SIZE = 4096
BACKINGS = schema.choices("backing")
# Each backing's properties are the schema's (schema.BACKINGS), which the core reads too.
SHARED_BACKINGS = schema.backings_where("shared")
HUGETLB_BACKINGS = schema.backings_where("hugetlb")
# What UFFDIO_MOVE moves pages into: private anonymous memory (resolve="move").
MOVE_BACKINGS = schema.backings_where("private_anonymous")
UFFD_MODES = schema.choices("uffd_mode")
#: Backings uffd_mode="wp" runs on: 4 KiB pages, saved and verified one at a time.
WP_BACKINGS = schema.backings_where("wp")
WAITS = schema.choices("wait")
RESOLVERS = schema.choices("resolver")
PATTERNS = schema.choices("pattern")
# The guest's access models (touch_percent, access): csrc/experiment/access.c.
ACCESSES = schema.choices("access")
RESOLVES = schema.choices("resolve")
DELAY_DISTS = schema.choices("delay_dist")
STATS = schema.choices("stats")
#: Where a resolved page's bytes come from.
SOURCES = schema.choices("source")
SOURCE_READS = schema.choices("source_read")
SOURCE_CACHES = schema.choices("source_cache")
#: Prefetch policies (uffd_mode="missing" with resolve="copy" only).
PREFETCHES = schema.choices("prefetch")
# source="remote": how the readers reach the page server (uffdkvm/pages/server.py).
REMOTE_TRANSPORTS = schema.choices("remote_transport")

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_KIND_MAX = {"u32": (1 << 32) - 1, "u64": (1 << 64) - 1}


def _is_bool(value: Any) -> bool:
    """A bool, or numpy's (np.bool_, np.bool in numpy 2)."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy"
                                       and kind.__name__ in ("bool_", "bool"))


def _as_int(value: Any) -> int | None:
    """value as an int if it is an integer (a numpy integer too), else None.
    A bool is not one: True is no count of anything."""
    if _is_bool(value):
        return None
    try:
        return int(operator.index(value))
    except TypeError:
        return None


def parse_size(value: int | str, field: str = "size") -> int:
    """Bytes from an int (a numpy integer too) or a string such as "64M",
    "1G", "4096" or "2GiB"."""
    number = _as_int(value)
    if number is not None:
        return number
    if not isinstance(value, str):
        raise ConfigError(f"{field}: expected bytes as an int or a string like '64M', "
                          f"not {value!r}", field=field)
    m = _SIZE_RE.match(value)
    if not m:
        raise ConfigError(f"{field}: {value!r} is not a size; give bytes, or a number "
                          f"with K, M, G or T (powers of 1024), e.g. '64M'", field=field)
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


def format_size(n: int) -> str:
    """The shortest exact K/M/G/T spelling of n bytes: 67108864 -> '64M'."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _SIZE_UNITS[unit] == 0:
            return f"{n // _SIZE_UNITS[unit]}{unit}"
    return str(n)


def parse_cpu_list(text: str, words: tuple[str, ...] = ()) -> tuple[int, ...]:
    """CPU numbers from a string like "0,2,3" (the one parser: Config and
    the CLI's -c and --pin-* both use it). Raises ConfigError (a ValueError,
    its field the caller's to name) saying why; ``words`` are the other
    strings the field takes (pin_readers: "vcpus", "scheduler"), which the
    message for text that is no list of numbers names."""
    try:
        cpus = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        if words:
            raise ConfigError(f"{text!r} is not {', '.join(map(repr, words))} or a list of "
                              f"CPU numbers like '0,1'") from None
        raise ConfigError(f"{text!r} is not a list of CPU numbers like '0,1'") from None
    if not cpus:
        raise ConfigError(f"{text!r} names no CPU; give a list of CPU numbers like '0,1'")
    if any(cpu < 0 for cpu in cpus):
        raise ConfigError(f"{text!r}: CPU numbers are 0 or more")
    return cpus


def _choice(field: str, value: Any, choices: tuple[str, ...], none: str = "") -> str:
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    raise ConfigError(f"{field}: {value!r} is not one of {', '.join(map(repr, choices))}"
                      f"{none}", field=field)


def _range_text(f: schema.Field, kind_max: int) -> str:
    low = f.min if f.min is not None else 0
    high = f.max if f.max is not None else kind_max
    return f"between {low} and {high}"


def _integer(f: schema.Field, value: Any, *, python_side: bool = False) -> int:
    """An integer field: an int (a numpy integer too) that the core's kind
    holds; a Python-side field's range is checked here, from the schema, a
    core field's by the core."""
    number = _as_int(value)
    if number is None:
        raise ConfigError(f"{f.name}: expected an int, not {value!r}", field=f.name)
    kind_max = _KIND_MAX[f.kind]
    low, high = 0, kind_max
    if python_side or f.form == "optional":
        low = int(f.min) if f.min is not None else 0
        high = int(f.max) if f.max is not None else kind_max
    if not low <= number <= high:
        raise ConfigError(f"{f.name}: must be {_range_text(f, kind_max)}, not {number}",
                          field=f.name)
    return number


def _flag(field: str, value: Any) -> bool:
    if _is_bool(value):
        return bool(value)
    raise ConfigError(f"{field}: expected True or False, not {value!r}", field=field)


def _cpus(field: str, value: Any, words: tuple[str, ...] = ()) -> tuple[int, ...] | None:
    """None, or a non-empty tuple of CPU numbers (from any iterable of them, a
    single number, or a string like "0,2,3"); ``words``: the strings the
    field takes besides, for the messages."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_cpu_list(value, words)
        except ConfigError as e:
            raise ConfigError(f"{field}: {e}", field=field) from None
    if _as_int(value) is not None:
        value = [value]
    if isinstance(value, (set, frozenset)):
        raise ConfigError(f"{field}: a set has no order, and CPUs are assigned round-robin "
                          f"in the order given: use a list, not {value!r}", field=field)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)):
        value = list(value)
    if not isinstance(value, list) or not value:
        also = "".join(f"{w!r}, " for w in words)
        raise ConfigError(f"{field}: expected {also}{'or ' if words else ''}a non-empty list "
                          f"of CPU numbers, not {value!r}", field=field)
    out = []
    for cpu in value:
        number = _as_int(cpu)
        if number is None or not 0 <= number < 1 << 31:
            raise ConfigError(f"{field}: {cpu!r} is not a CPU number: expected an int "
                              f"between 0 and {MAX_CPU}", field=field)
        out.append(number)
    return tuple(out)


def read_touch_order(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """The page indices a file that :meth:`Result.save_touch_order` wrote
    holds: one non-negative integer a line, blank lines and lines starting
    with ``#`` skipped. Raises ConfigError (field ``replay_from``) naming
    the path and the line that is not one (or is longer than 4 KiB, or not
    UTF-8, or cut short), or saying why the path cannot be read: only a
    regular file is (not a FIFO, a device or a directory)."""
    return _read_touch_order(path)[0]


def _read_touch_order(path: str | os.PathLike[str], max_pages: int | None = None,
                      field: str = "replay_from") -> tuple[tuple[int, ...], int | None]:
    try:
        return touchorder.read(path, max_pages=max_pages)
    except touchorder.FormatError as e:
        raise ConfigError(f"{field}: {e}", field=field) from None


def _page_list(value: Any, page_size: int, region_pages: int, field: str) -> tuple[int, ...]:
    """A page_list field (replay_from, preinstall) as a tuple of page
    indices: read from a path, or from any sequence of integers. A file
    recorded with pages of another size than page_size is refused: its
    indices would name other memory. Neither is read past region_pages + 1
    entries (each page is named once), so a huge file or an endless
    iterator fails early; a file's pages are checked line by line, a
    sequence's by the core (each a page of the region, none twice)."""
    if isinstance(value, (str, os.PathLike)):
        order, recorded = _read_touch_order(value, region_pages, field)
        if recorded is not None and recorded != page_size:
            raise ConfigError(f"{field}: {os.fspath(value)!r} counts {recorded}-byte "
                              f"pages, and this run's backing has {page_size}-byte pages; "
                              f"record the order with the same backing", field=field)
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict, set, frozenset)):
        pages: list[int] = []
        for v in value:
            number = _as_int(v)
            if number is None or number < 0 or number >= 1 << 64:
                raise ConfigError(f"{field}: {v!r} is not a page index (a non-negative "
                                  f"int)", field=field)
            if len(pages) == region_pages:
                raise ConfigError(f"{field}: more than the region's {region_pages} pages: "
                                  f"each page is named once", field=field)
            pages.append(number)
        order = tuple(pages)
    else:
        raise ConfigError(f"{field}: expected a path to a touch order file or a sequence "
                          f"of page indices, not {value!r}", field=field)
    if not order and field == "replay_from":
        raise ConfigError("replay_from: no pages: replay needs the order of at least one "
                          "(Result.touch_order of an earlier run)", field="replay_from")
    return order


def _page_size(field: str, value: Any) -> str:
    number = _as_int(value)
    if number is not None:
        for name, size in GUEST_PAGE_SIZES.items():
            if size == number:
                return name
    if isinstance(value, str) and value.upper().replace("IB", "").replace("B", "") \
            in GUEST_PAGE_SIZES:
        return value.upper().replace("IB", "").replace("B", "")
    raise ConfigError(f"{field}: {value!r} is not one of '4K', '2M', '1G'", field=field)


# A CPU list as Config takes it: "0,2,3", one number, or any iterable of them.
CpuList = str | SupportsIndex | Iterable[SupportsIndex]
PIN_WITH_VCPUS = "vcpus"  # pin_readers: each reader on the CPU of the vCPU it serves
PIN_SCHEDULER = "scheduler"  # pin_readers: unpinned, where the scheduler puts them (upstream's)
#: The words pin_readers takes besides a CPU list.
PIN_WORDS = (PIN_WITH_VCPUS, PIN_SCHEDULER)


def _normalize(c: Any, f: schema.Field, value: Any) -> Any:
    """A field's value in its stored form, from any form Config takes:
    written once per kind (and form) of field, not once per field."""
    python_side = f.core_name is None
    if f.form == "size":
        return _integer(f, parse_size(value, f.name), python_side=python_side)
    if f.form == "page_size":
        return _page_size(f.name, value)
    if f.form == "none_choice" and (value is None or
                                    (isinstance(value, str) and value.lower() == "none")):
        return None
    if f.form == "seconds":
        if value is None:
            return None
        if _is_bool(value) or not isinstance(value, numbers.Real) or not float(value) > 0:
            raise ConfigError(f"{f.name}: expected a positive number of seconds, math.inf "
                              f"or None, not {value!r}", field=f.name)
        return float(value)
    if f.form == "pin_readers" and isinstance(value, str) and \
            value.strip().lower() == PIN_WITH_VCPUS:
        # (resolver="vcpu": no readers, the applies rule's error instead, which
        # pin_vcpus would not cure; resolver comes before pin_readers)
        if c.pin_vcpus is None and c.resolver == "readers":
            raise ConfigError(
                f"{f.name}: {PIN_WITH_VCPUS!r} runs each reader on its vCPU's CPU, so the "
                f"vCPUs need CPUs: set pin_vcpus too (e.g. pin_vcpus='0,1'; -c or "
                f"--pin-vcpus on the command line)", field=f.name)
        return PIN_WITH_VCPUS
    if f.form == "pin_readers" and isinstance(value, str) and \
            value.strip().lower() == PIN_SCHEDULER:
        return PIN_SCHEDULER
    if f.form == "page_list":
        page_size = BACKING_PAGE_SIZES[c.backing]
        # Rounded up: a region that is no whole number of pages is mem_per_vcpu's error.
        pages = -(-c.region_bytes // page_size)
        return None if value is None else _page_list(value, page_size, pages, f.name)
    if f.form == "path":
        if value is None:
            return None
        try:
            path = os.fspath(value)
        except TypeError:
            path = None
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ConfigError(f"{f.name}: expected the path of a file (a str or "
                              f"os.PathLike), not {value!r}", field=f.name)
        return path
    if f.form == "address":
        if value is None:
            return None
        if not isinstance(value, str) or "\x00" in value or \
                not value.startswith(("unix:/", "tcp:")):
            raise ConfigError(f"{f.name}: expected a page server's address, "
                              f"\"unix:/path/to/socket\" or \"tcp:HOST:PORT\", not {value!r}",
                              field=f.name)
        return value
    if f.form in ("optional", "wait") and value is None:
        return None
    if f.kind in ("u32", "u64"):
        return _integer(f, value, python_side=python_side)
    if f.kind == "bool":
        return _flag(f.name, value)
    if f.kind == "enum":
        none = " or None" if f.form == "none_choice" else ""
        return _choice(f.name, value, schema.choices(f.name), none)
    if f.kind == "double":
        if _is_bool(value) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{f.name}: expected a number, not {value!r}", field=f.name)
        return float(value)
    if f.kind == "cpus":
        return _cpus(f.name, value, PIN_WORDS if f.form == "pin_readers" else ())
    raise AssertionError(f"{f.name}: no normalizer for kind {f.kind!r}")


def _check_python_side(c: Any) -> None:
    """The applies rules of what the core cannot see, from the schema, as the
    core checks its own fields' (the same message): the Python-side fields',
    and pin_readers' words ("vcpus", "scheduler"), which reach the core as
    Config.reader_cpus (None for "scheduler", the core's default)."""
    for f in schema.CONFIG_FIELDS:
        if not f.applies:
            continue
        if f.core_name is not None and not (f.form == "pin_readers" and
                                            isinstance(getattr(c, f.name), str)):
            continue
        for other, values in f.applies:
            o = schema.BY_NAME[other]
            here = getattr(c, other)
            if here not in [schema.python_value(o, v) for v in values] and \
                    getattr(c, f.name) != f.default:
                text = schema.applies_text(f)
                raise ConfigError(f"{f.name}: applies to {text} only, not {other}="
                                  f"{schema.python_repr(o, here)}; set {text} or leave "
                                  f"{f.name} at its default ({schema.python_repr(f, f.default)})",
                                  field=f.name)


def _check_wait(c: Any) -> None:
    """wait="spin_idle" needs readers with CPUs: its readers run only when
    their CPU has nothing else to run, which beside a pinned vCPU is when the
    vCPU has blocked in a fault; unpinned, such a reader would run wherever
    the scheduler found a CPU idle."""
    if c.wait != schema.WAIT_BESIDE_VCPUS or c.uffd_mode is None or c.resolver != "readers":
        return
    if c.reader_cpus is None:
        raise ConfigError(
            f"wait: {schema.WAIT_BESIDE_VCPUS!r} runs pinned readers at SCHED_IDLE, and these "
            f"readers are not pinned (pin_readers={c.pin_readers!r}, pin_vcpus="
            f"{c.pin_vcpus!r}): set pin_vcpus (the readers then go with their vCPUs; -c on "
            f"the command line) or pin_readers, or choose another wait", field="wait")


# The fields that shape the page server run() starts, which a server at
# source_address (someone else's) does not take from the Config.
_STARTED_SERVER_FIELDS = ("remote_transport", "remote_latency_us", "remote_bandwidth_mbps",
                          "max_inflight")


def _check_remote(c: Any) -> None:
    """source="remote": a server already running (source_address, with its
    key file and an optional local copy) or one run() starts (source_path)."""
    if c.source != "remote":
        return
    if c.source_address is None:
        if c.source_path is None:
            raise ConfigError("source_path: source='remote' needs the snapshot the page "
                              "server run() starts serves (or source_address: a server "
                              "already running); write one with uffdkvm.make_snapshot(path, "
                              "config.region_bytes)", field="source_path")
        if c.source_key_file is not None:
            raise ConfigError("source_key_file: the key of the server at source_address; "
                              "the server run() starts gets a fresh key of its own: give "
                              "source_address too, or leave source_key_file at None",
                              field="source_key_file")
        return
    for name in _STARTED_SERVER_FIELDS:
        f = schema.BY_NAME[name]
        if getattr(c, name) != f.default:
            raise ConfigError(f"{name}: shapes the page server run() starts; the server at "
                              f"source_address ({c.source_address}) has its own (uffdkvm "
                              f"serve --latency-us, ...): leave {name} at its default "
                              f"({schema.python_repr(f, f.default)})", field=name)


# A stand-in for the page server's address while a Config is checked: run()
# starts the server and gives the core its real address.
_SERVER_PENDING = "unix:(the page server run() starts)"


def core_config(c: Config, source_address: str | None = None,
                source_key_file: str | None = None) -> dict[str, Any]:
    """The dict the core takes: every core field of the schema, by its
    struct member's name, as the core holds it. pin_readers goes as
    Config.reader_cpus, wait as Config.reader_wait, timeout_s as
    Config.effective_timeout_s;
    source_address and source_key_file, where given, are the server's that
    run() started."""
    out: dict[str, Any] = {}
    for f in schema.CORE_FIELDS:
        value: Any
        if f.name == "source_address":
            value = source_address if source_address is not None else \
                c.source_address if c.source_address is not None else \
                (_SERVER_PENDING if c.source == "remote" else None)
        elif f.name == "source_key_file" and source_key_file is not None:
            value = source_key_file
        elif f.form == "pin_readers":
            value = c.reader_cpus
        elif f.form == "wait":
            value = c.reader_wait
        elif f.form == "seconds":
            value = c.effective_timeout_s
        else:
            value = getattr(c, f.name)
        out[f.core_name or f.name] = schema.to_core_value(f, value)
    return out


def _field_of(message: str) -> str | None:
    """The field a core message names first ("readers: ..."), if a field."""
    name = message.partition(":")[0]
    return name if name in schema.BY_NAME else None


def _from_schema(cls: type) -> type:
    """Config's dataclass fields, defaults and docstring, from the schema."""
    cls.__annotations__ = {f.name: schema.stored_type(f) for f in schema.CONFIG_FIELDS}
    for f in schema.CONFIG_FIELDS:
        setattr(cls, f.name, f.default)
    lines = []
    for f in schema.CONFIG_FIELDS:
        default = "None" if f.default is None else schema.python_repr(f, f.default)
        applies = schema.applies_text(f)
        more = f"; applies with {applies}" if applies else ""
        lines.append(f"    {f.name}  (default {default}{more})\n        {f.doc}")
    cls.__doc__ = (cls.__doc__ or "") + "\n".join(lines) + "\n"
    return cls


@dataclass(frozen=True)
@_from_schema
class Config:
    """One experiment. Fields are checked when the Config is made, so a bad
    value fails here (a ConfigError with the field's name in ``.field``),
    before any VM exists: each field's form here, every rule by the core's
    validator. Fields are stored in one form whatever form they were given
    in: numbers as int (numpy integers are accepted), sizes as bytes, choices
    in lower case, CPU lists as tuples. The fields (from uffdkvm/schema/fields.py;
    docs/config.md says more of each):

"""

    # BEGIN GENERATED by uffdkvm/schema/fields.py
    if TYPE_CHECKING:
        # What Config stores and what its constructor takes, for type checkers;
        # at run time the dataclass fields come from uffdkvm/schema/fields.py.
        vcpus: int
        mem_per_vcpu: int
        backing: str
        uffd_mode: str | None
        single_uffd: bool
        resolver: str
        readers: int
        wait: str | None
        read_batch: int
        allow_oversubscribe: bool
        delay_us: int
        overlap: bool
        guest_work: int
        guest_page_size: str
        pattern: str
        seed: int
        write_percent: int
        passes: int
        resolve: str
        delay_dist: str
        pin_vcpus: tuple[int, ...] | None
        pin_readers: tuple[int, ...] | str | None
        prefault: bool
        stats: str
        guest_timing: bool
        trace_faults: bool
        record_touch_order: bool
        timeout_s: float | None
        wp_async: bool
        source: str
        source_path: str | None
        source_address: str | None
        source_key_file: str | None
        source_read: str
        source_cache: str
        touch_percent: int
        access: str
        zipf_theta: float | None
        accesses: int | None
        prefetch: str
        prefetch_pages: int
        prefetch_bandwidth_mbps: int
        replay_from: tuple[int, ...] | None
        preinstall: tuple[int, ...] | None
        remote_transport: str
        remote_latency_us: int
        remote_bandwidth_mbps: int
        max_inflight: int
        write_set: str
        dirty_tracking: str | None
        dirty_clear_pages: int
        dirty_ring_entries: int
        migration: str | None
        max_rounds: int
        downtime_target_ms: int
        precopy_rounds: int
        link_bandwidth_mbps: int
        link_latency_us: int
        migration_dump_path: str | None
        auto_converge: bool
        throttle_initial_percent: int
        throttle_increment_percent: int
        throttle_max_percent: int

        def __init__(
            self,
            vcpus: SupportsIndex = ...,
            mem_per_vcpu: SupportsIndex | str = ...,
            backing: str = ...,
            uffd_mode: str | None = ...,
            single_uffd: bool = ...,
            resolver: str = ...,
            readers: SupportsIndex = ...,
            wait: str | None = ...,
            read_batch: SupportsIndex = ...,
            allow_oversubscribe: bool = ...,
            delay_us: SupportsIndex = ...,
            overlap: bool = ...,
            guest_work: SupportsIndex = ...,
            guest_page_size: SupportsIndex | str = ...,
            pattern: str = ...,
            seed: SupportsIndex = ...,
            write_percent: SupportsIndex = ...,
            passes: SupportsIndex = ...,
            resolve: str = ...,
            delay_dist: str = ...,
            pin_vcpus: CpuList | None = ...,
            pin_readers: CpuList | None = ...,
            prefault: bool = ...,
            stats: str = ...,
            guest_timing: bool = ...,
            trace_faults: bool = ...,
            record_touch_order: bool = ...,
            timeout_s: float | None = ...,
            wp_async: bool = ...,
            source: str = ...,
            source_path: str | os.PathLike[str] | None = ...,
            source_address: str | None = ...,
            source_key_file: str | os.PathLike[str] | None = ...,
            source_read: str = ...,
            source_cache: str = ...,
            touch_percent: SupportsIndex = ...,
            access: str = ...,
            zipf_theta: float | None = ...,
            accesses: SupportsIndex | None = ...,
            prefetch: str = ...,
            prefetch_pages: SupportsIndex = ...,
            prefetch_bandwidth_mbps: SupportsIndex = ...,
            replay_from: str | os.PathLike[str] | Iterable[SupportsIndex] | None = ...,
            preinstall: str | os.PathLike[str] | Iterable[SupportsIndex] | None = ...,
            remote_transport: str = ...,
            remote_latency_us: SupportsIndex = ...,
            remote_bandwidth_mbps: SupportsIndex = ...,
            max_inflight: SupportsIndex = ...,
            write_set: str = ...,
            dirty_tracking: str | None = ...,
            dirty_clear_pages: SupportsIndex = ...,
            dirty_ring_entries: SupportsIndex = ...,
            migration: str | None = ...,
            max_rounds: SupportsIndex = ...,
            downtime_target_ms: SupportsIndex = ...,
            precopy_rounds: SupportsIndex = ...,
            link_bandwidth_mbps: SupportsIndex = ...,
            link_latency_us: SupportsIndex = ...,
            migration_dump_path: str | os.PathLike[str] | None = ...,
            auto_converge: bool = ...,
            throttle_initial_percent: SupportsIndex = ...,
            throttle_increment_percent: SupportsIndex = ...,
            throttle_max_percent: SupportsIndex = ...,
        ) -> None: ...
    # END GENERATED

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise through the back door
        for f in schema.CONFIG_FIELDS:
            put(self, f.name, _normalize(self, f, getattr(self, f.name)))
        _check_python_side(self)
        _check_wait(self)
        try:
            _core.validate(core_config(self))
        except _core.CoreError as e:
            message = e.args[2]
            raise ConfigError(message, field=_field_of(message)) from None
        _check_remote(self)

    @property
    def region_bytes(self) -> int:
        """Bytes of guest memory under test."""
        return self.mem_per_vcpu if self.overlap else self.mem_per_vcpu * self.vcpus

    @property
    def pages_per_vcpu(self) -> int:
        """4 KiB pages each vCPU touches per pass."""
        return self.mem_per_vcpu // PAGE_SIZE

    @property
    def page_size(self) -> int:
        """Bytes resolved per fault: the backing's page size."""
        return BACKING_PAGE_SIZES[self.backing]

    @property
    def effective_timeout_s(self) -> float:
        """The time limit a run of this Config gets: timeout_s, or when None a
        generous one: 60 s, plus 2 ms per page touched, plus twice the
        configured delay for every fault (as if no two delays overlapped),
        and with source="remote" twice the page server's time for every page
        (its latency and the page's time on its link, as if nothing
        overlapped: the faults' fetches and a prefetcher's, one by one)."""
        if self.timeout_s is not None:
            return self.timeout_s
        touched = max(self.pages_per_vcpu, self.accesses or 0) * self.vcpus * self.passes
        faults = self.region_bytes // self.page_size
        limit = 60.0 + 0.002 * touched + 2 * self.delay_us * 1e-6 * faults
        if self.source == "remote":
            link_s = self.page_size * 8 / (self.remote_bandwidth_mbps * 1e6) \
                if self.remote_bandwidth_mbps else 0.0
            limit += 2 * 2 * faults * (self.remote_latency_us * 1e-6 + link_s)
        return limit

    @property
    def uffds(self) -> int:
        """How many userfaultfds the run opens."""
        if self.uffd_mode is None:
            return 0
        return 1 if self.single_uffd or self.overlap else self.vcpus

    @property
    def reader_wait(self) -> str:
        """How the readers wait, as the core gets it: wait, or for wait=None
        "spin_idle" where each reader can share a CPU with the one vCPU it
        serves: a uffd per vCPU, the vCPUs pinned each to a CPU of its own,
        and pin_readers None or "vcpus". A reader then spins at SCHED_IDLE
        on its vCPU's CPU and runs the moment that vCPU blocks in a fault,
        with no wakeup at all. Otherwise "epoll_exclusive" (upstream's
        demand_paging_test's wait; pin_readers="scheduler" gives its
        placement too). Not with one uffd for several vCPUs: a reader
        there may take another CPU's vCPU's fault, and the vCPU it shares
        its CPU with, woken meanwhile, preempts it until that vCPU blocks
        again; nor with vCPUs that share a CPU, where a blocked vCPU's
        reader waits for the others to block too. A run without readers
        (uffd_mode None, resolver "vcpu") gets "epoll_exclusive", the
        core's default, which it does not use. A Result records it as it
        ran (Result.reader_wait)."""
        if self.wait is not None:
            return self.wait
        if self.uffd_mode is None or self.resolver != "readers" or self.pin_vcpus is None or \
                self.pin_readers not in (None, PIN_WITH_VCPUS) or self.uffds != self.vcpus:
            return schema.WAIT_SLEEPING
        pins = self.pin_vcpus
        vcpu_cpus = {pins[v % len(pins)] for v in range(self.vcpus)}
        return schema.WAIT_BESIDE_VCPUS if len(vcpu_cpus) == self.vcpus else schema.WAIT_SLEEPING

    @property
    def readers_with_vcpus(self) -> bool:
        """Whether each reader runs on the CPU of the vCPU it serves:
        pin_readers="vcpus", or by default (pin_readers None) whenever the
        vCPUs are pinned and the readers share their CPUs (every wait but
        "spin", whose readers need CPUs of their own). pin_readers="scheduler"
        leaves them where the scheduler puts them, as upstream's
        demand_paging_test does. False when the run has no readers
        (uffd_mode None, resolver "vcpu"); a CPU list is not this, even one
        that names the vCPUs' CPUs. A Result records it as it ran
        (Result.readers_with_vcpus)."""
        if self.uffd_mode is None or self.resolver != "readers":
            return False  # no readers
        if self.pin_readers == PIN_WITH_VCPUS:
            return True
        return self.pin_readers is None and self.pin_vcpus is not None and \
            self.reader_wait != "spin"

    @property
    def reader_cpus(self) -> tuple[int, ...] | None:
        """The CPU of every reader, in the core's order (reader k of all uffds,
        a uffd's readers together, runs on entry k modulo the length), or
        None: unpinned. pin_readers, with "vcpus" (and the default with
        pinned vCPUs, readers_with_vcpus) spelled out."""
        if not self.readers_with_vcpus:
            return None if isinstance(self.pin_readers, str) else self.pin_readers
        pins = self.pin_vcpus or ()
        # vCPU v runs on pins[v % len(pins)]: the CPUs the vCPUs get, in order
        vcpu_cpus = [pins[v % len(pins)] for v in range(self.vcpus)]
        if self.uffds == 1:  # one uffd serves every vCPU: go round their CPUs
            return tuple(vcpu_cpus[i % self.vcpus] for i in range(self.readers))
        # uffd u serves vCPU u alone
        return tuple(vcpu_cpus[u] for u in range(self.vcpus) for _ in range(self.readers))

    def replace(self, **fields: Any) -> Config:
        """A copy with some fields changed (validated like a new Config)."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"{', '.join(sorted(unknown))}: not a Config field; fields are "
                              f"{', '.join(f.name for f in dataclasses.fields(self))}", field=None)
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python values (tuples become lists), which
        ``Config(**d)`` takes back; ``Result.to_dict()`` gives strict JSON values."""
        d = dataclasses.asdict(self)
        for key in ("pin_vcpus", "pin_readers", "replay_from", "preinstall"):
            if isinstance(d[key], tuple):
                d[key] = list(d[key])
        return d
