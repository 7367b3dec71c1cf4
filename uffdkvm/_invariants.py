"""What must hold of every Result: the one list, checked where a Result comes
from outside (Result.from_json, and so read_results) and by the soak on
every run the core makes.

The sums are those the core computes (csrc/experiment/collect.c,
collect_reader_sums and ukvm_collect_result; csrc/uffd/faultlog.c for the
per-vCPU counts, csrc/uffd/resolve.c and reader.c for a reader's): a Result
whose totals are not the sums of its parts was not made by uffdkvm, or was
changed since. Each failure is a ResultError naming the field by its path
in the JSON (``$.readers[1].faults``) and what is wrong.

Values:
  every int of the run's measurements (not the config's, whose own
  validation runs when it is decoded) is a count, a time stamp, an id or a
  size: from 0 to 2**64 - 1, as the core's uint64_t holds it; the one
  signed value is a trace's vcpu (-1: unknown). Every float is finite
  and not negative (seconds, rates, nanoseconds).

The run's totals (collect_reader_sums):
  faults, eexist, spurious_wakeups, wakes  = the readers' summed
  source_bytes                             = the readers' + pusher_source_bytes
  source_seconds                           = the readers' summed (to rounding)
  prefetch_eexist                         >= the readers' (the pusher adds its own)
  guest_accesses                           = the vCPUs' pages summed

Its parts:
  vcpus          one per config.vcpus, index i at [i]; pass_seconds one per pass
  a vCPU's faults and eexist (the fault log's, by vCPU): summed, at most the
                 run's (a fault of no known vCPU is counted by its reader only)
  a vCPU's stages: every fault message of the vCPU is in service_latency, or,
                 woken by another vCPU's fault on its page, in fault_latency
                 alone; queue and resume have the same faults:
                 faults + eexist = service.count + fault.count - queue.count
  a reader:      spurious_wakeups <= wakeups; read_sizes[1:] sum to reads and
                 hold every message it read: sum(n * read_sizes[n]) =
                 faults + eexist; copies + zeropages + continues + moves +
                 unprotects <= faults + eexist (a fault whose page prefetch
                 installed is an EEXIST without an ioctl); its uffd < uffds
  a histogram:   counts sum to count (Histogram itself checks); min <= max
  prefetch:      prefetched_pages = the readers' prefetched + pushed_pages
                 (each page goes in once, csrc/uffd/resident.h);
                 wasted_prefetch_pages and pushed_pages <= prefetched_pages
  preinstall:    preinstalled_pages = len(config.preinstall) (each listed page
                 goes in before the vCPUs start, or there is no Result), and with
                 prefetched_pages at most the region's pages (a page goes in
                 once); preinstall_seconds is set with preinstalled_pages
  verified       a verified run has no bad pages and no message; one that is
                 not has a message
  clock_sync     a message only where there is no conversion that guest_timing
                 with stats="full" asked for (never beside a clock_sync), and
                 never an empty one
  fault_trace    every column the same length
  dirty_passes   dirty_tracking: one per pass after the first, iterations 1,
                 2, ... in order; none without tracking. In each, found_pages
                 = written_pages + excess_pages (a page written and not found
                 fails the run, csrc/experiment/dirty.c), and excess_pages is 0
                 but in bitmap_manual's first iteration (INITIALLY_SET) and
                 with wp_async on hugetlb memory; without tracking,
                 dirty_enable_seconds and dirty_disable_seconds are null
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from .errors import ResultError
from .schema.fields import choices

WAITS = choices("wait")

U64_MAX = (1 << 64) - 1
# Where a value may be below 0: a trace's vCPU, -1 where the fault's thread
# was no vCPU's (ukvm.h, struct ukvm_fault_record).
SIGNED = {"$.fault_trace.vcpu": -1}
# What is checked elsewhere or holds no measurement: the config (Config's
# own validation) and the host (KVM's answers, some of them -1).
NOT_MEASURED = ("$.config", "$.host")


def _values(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every int and float under obj, with its path, as the JSON names it."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            sub = f"{path}.{f.name}"
            if sub not in NOT_MEASURED:
                yield from _values(getattr(obj, f.name), sub)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _values(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _values(v, f"{path}[{k!r}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def _column(path: str) -> str:
    """A trace column's path without the index: $.fault_trace.vcpu[3] ->
    $.fault_trace.vcpu."""
    return path.split("[", 1)[0]


def _check_values(r: Any) -> None:
    for path, v in _values(r, "$"):
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ResultError(f"{path}: {v} is not a finite number; a measurement "
                                  f"is (only the config may hold inf)")
            if v < 0:
                raise ResultError(f"{path}: {v} is negative; no time, rate or count is")
        elif v < SIGNED.get(_column(path), 0) or v > U64_MAX:
            low = SIGNED.get(_column(path), 0)
            shown = v if abs(v) < 1 << 70 else f"an integer of {len(str(abs(v)))} digits"
            raise ResultError(f"{path}: {shown} is outside {low} to 2**64 - 1, which the "
                              f"core's counters hold")


def _equal(path: str, value: Any, parts: str, total: Any) -> None:
    if value != total:
        raise ResultError(f"{path}: {value}, but {parts} sum to {total}: a total must be "
                          f"the sum of its parts")


def _at_most(path: str, value: Any, bound_name: str, bound: Any) -> None:
    if value > bound:
        raise ResultError(f"{path}: {value}, more than {bound_name} ({bound})")


def _check_histogram(path: str, h: Any) -> None:
    # (that the counts sum to count, Histogram checks as it is made)
    if h is not None and h.count and h.min > h.max:
        raise ResultError(f"{path}.min: {h.min} is above max ({h.max})")


def _check_vcpus(r: Any) -> None:
    c = r.config
    if len(r.vcpus) != c.vcpus:
        raise ResultError(f"$.vcpus: {len(r.vcpus)} vCPUs, but config.vcpus is {c.vcpus}")
    for i, v in enumerate(r.vcpus):
        p = f"$.vcpus[{i}]"
        if v.index != i:
            raise ResultError(f"{p}.index: {v.index}, at [{i}]: each vCPU is at its index")
        if v.pass_seconds and len(v.pass_seconds) != c.passes:
            raise ResultError(f"{p}.pass_seconds: {len(v.pass_seconds)} passes, but "
                              f"config.passes is {c.passes}")
        for name in ("queue_latency", "service_latency", "resume_latency", "fault_latency",
                     "access_latency"):
            _check_histogram(f"{p}.{name}", getattr(v, name))
        if v.faults is None or v.eexist is None or v.service_latency is None:
            continue
        queue, fault = v.queue_latency, v.fault_latency
        counted = v.service_latency.count + (fault.count if fault else 0) - \
            (queue.count if queue else 0)
        if (queue is None) != (fault is None) or \
                (queue and v.resume_latency and queue.count != v.resume_latency.count):
            raise ResultError(f"{p}: queue, resume and fault latencies are measured "
                              f"together, over the same faults")
        if counted != v.faults + v.eexist:
            raise ResultError(f"{p}.service_latency.count: its stages hold {counted} "
                              f"faults, but faults + eexist is {v.faults + v.eexist}")
    known = [v for v in r.vcpus if v.faults is not None]
    if known:
        _at_most("$.vcpus[*].faults", sum([v.faults for v in known]), "$.faults", r.faults)
    known = [v for v in r.vcpus if v.eexist is not None]
    if known:
        _at_most("$.vcpus[*].eexist", sum([v.eexist for v in known]), "$.eexist", r.eexist)
    if r.guest_accesses is not None:
        _equal("$.guest_accesses", r.guest_accesses, "$.vcpus[*].pages",
               sum([v.pages for v in r.vcpus]))


def _check_readers(r: Any) -> None:
    for i, x in enumerate(r.readers):
        p = f"$.readers[{i}]"
        if x.uffd >= max(r.uffds, 1):
            raise ResultError(f"{p}.uffd: {x.uffd}, but the run had {r.uffds} uffds")
        _at_most(f"{p}.spurious_wakeups", x.spurious_wakeups, "its wakeups", x.wakeups)
        messages = x.faults + x.eexist
        ioctls = x.copies + x.zeropages + x.continues + x.moves + x.unprotects
        _at_most(f"{p}.copies", ioctls, "faults + eexist (copies, zeropages, continues, "
                 "moves and unprotects are each one message's)", messages)
        if x.read_sizes:
            _equal(f"{p}.reads", x.reads, f"{p}.read_sizes[1:]", sum(x.read_sizes[1:]))
            if x.reads:
                _equal(f"{p}.faults", messages, f"the messages of {p}.read_sizes "
                       f"(n * read_sizes[n]), less eexist,",
                       sum([n * k for n, k in enumerate(x.read_sizes)]))
        _check_histogram(f"{p}.service_latency", x.service_latency)
        _check_histogram(f"{p}.queue_latency", x.queue_latency)
    readers = r.readers
    for name in ("faults", "eexist", "spurious_wakeups"):
        _equal(f"$.{name}", getattr(r, name), f"$.readers[*].{name}",
               sum([getattr(x, name) for x in readers]))
    if r.wakes is not None:
        _equal("$.wakes", r.wakes, "$.readers[*].wakes", sum([x.wakes for x in readers]))
    _equal("$.source_bytes", r.source_bytes, "$.readers[*].source_bytes and "
           "$.pusher_source_bytes", sum([x.source_bytes for x in readers]) +
           r.pusher_source_bytes)
    timed = [x.source_seconds for x in readers if x.source_seconds is not None]
    if r.source_seconds is not None and timed and \
            not math.isclose(r.source_seconds, sum(timed), rel_tol=1e-9, abs_tol=1e-9):
        _equal("$.source_seconds", r.source_seconds, "$.readers[*].source_seconds",
               sum(timed))
    if r.prefetch_eexist is not None:
        _at_least = sum([x.prefetch_eexist for x in readers])
        if r.prefetch_eexist < _at_least:
            raise ResultError(f"$.prefetch_eexist: {r.prefetch_eexist}, fewer than "
                              f"$.readers[*].prefetch_eexist sum to ({_at_least})")


def _check_dirty(r: Any) -> None:
    tracked = r.config.dirty_tracking is not None
    want = r.config.passes - 1 if tracked else 0
    if len(r.dirty_passes) != want:
        raise ResultError(f"$.dirty_passes: {len(r.dirty_passes)} records, but a run of "
                          f"{r.config.passes} passes with dirty_tracking="
                          f"{r.config.dirty_tracking!r} has {want}")
    if not tracked and (r.dirty_enable_seconds is not None or
                        r.dirty_disable_seconds is not None):
        raise ResultError("$.dirty_enable_seconds: set, but the run tracked nothing: null")
    for i, p in enumerate(r.dirty_passes):
        if p.iteration != i + 1:
            raise ResultError(f"$.dirty_passes[{i}].iteration: {p.iteration}, not {i + 1}")
        _equal(f"$.dirty_passes[{i}].found_pages", p.found_pages,
               f"$.dirty_passes[{i}].written_pages + excess_pages",
               p.written_pages + p.excess_pages)
        by_design = (r.config.dirty_tracking == "bitmap_manual" and p.iteration == 1) or \
            (r.config.dirty_tracking == "wp_async" and "hugetlb" in r.config.backing)
        if p.excess_pages and not by_design:
            raise ResultError(f"$.dirty_passes[{i}].excess_pages: {p.excess_pages}, but "
                              f"dirty_tracking={r.config.dirty_tracking!r} reports no page "
                              "the guest did not write, but in bitmap_manual's first "
                              "iteration and wp_async's hugetlb pages")


def _check_preinstall(r: Any) -> None:
    if r.preinstalled_pages is None:
        if r.preinstall_seconds is not None:
            raise ResultError("$.preinstall_seconds: set, but preinstalled_pages is null: "
                              "both are measured where pages are tracked")
        return
    if r.preinstall_seconds is None:
        raise ResultError("$.preinstall_seconds: null, but preinstalled_pages is set: both "
                          "are measured where pages are tracked")
    listed = len(r.config.preinstall or ())
    if r.preinstalled_pages != listed:
        raise ResultError(f"$.preinstalled_pages: {r.preinstalled_pages}, but "
                          f"$.config.preinstall lists {listed} pages: each listed page goes "
                          f"in before the vCPUs start")
    pages = -(-r.config.region_bytes // r.page_size) if r.page_size else 0
    if r.prefetched_pages is not None and r.page_size:
        _at_most("$.preinstalled_pages + prefetched_pages",
                 r.preinstalled_pages + r.prefetched_pages, "the region's pages", pages)


def _check_run(r: Any) -> None:
    c = r.config
    if r.pass_seconds and len(r.pass_seconds) != c.passes:
        raise ResultError(f"$.pass_seconds: {len(r.pass_seconds)} passes, but config.passes "
                          f"is {c.passes}")
    if r.verified and (r.bad_pages or r.verify_message):
        raise ResultError(f"$.verified: true, with {r.bad_pages} bad pages and the message "
                          f"{r.verify_message[:80]!r}: a verified run has neither")
    if not r.verified and not r.verify_message:
        raise ResultError("$.verify_message: empty, but verified is false: a run that did "
                          "not verify says why")
    if r.clock_sync_message is not None:
        if r.clock_sync is not None:
            raise ResultError(f"$.clock_sync_message: set, but clock_sync is "
                              f"{r.clock_sync!r}: a message says why there is no conversion")
        if not (c.guest_timing and c.stats == "full"):
            raise ResultError("$.clock_sync_message: set, but the run asked for no clock "
                              "conversion (guest_timing with stats='full'): null")
        if not r.clock_sync_message:
            raise ResultError("$.clock_sync_message: empty; null where there is nothing to say")
    if r.prefetched_pages is not None:
        for name in ("wasted_prefetch_pages", "pushed_pages"):
            value = getattr(r, name)
            if value is not None:
                _at_most(f"$.{name}", value, "$.prefetched_pages", r.prefetched_pages)
        if r.pushed_pages is not None:
            # each page goes in once (resident.h): by a fault, a reader's
            # readahead or the pusher, and the last two are the prefetched
            _equal("$.prefetched_pages", r.prefetched_pages,
                   "$.readers[*].prefetched and $.pushed_pages",
                   sum(x.prefetched for x in r.readers) + r.pushed_pages)
    _check_preinstall(r)
    if r.reader_cpus is not None and not r.reader_cpus:
        raise ResultError("$.reader_cpus: an empty list; unpinned readers are null")
    if r.readers_with_vcpus and r.reader_cpus is None:
        raise ResultError("$.readers_with_vcpus: true, but reader_cpus is null: readers "
                          "placed with their vCPUs were pinned to the vCPUs' CPUs")
    if r.reader_wait is not None and r.reader_wait not in WAITS:
        raise ResultError(f"$.reader_wait: {r.reader_wait!r} is not a wait mode "
                          f"({', '.join(WAITS)})")
    if r.reader_wait is not None and (r.config.uffd_mode is None or
                                      r.config.resolver != "readers"):
        raise ResultError("$.reader_wait: set, but the run had no readers (uffd_mode None "
                          "or resolver 'vcpu'): null")
    _check_dirty(r)
    t = r.fault_trace
    if t is not None:
        lengths = {f.name: len(getattr(t, f.name)) for f in dataclasses.fields(t)
                   if f.name != "start_ns"}
        if len(set(lengths.values())) > 1:
            raise ResultError(f"$.fault_trace: its columns differ in length ({lengths})")


def check_result(r: Any) -> None:
    """r: a uffdkvm.Result (typed Any: result.py imports this module, which
    imports nothing of it back). Raises ResultError for the first thing that does not hold of r (the
    module docstring's list); returns None for a Result the core could have
    made."""
    _check_values(r)
    _check_run(r)
    _check_vcpus(r)
    _check_readers(r)
