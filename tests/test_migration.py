"""Live migration (uffdkvm.migrate, docs/migration.md): the source's rounds
over the modelled link, the stop, and the destination that pages the rest.

The source's side is checked through its own Result (Config.migration):
round 1 sends every page, each later round what the tracker found, and
every page the destination holds at the stop is compared with the
source's there (csrc/experiment/migrate.c); a tracker blind to one page is
caught by that comparison. The destination's side: what migrate() returns,
verified against the memory at the stop plus the destination guest's own
writes.
"""
from __future__ import annotations

import pytest
from conftest import host_skip, needs_test_hooks, resources

import uffdkvm
from uffdkvm import Config, ConfigError, RunError
from uffdkvm.migration import migrate

pytestmark = pytest.mark.kvm

TRACKERS = ("bitmap", "bitmap_manual", "ring", "wp_async")
MODES = ("precopy", "postcopy", "hybrid")
PAGES = 1024  # 4 MiB per vCPU


def _workload(tracker: str = "bitmap", **more) -> dict:
    # kvm_pvm logs some two ring entries a written page: a ring of the
    # region's size or more does not overrun between guest entries.
    fields = dict(vcpus=2, mem_per_vcpu="4M", write_percent=30, dirty_tracking=tracker,
                  dirty_ring_entries=16384)
    if tracker != "ring":
        del fields["dirty_ring_entries"]
    fields.update(more)
    return fields


def _migrate(mode: str = "precopy", tracker: str = "bitmap", **more):
    try:
        return migrate(mode=mode, **_workload(tracker, **more))
    except uffdkvm.HostUnsupportedError as e:
        host_skip((), f"this host cannot: {e}")


def _source(mode: str, tracker: str, tmp_path, **more) -> uffdkvm.Result:
    """The source's run alone, as migrate() makes it."""
    from uffdkvm.migration import KNOBS, _source_config
    from uffdkvm.run import _run
    fields = _workload(tracker, link_bandwidth_mbps=400, **more)
    knobs = {k: fields.pop(k) for k in KNOBS if k in fields}
    c = _source_config(Config(**fields), mode, knobs, str(tmp_path / "dump"))
    try:
        return _run(c)
    except uffdkvm.HostUnsupportedError as e:
        host_skip((), f"this host cannot: {e}")


@pytest.mark.parametrize("tracker", TRACKERS)
@pytest.mark.parametrize("mode", MODES)
def test_the_source_sends_what_the_tracker_found(kvm, tmp_path, mode, tracker):
    r = _source(mode, tracker, tmp_path)
    pages = 2 * PAGES
    assert r.verified, r.verify_message
    held = set(r.migrated_pages)
    assert len(held) == len(r.migrated_pages) and held <= set(range(pages))
    assert r.postcopy_pages == pages - len(held)
    assert (tmp_path / "dump").stat().st_size == r.config.region_bytes
    if mode == "postcopy":
        assert r.migration_rounds == () and r.precopy_pages == r.stopcopy_pages == 0
        assert not held and r.precopy_seconds == 0.0
        return
    first, *_ = r.migration_rounds
    assert first.round == 1 and first.sent_pages == pages
    assert r.precopy_pages == sum(x.sent_pages for x in r.migration_rounds)
    for before, after in zip(r.migration_rounds, r.migration_rounds[1:], strict=False):
        assert after.sent_pages == before.dirty_pages  # each round resends what was found
    if mode == "precopy":
        assert len(held) == pages and r.postcopy_pages == 0
        assert r.stopcopy_pages >= r.migration_rounds[-1].dirty_pages
    else:
        assert len(r.migration_rounds) == r.config.precopy_rounds and r.stopcopy_pages == 0
        # The guest writes 30% of its pages: those are post-copy's.
        assert 0 < r.postcopy_pages < pages


@pytest.mark.parametrize("tracker", TRACKERS)
def test_a_tracker_blind_to_a_page_fails_the_migration(kvm, tracker):
    """The tracker never reports the region's last page, which every pass
    writes (write_percent=100) after round 1 sent it: the destination's copy
    is stale at the stop, and the comparison must say so."""
    needs_test_hooks()
    from uffdkvm._testing import migrate_with_fault
    before = resources()
    with pytest.raises(RunError, match=r"1 of the \d+ pages the destination holds differ from "
                                       rf"the source's at the stop .*dirty_tracking='{tracker}'"):
        try:
            migrate_with_fault(fault="migrate_blind_page", after=2 * PAGES - 1,
                               **_workload(tracker, write_percent=100))
        except uffdkvm.HostUnsupportedError as e:
            host_skip((), f"this host cannot: {e}")
    assert resources() == before


def test_run_refuses_the_source_fields_outside_a_migration():
    with pytest.raises(ConfigError, match="max_rounds: applies to migration='precopy'"):
        Config(max_rounds=3)
    with pytest.raises(ConfigError, match="migration: migrate.. sets it"):
        migrate(mode="precopy", migration="precopy")
    with pytest.raises(ConfigError, match="mode: 'live'"):
        migrate(mode="live")
    with pytest.raises(ConfigError, match="backing: migrate"):
        migrate(backing="anonymous_hugetlb")
