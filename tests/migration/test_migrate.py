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

import tempfile

import pytest
from helpers.hostfacts import facts_for_run, host_skip
from helpers.resources import assert_released, resources
from helpers.skips import needs_test_hooks

import uffdkvm
from uffdkvm import Config, ConfigError, RunError
from uffdkvm.migration.migrate import migrate

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


def _facts(tracker: str):
    """What can stop a migration with this tracker: the source's, the destination's."""
    return tuple(dict.fromkeys([*facts_for_run(uffd_mode=None, dirty_tracking=tracker),
                                *facts_for_run(uffd_mode="missing", source="remote")]))


def _migrate(mode: str = "precopy", tracker: str = "bitmap", **more):
    try:
        return migrate(mode=mode, **_workload(tracker, **more))
    except uffdkvm.HostUnsupportedError as e:
        host_skip(_facts(tracker), f"this host cannot: {e}")


def _source(mode: str, tracker: str, tmp_path, **more) -> uffdkvm.Result:
    """The source's run alone, as migrate() makes it."""
    from uffdkvm.migration.migrate import KNOBS, _source_config
    from uffdkvm.run import _run
    fields = _workload(tracker, link_bandwidth_mbps=400, **more)
    knobs = {k: fields.pop(k) for k in KNOBS if k in fields}
    c = _source_config(Config(**fields), mode, knobs, str(tmp_path / "dump"))
    try:
        return _run(c)
    except uffdkvm.HostUnsupportedError as e:
        host_skip(_facts(tracker), f"this host cannot: {e}")


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


def test_a_ring_too_small_for_a_round_shows_in_its_ring_full_exits(kvm, tmp_path):
    """A round's ring-full exits are its vCPUs' stops to harvest their own
    ring: a 512-entry ring under a guest writing 512 of its 1024 pages each
    pass fills; a ring for the whole region never fills, as a
    page is logged once until the harvest re-protects it. (kvm_pvm logs some
    two entries a write and can overrun a 256-entry ring's reserve: 512 and
    half the pages fill it without that.)"""
    def exits(entries):
        r = _source("precopy", "ring", tmp_path, write_percent=50, max_rounds=2,
                    dirty_ring_entries=entries)
        assert r.verified, r.verify_message
        return [x.ring_full_exits for x in r.migration_rounds]

    assert sum(exits(512)) > 0
    assert sum(exits(65536)) == 0


@pytest.mark.parametrize("tracker", TRACKERS)
def test_a_tracker_blind_to_a_page_fails_the_migration(kvm, tracker):
    """The tracker never reports page 0, which round 1 sends first and the
    vCPU writes at the start of every pass (write_percent=100). Round 1
    crawls (256 pages at 20 Mbit/s: 0.4 s) while the 1 MiB walk goes round
    many times, so the page is written after its send and before the stop:
    the destination's copy is stale, and the comparison at the stop must
    say so. (A page written only at a pass's end, or a pass longer than
    round 1, would leave it to the timing of a busy nested host.)"""
    needs_test_hooks()
    from uffdkvm.testing._faults import migrate_with_fault
    before = resources()
    with pytest.raises(RunError, match=r"1 of the 256 pages the destination holds differ from "
                                       rf"the source's at the stop .*dirty_tracking='{tracker}'"):
        try:
            # kvm_pvm pushes some two ring entries a write: a ring for the whole round.
            migrate_with_fault(fault="migrate_blind_page", after=0, vcpus=1,
                               mem_per_vcpu="1M", write_percent=100, dirty_tracking=tracker,
                               link_bandwidth_mbps=20, max_rounds=1,
                               **({"dirty_ring_entries": 65536} if tracker == "ring" else {}))
        except uffdkvm.HostUnsupportedError as e:
            host_skip(_facts(tracker), f"this host cannot: {e}")
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


# ---- the whole migration ----

