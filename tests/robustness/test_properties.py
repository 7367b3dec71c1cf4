"""Random and hostile Configs: each either runs and verifies or raises a
documented exception, never anything else, never a crash.

Every field gets its valid values (kept small, so that a valid run is quick)
and hostile ones: wrong types, huge and negative numbers, odd strings,
NaN and infinities. Hypothesis combines them; examples are derandomised and
no database is kept, so CI sees the same ones every time.
"""
import dataclasses
import math

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import uffdkvm
from helpers.hostfacts import NO_UFFD_MOVE
from helpers.resources import assert_released, resources
from uffdkvm import Config, ConfigError, HostUnsupportedError, RunError
from uffdkvm.config import (ACCESSES, BACKING_PAGE_SIZES, BACKINGS, DELAY_DISTS,
                            HUGETLB_BACKINGS, PATTERNS, PREFETCHES, RESOLVERS, RESOLVES,
                            SOURCE_CACHES, SOURCE_READS, STATS, WAITS)

FIELDS = [f.name for f in dataclasses.fields(Config)]

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.just(math.nan), st.just(math.inf), st.just(-math.inf),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 2**31, 2**32, 2**63, 2**64, 2**64 + 1, 10**30]),
    st.text(max_size=8),
    st.sampled_from(["", " ", "\x00", "none", "None", "1e3", "0x10", "4K\n", "\u0664K",
                     "9" * 40, "-1", "NaN", "inf", "ANONYMOUS ", "poll\x00"]),
    st.binary(max_size=4),
    st.lists(st.integers(-2, 2), max_size=3),
    st.just(object()), st.just({}), st.just(()), st.just({0}),
)


def cased(names):
    """A valid name, in any case."""
    return st.sampled_from(names).flatmap(
        lambda name: st.sampled_from([name, name.upper(), name.title()]))


# Valid values small enough that any combination runs in well under a second.
VALID = {
    "vcpus": st.integers(1, 3),
    "mem_per_vcpu": st.sampled_from([4096, 8192, "16K", "64K", "64 KiB", "256k", "2M"]),
    "backing": cased(BACKINGS),
    "uffd_mode": st.sampled_from(["missing", "minor", None, "none", "MISSING"]),
    "single_uffd": st.booleans(),
    "resolver": cased(RESOLVERS),
    "readers": st.integers(1, 4),
    "wait": cased(WAITS),
    "read_batch": st.integers(1, 64),
    # Oversubscribed spinners on 2 CPUs take seconds a fault: run() refuses
    # them unless asked, and that refusal is what the property meets.
    "allow_oversubscribe": st.just(False),
    "delay_us": st.sampled_from([0, 0, 1, 50]),
    "overlap": st.booleans(),
    "guest_work": st.integers(0, 3),
    "guest_page_size": st.sampled_from(["4K", "4k", "2M", "2MiB", "1G", 4096, 2 << 20]),
    "pattern": cased(PATTERNS),
    "seed": st.one_of(st.integers(0, 2**64 - 1), st.just(2**64 - 1)),
    "write_percent": st.integers(0, 100),
    "passes": st.integers(1, 3),
    "resolve": cased(RESOLVES),
    "delay_dist": cased(DELAY_DISTS),
    "pin_vcpus": st.sampled_from([None, [0], (0,), "0", 0, [0, 0], "0,,0", [1023]]),
    "pin_readers": st.sampled_from([None, [0], "0", [0, 1023], "vcpus"]),
    "prefault": st.booleans(),
    "stats": cased(STATS),
    "guest_timing": st.booleans(),
    "trace_faults": st.booleans(),
    "record_touch_order": st.booleans(),
    "timeout_s": st.sampled_from([None, 30, 30.0, math.inf, 1e300, 1e-9]),
    "wp_async": st.booleans(),
    # source="file" needs a snapshot file: tests/pages/test_source_file.py
    "source": cased(("synthetic",)),
    "source_path": st.just(None),
    "source_address": st.just(None),
    "source_key_file": st.just(None),
    "source_read": cased(SOURCE_READS),
    "source_cache": cased(SOURCE_CACHES),
    "touch_percent": st.sampled_from([100, 100, 1, 30, 99]),
    "access": cased(ACCESSES),
    "zipf_theta": st.sampled_from([None, 0.5, 0.99, 2.0]),
    "accesses": st.sampled_from([None, 1, 100, 3000]),
    "prefetch": cased(PREFETCHES),
    "prefetch_pages": st.integers(1, 16),
    "prefetch_bandwidth_mbps": st.sampled_from([0, 0, 1, 1000]),
    "replay_from": st.sampled_from([None, [0], [1, 0], (0,), range(2)]),
    "remote_transport": cased(("unix", "tcp")),
    "remote_latency_us": st.sampled_from([0, 30, 10_000_000]),
    "remote_bandwidth_mbps": st.sampled_from([0, 1, 10_000]),
    "max_inflight": st.sampled_from([0, 1, 64]),
    "write_set": cased(("fixed", "per_pass")),
    "dirty_tracking": st.sampled_from([None, None, "bitmap", "Bitmap_Manual", "ring",
                                       "wp_async"]),
    "dirty_clear_pages": st.sampled_from([0, 0, 64, 100]),
    # (kvm_pvm overruns a small ring: docs/dirty-tracking.md)
    "dirty_ring_entries": st.sampled_from([4096, 4096, 65536, 1000]),
    "preinstall": st.sampled_from([None, None, [0], (1, 0), range(2)]),
    # migrate() sets these for its source (tests/migration/test_migrate.py)
    "migration": st.sampled_from([None, None, None, "precopy", "Hybrid"]),
    "max_rounds": st.sampled_from([30, 30, 1, 100_000]),
    "downtime_target_ms": st.sampled_from([300, 300, 0, 3_600_000]),
    "precopy_rounds": st.sampled_from([1, 1, 2]),
    "link_bandwidth_mbps": st.sampled_from([1000, 1000, 0, 8]),
    "link_latency_us": st.sampled_from([0, 0, 50]),
    "migration_dump_path": st.just(None),
    "auto_converge": st.sampled_from([False, False, True]),
    "throttle_initial_percent": st.sampled_from([20, 20, 1, 99]),
    "throttle_increment_percent": st.sampled_from([10, 10, 50]),
    "throttle_max_percent": st.sampled_from([99, 99, 30]),
}
assert set(VALID) == set(FIELDS), "every Config field has a strategy"


@st.composite
def hostile_fields(draw, hostile_share=0.25):
    """Some of the fields, each valid or (now and then) hostile. mem_per_vcpu
    is always given: the default of 1 GiB would make a valid run slow."""
    fields = {}
    for name in FIELDS:
        if name != "mem_per_vcpu" and not draw(st.booleans()):
            continue
        hostile = draw(st.floats(0, 1)) < hostile_share
        fields[name] = draw(HOSTILE if hostile else VALID[name])
    return fields


@st.composite
def coherent_fields(draw):
    """Valid values that fit together (a memory size the backing's pages
    divide, a uffd mode the backing takes, ...): mostly runs."""
    backing = draw(st.sampled_from(["anonymous", "anonymous", "shmem", "shmem",
                                    "anonymous_thp", "anonymous_hugetlb", "shared_hugetlb",
                                    "guest_memfd"]))
    shared = backing in ("shmem", "shared_hugetlb", "guest_memfd")
    huge = BACKING_PAGE_SIZES[backing] > 4096
    guest_page_size = draw(st.sampled_from(["4K", "2M"] if huge else ["4K", "4K", "2M"]))
    unit = 2 << 20 if huge or guest_page_size == "2M" else 4096
    mode = draw(st.sampled_from(["missing", None] + (["minor"] if shared else [])))
    zeropage_ok = mode == "missing" and backing not in HUGETLB_BACKINGS
    move_ok = mode == "missing" and backing in ("anonymous", "anonymous_thp") and \
        not NO_UFFD_MOVE.holds
    stats = draw(cased(STATS))
    fields = {name: draw(VALID[name]) for name in FIELDS}
    fields.update(
        backing=backing, guest_page_size=guest_page_size, uffd_mode=mode, stats=stats,
        mem_per_vcpu=unit * draw(st.integers(1, 2 if unit > 4096 else 256)),
        resolve=draw(st.sampled_from(["copy"] + (["zeropage"] if zeropage_ok else []) +
                                     (["move"] if move_ok else []))),
        trace_faults=stats.lower() == "full" and draw(st.booleans()),
        pin_vcpus=draw(st.sampled_from([None, [0], "0", (0,)])),
        pin_readers=draw(st.sampled_from([None, [0], "0"])),
        timeout_s=draw(st.sampled_from([None, 30.0, math.inf])),
        wp_async=False,  # uffd_mode "wp" only: tests/fault_paths/test_wp.py
        source_read="pread", source_cache="warm",  # source "file" only
        # source "remote" only (a page server per run: tests/pages/test_source_remote.py)
        remote_transport="unix", remote_latency_us=0, remote_bandwidth_mbps=0, max_inflight=0,
        # a server already running: tests/pages/test_server_auth.py
        source_address=None, source_key_file=None,
        # a local copy of the page source only: tests/core/test_preinstall.py
        preinstall=None,
        # migrate()'s source only: tests/migration/test_migrate.py
        migration=None, max_rounds=30, downtime_target_ms=300, precopy_rounds=1,
        link_bandwidth_mbps=1000, link_latency_us=0, migration_dump_path=None,
        auto_converge=False, throttle_initial_percent=20, throttle_increment_percent=10,
        throttle_max_percent=99)
    if fields["access"].lower() == "zipf":  # needs a skew and the sequential pattern
        fields.update(zipf_theta=draw(st.sampled_from([0.5, 0.99, 2.0])), pattern="sequential")
    else:  # the Zipf knobs only with access="zipf"
        fields.update(zipf_theta=None, accesses=None)
    # Prefetch where it applies (missing pages filled by UFFDIO_COPY), its
    # knobs only with the policies that read them.
    prefetchable = mode == "missing" and fields["resolve"] == "copy" and not fields["prefault"]
    prefetch = draw(st.sampled_from(["none"] + (
        ["readahead", "background", "replay"] if prefetchable else [])))
    fields.update(
        prefetch=prefetch,
        prefetch_pages=draw(st.integers(1, 16)) if prefetch == "readahead" else 8,
        prefetch_bandwidth_mbps=draw(st.sampled_from([0, 1000]))
        if prefetch in ("background", "replay") else 0,
        replay_from=[0] if prefetch == "replay" else None)
    if fields["resolver"].lower() == "vcpu":  # no reader threads: their fields as default
        fields.update(readers=1, wait="epoll_exclusive", read_batch=1, pin_readers=None)
    return fields