def test_each_mode_verifies_and_the_destination_holds_what_was_sent(kvm):
    pages = 2 * PAGES
    for mode in MODES:
        m = _migrate(mode, link_bandwidth_mbps=400)
        d, s = m.destination, m.source
        assert m.verified and d.verified and d.contents_verified, (mode, d.verify_message)
        assert d.preinstalled_pages == len(s.migrated_pages)
        # Every page arrived once: held at the start, faulted in, or streamed.
        assert d.preinstalled_pages + d.faults + d.prefetched_pages == pages, mode
        if mode == "precopy":
            assert d.preinstalled_pages == pages and d.faults == 0 and m.postcopy_bytes == 0
            assert m.precopy_bytes == sum(r.sent_pages for r in m.rounds) * 4096
            assert m.downtime_seconds >= s.stopcopy_seconds
            # Stop-and-copy at 400 Mbit/s: 82 us a page at least.
            assert s.stopcopy_seconds >= s.stopcopy_pages * 4096 * 8 / 400e6
        else:
            assert m.stopcopy_bytes == 0 and m.postcopy_faults == d.faults > 0
        assert m.total_seconds >= m.downtime_seconds > 0


def test_a_guest_that_writes_nothing_migrates_in_one_round(kvm):
    m = _migrate("precopy", write_percent=0)
    assert m.verified and m.converged
    assert [(r.round, r.sent_pages, r.dirty_pages) for r in m.rounds] == [(1, 2 * PAGES, 0)]
    assert m.stopcopy_bytes == 0 and m.destination.faults == 0


def test_precopy_that_cannot_converge_says_so_and_ends_at_max_rounds(kvm):
    """Every page written every pass, and a target nothing meets: the rounds
    run to max_rounds, then the whole dirty set is stop-copied."""
    m = _migrate("precopy", write_percent=100, downtime_target_ms=1, max_rounds=3)
    assert m.verified and not m.converged and m.round_count == 3
    assert m.stopcopy_bytes >= m.rounds[-1].dirty_pages * 4096 > 0
    healthy = _migrate("precopy", write_percent=100, max_rounds=3)  # 300 ms fits 8 MiB
    assert healthy.converged and healthy.round_count == 1


def test_auto_converge_throttles_by_its_rule_and_vcpus_sleep(kvm):
    """Every page written every pass and a target only an empty dirty set
    meets: each round whose dirty set is over half of what it sent raises
    the throttle (50, then 20 more, at most 90), and a kicked vCPU sleeps
    its share. (At 90% a vCPU sleeps 90 ms after each 10 ms slice, as
    QEMU's does: a round can fall in one sleep and find nothing dirty, which
    converges. Whether a throttled guest dirties fewer distinct pages a
    round is the workload's: this one can rewrite its 4 MiB in one slice.)"""
    # 100 Mbit/s: round 1 takes 0.67 s, in which a guest rewrites its 4 MiB
    # even on a nested KVM under TCG.
    knobs = dict(write_percent=100, downtime_target_ms=0, max_rounds=5, auto_converge=True,
                 link_bandwidth_mbps=100,
                 throttle_initial_percent=50, throttle_increment_percent=20,
                 throttle_max_percent=90)
    m = _migrate("precopy", **knobs)
    assert m.verified, m.destination.verify_message
    rounds = m.rounds
    assert rounds[0].throttle_percent == 0
    for before, after in zip(rounds, rounds[1:], strict=False):
        if before.dirty_pages * 2 > before.sent_pages:
            want = min(before.throttle_percent + 20 if before.throttle_percent else 50, 90)
        else:
            want = before.throttle_percent
        assert after.throttle_percent == want, [(r.sent_pages, r.dirty_pages,
                                                 r.throttle_percent) for r in rounds]
    assert len(rounds) >= 2 and rounds[1].throttle_percent == 50
    # The vCPUs slept about their share of the throttled rounds (each no
    # more than all of them: a busy host may starve one of its kicks).
    throttled = sum(r.seconds * r.throttle_percent / 100 for r in rounds)
    slept = [v.throttled_seconds for v in m.source.vcpus]
    assert sum(slept) > 0.25 * throttled * len(slept), (slept, throttled)
    assert max(slept) < sum(r.seconds for r in rounds) + 0.1, slept
    # Off, nothing sleeps and no round is throttled.
    off = _migrate("precopy", write_percent=100, downtime_target_ms=20, max_rounds=2)
    assert all(r.throttle_percent == 0 for r in off.rounds)
    assert all(v.throttled_seconds == 0 for v in off.source.vcpus)


def test_postcopy_moves_each_page_exactly_once(kvm):
    """Without the background stream every page the guest walks faults once,
    and the link carries each once: the page server's own count."""
    m = _migrate("postcopy", postcopy_prefetch="none")
    pages = 2 * PAGES
    assert m.verified and m.postcopy_faults == pages
    assert m.destination.page_server.served == pages
    assert m.postcopy_bytes == pages * 4096
    # With the stream, a page a fault and the stream fetch at once can cross
    # twice: each such crossing ends in an install that found the page there
    # (the stream's prefetch_eexist, a reader's eexist). The link's count is
    # what the destination fetched.
    s = _migrate("postcopy")
    d = s.destination
    assert s.verified and d.faults + d.prefetched_pages == pages
    assert s.postcopy_bytes == d.source_bytes  # the readers' and the pusher's
    assert pages * 4096 <= s.postcopy_bytes <= (pages + d.prefetch_eexist + d.eexist) * 4096


def test_hybrid_takes_fewer_postcopy_faults_than_postcopy_alone(kvm):
    post = _migrate("postcopy", postcopy_prefetch="none")
    hybrid = _migrate("hybrid", postcopy_prefetch="none")
    assert post.verified and hybrid.verified
    # Only what the guest wrote after its round-1 send is left to fault.
    assert hybrid.postcopy_faults == hybrid.source.postcopy_pages < post.postcopy_faults


def test_the_frame_and_json_carry_the_knobs_and_both_sides(kvm):
    import json
    m = _migrate("hybrid", link_bandwidth_mbps=400, link_latency_us=50)
    row = m.to_frame().iloc[0]
    assert row["migration"] == "hybrid" and row["link_bandwidth_mbps"] == 400
    assert row["link_latency_us"] == 50 and row["round_count"] == 1
    assert row["destination_faults"] == m.destination.faults
    assert row["source_stopcopy_pages"] == 0
    assert list(m.rounds_frame()["round"]) == [1]
    d = json.loads(m.to_json())
    assert d["mode"] == "hybrid" and d["destination"]["verified"] is True
    # The latency is in the downtime once.
    assert m.downtime_seconds >= 50e-6


# ---- failures leave nothing behind ----

def test_a_link_process_killed_mid_postcopy_fails_and_leaves_nothing(kvm, monkeypatch,
                                                                   tmp_path):
    """The destination's page server (the link to the source's memory) is
    SIGKILLed while post-copy faults wait on it: RunError naming it, no
    thread, fd, mapping, process or file left."""
    import importlib
    import os
    import signal
    import threading
    import time
    run_module = importlib.import_module("uffdkvm.run")
    started = []

    class Recorded(run_module.PageServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(run_module, "PageServer", Recorded)

    def kill_later():
        deadline = time.monotonic() + 30
        while not started and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)
        if started:
            os.kill(started[0].pid, signal.SIGKILL)

    # The migration's work directory goes under tmp_path, where no other
    # test's (another worker's) can be.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = resources()
    killer = threading.Thread(target=kill_later, daemon=True)
    killer.start()
    with pytest.raises(RunError, match="was killed by signal 9"):
        # 2 ms a fetch: seconds of post-copy, killed 0.3 s in.
        _migrate("postcopy", postcopy_prefetch="none", link_latency_us=2000)
    killer.join(5)
    # The interpreter's allocator may map an arena meanwhile: a little slack.
    assert_released(before, within_s=5)
    assert resources()["maps"] <= before["maps"] + 8
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_mid_round_stops_the_migration_and_leaves_nothing(kvm, monkeypatch, tmp_path):
    """SIGINT while round 1 crawls over an 8 Mbit/s link: KeyboardInterrupt
    within a second, everything given back, and the next migration runs."""
    import signal
    import threading
    import time
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # as above
    before = resources()
    sent = {}

    def fire():
        sent["at"] = time.monotonic()
        signal.raise_signal(signal.SIGINT)

    timer = threading.Timer(0.5, fire)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        _migrate("precopy", link_bandwidth_mbps=8)  # 2048 pages at 4 ms each
    assert time.monotonic() - sent["at"] < 1.0
    timer.join()
    assert_released(before, within_s=5)
    assert resources()["maps"] <= before["maps"] + 8
    assert list(tmp_path.iterdir()) == []
    assert _migrate("precopy", mem_per_vcpu="1M").verified