def field_named_first(message):
    """The name of the field a ConfigError's message starts with."""
    return any(message.startswith(name) for name in FIELDS)


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(hostile_fields(hostile_share=0.5))
def test_config_accepts_or_names_the_bad_field(fields):
    try:
        c = Config(**fields)
    except ConfigError as e:
        assert isinstance(e, ValueError)
        assert field_named_first(str(e)), str(e)
        return
    # What was accepted is normalised, and accepted again unchanged.
    assert Config(**c.to_dict()) == c
    assert c.replace() == c


def quick(fields):
    """False for a valid Config that would take long: a hostile number can
    land inside a field's range (passes=999999, delay_us=9999999), and
    such a run proves nothing more than a small one."""
    try:
        c = Config(**fields)
    except (ConfigError, TypeError):
        return True
    pages = c.pages_per_vcpu * c.vcpus * c.passes
    faults = c.region_bytes // c.page_size
    return (pages * (1 + c.guest_work // 64) <= 2048 and c.vcpus <= 8
            and c.readers * max(c.uffds, 1) <= 16 and c.delay_us * faults <= 200_000
            and c.region_bytes <= 8 << 20)


# What run() may raise: the documented exceptions, nothing else.
DOCUMENTED = (ConfigError, HostUnsupportedError, RunError)


@pytest.mark.kvm
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(st.one_of(coherent_fields(), hostile_fields()))
def test_run_verifies_or_raises_a_documented_error(kvm, fields):
    assume(quick(fields))
    before = resources()
    try:
        r = uffdkvm.run(**fields)
    except DOCUMENTED as e:
        event(type(e).__name__)
        assert isinstance(e.errno, int)
        if isinstance(e, ConfigError):
            assert field_named_first(str(e)), str(e)
        elif isinstance(e, RunError):
            # Only a time limit too short for the run fails it here.
            assert isinstance(e, uffdkvm.RunTimeoutError), str(e)
        assert str(e)
    except ValueError as e:
        event("ValueError")
        # The binding's own range check (values past 32/64 bits on hugetlb
        # backings, which skip the MemAvailable check); see test_config.
        assert field_named_first(str(e)), str(e)
    else:
        event("ran")
        assert r.verified, r.verify_message
        assert r.bad_pages == 0
        c = r.config
        touched = c.pages_per_vcpu * c.passes
        region_pages = c.region_bytes // 4096
        if c.touch_percent == 100 and c.access == "uniform":
            assert all(v.pages == touched for v in r.vcpus)
            assert r.touched_pages == region_pages
            if c.uffd_mode is not None and not c.prefault and c.prefetch == "none":
                assert r.faults == c.region_bytes // r.page_size
            elif c.prefetch != "none":  # every page arrived once: by a fault or by prefetch
                assert r.prefetched_pages is not None
                assert r.faults + r.prefetched_pages >= c.region_bytes // r.page_size
        else:  # a working set, or Zipf draws over it: part of the region
            assert r.touched_pages is not None and r.touched_pages <= region_pages
            if c.access == "zipf" and c.accesses is not None:
                assert all(v.pages in (0, c.accesses * c.passes) for v in r.vcpus)
            elif c.access == "uniform":
                assert sum(v.pages for v in r.vcpus) == c.passes * r.touched_pages * (
                    c.vcpus if c.overlap else 1)
            if c.uffd_mode is not None and not c.prefault:
                assert r.faults <= c.region_bytes // r.page_size
                if c.prefetch == "none":  # else prefetch may have installed every one first
                    assert (r.faults > 0) == (r.touched_pages > 0)
    assert_released(before)


@pytest.mark.parametrize("positional", [{"vcpus": 1}, [("vcpus", 1)], "vcpus=1", 1, 1.5,
                                        b"", object(), Config])
def test_run_takes_only_a_config_positionally(positional):
    with pytest.raises(uffdkvm.ConfigError, match="expected a uffdkvm.Config"):
        uffdkvm.run(positional, mem_per_vcpu="64K")
