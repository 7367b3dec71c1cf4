"""Prefetch policies: readahead, the background pusher, replay of a recorded
touch order, the races between prefetch and faults, and the pusher's
thread on every way a run ends.

Each effect is checked against what the run would do without it: a knob
the core silently ignored (prefetch handed to it as "none", the bandwidth
as 0) turns these red. Runs are small (a few MiB of 4 KiB pages).
"""
import json
import os
import signal
import subprocess
import threading
import time

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.hostfacts import NO_THP, host_skip
from helpers.resources import assert_released, resources
from helpers.runs import run_or_skip, run_with_fault

import uffdkvm
from uffdkvm import Result

pytestmark = pytest.mark.kvm

MEM = "4M"
PAGES = 4 * 1024 * 1024 // 4096
# 4 KiB pages at 2 megabits per second: one every 16 ms
SLOW_MBPS = 2


def run(**fields):
    """A run that must verify."""
    r = uffdkvm.run(**{"mem_per_vcpu": MEM, "timeout_s": 60, **fields})
    assert r.verified, r.verify_message
    return r


# ---- readahead ----

@pytest.mark.parametrize("window", [2, 8])
@pytest.mark.parametrize("how", [
    dict(),
    dict(resolver="vcpu"),
    dict(vcpus=2, single_uffd=True, readers=2),
    dict(vcpus=2),  # a uffd per vCPU: readahead stays within each
], ids=["reader", "vcpu-resolver", "single-uffd", "per-vcpu-uffds"])
def test_readahead_cuts_sequential_faults_by_its_window(kvm, window, how):
    """Walking in address order, each fault brings its page and the window
    after it: faults ~ pages / (1 + window), against one per page without."""
    r = run(prefetch="readahead", prefetch_pages=window, **how)
    pages = PAGES * r.config.vcpus
    expected = pages / (1 + window)
    assert abs(r.faults - expected) <= 0.25 * expected + 2, (r.faults, expected)
    # Every page came once, by a fault or by readahead; the guest touches all.
    assert r.faults + r.prefetched_pages == pages
    # A vCPU that faulted on a page readahead was installing waited for it:
    # a fault (EEXIST), not one avoided.
    assert r.faults <= r.faulted_pages <= r.faults + r.eexist
    assert r.faults_avoided == pages - r.faulted_pages <= r.prefetched_pages
    assert r.wasted_prefetch_pages == 0
    assert sum(x.prefetched for x in r.readers) == r.prefetched_pages
    assert r.pushed_pages == 0 and r.resident_seconds is not None


def test_readahead_on_huge_pages(kvm):
    """A 2 MiB page is read ahead whole, like a 4 KiB one."""
    r = run(backing="anonymous_thp", mem_per_vcpu="16M", prefetch="readahead",
            prefetch_pages=1)
    assert r.page_size == 2 << 20
    assert r.faults == 4 and r.prefetched_pages == 4, (r.faults, r.prefetched_pages)


def test_prefetch_on_hugetlb(kvm, hugepages):
    """2 MiB hugetlb pages, private and shared: read ahead and pushed whole."""
    ra = run_or_skip(backing="anonymous_hugetlb", mem_per_vcpu="8M", prefetch="readahead",
                     prefetch_pages=1, timeout_s=60)
    assert ra.faults == 2 and ra.prefetched_pages == 2, (ra.faults, ra.prefetched_pages)
    bg = run_or_skip(backing="shared_hugetlb", mem_per_vcpu="8M", prefetch="background",
                     timeout_s=60)
    assert bg.resident_seconds is not None and bg.pushed_pages > 0
    assert bg.faults + bg.prefetched_pages == 4


def test_without_prefetch_every_page_faults_and_nothing_is_prefetched(kvm):
    before = time.monotonic()
    r = run()
    wall = time.monotonic() - before
    assert r.faults == PAGES and r.prefetched_pages == 0 and r.faults_avoided == 0
    assert r.pushed_pages == 0 and r.wakes == 0 and r.prefetch_eexist == 0
    # Every page came by a fault, the last one as the vCPU finished (its
    # reader's stamp may follow the vCPU's end): a time within the run,
    # counted from its first KVM_RUN.
    assert r.resident_seconds is not None and 0 < r.resident_seconds < wall


# ---- the background pusher ----

@pytest.mark.parametrize("how", [dict(), dict(vcpus=2), dict(resolver="vcpu"),
                                 dict(backing="anonymous_thp", mem_per_vcpu="16M")],
                         ids=["readers", "per-vcpu-uffds", "vcpu-resolver", "thp"])
def test_background_reaches_full_residency_with_fewer_faults_than_none(kvm, how):
    base = run(**how)
    r = run(prefetch="background", **how)
    pages = r.config.region_bytes // r.page_size
    assert base.faults == pages
    assert r.resident_seconds is not None
    assert r.faults < base.faults, (r.faults, base.faults)
    assert r.pushed_pages > 0 and r.pushed_pages == r.prefetched_pages
    assert r.faults + r.prefetched_pages == pages
    # A vCPU may have faulted on a page the pusher was installing: it waited
    # (an EEXIST message), so that page counts as faulted, not avoided.
    assert r.faults <= r.faulted_pages <= r.faults + r.eexist
    assert r.faults_avoided == base.faults - r.faulted_pages


def test_a_low_bandwidth_pusher_installs_fewer_pages(kvm):
    """At 2 Mbit/s a 4 KiB page takes 16 ms: the guest outruns the pusher,
    which installs no more than its rate allows over the run; unlimited, it
    outruns the guest. Not a speed test: a count against the rate's bound."""
    fast = run(prefetch="background")
    slow = run(prefetch="background", prefetch_bandwidth_mbps=SLOW_MBPS)
    per_s = SLOW_MBPS * 1e6 / (4096 * 8)
    # its token bucket: a page per 16 ms, 10 ms of credit at most
    # (+3: the first page goes at once, and the pusher stops just after the vCPUs join)
    assert slow.pushed_pages <= per_s * slow.seconds + 3, (slow.pushed_pages, slow.seconds)
    assert slow.pushed_pages < fast.pushed_pages / 4, (slow.pushed_pages, fast.pushed_pages)
    assert slow.faults > fast.faults
    # Reaching residency took the slow run longer: more of it by faults.
    assert slow.faults + slow.prefetched_pages == PAGES


# ---- replay ----

def test_touch_order_is_the_order_faults_installed_pages(kvm):
    """Checked against the fault trace, an independent record: the pages of
    the resolved (not EEXIST) faults, by the time their ioctl returned."""
    r = run(pattern="random", vcpus=2, trace_faults=True, record_touch_order=True)
    t = r.fault_trace
    resolved = sorted((t.resolved_ns[i], (t.gpa[i] - min(t.gpa)) // r.page_size)
                      for i in range(len(t)) if not t.eexist[i])
    assert sorted(r.touch_order) == list(range(2 * PAGES))
    # Two readers' stamps may interleave with their marks: order within 1%.
    pairs = list(zip([p for _, p in resolved], r.touch_order, strict=True))
    assert sum(a != b for a, b in pairs) <= len(pairs) // 100 + 4
    assert list(r.touch_order) != sorted(r.touch_order)  # random, not address order


def test_touch_order_is_kept_only_when_asked(kvm):
    """4 bytes a page: a run that does not ask records none, and saying so
    names the field to set."""
    r = run(pattern="random")
    assert r.touch_order == () and r.faults == PAGES
    with pytest.raises(uffdkvm.ResultError, match="record_touch_order=True"):
        r.save_touch_order(os.devnull)
    with pytest.raises(uffdkvm.ConfigError, match="record_touch_order"):
        uffdkvm.Config(record_touch_order=True, resolve="zeropage")


def test_replay_of_a_recorded_order_avoids_most_faults(kvm, tmp_path):
    record = run(pattern="random", record_touch_order=True)
    path = tmp_path / "order.txt"
    record.save_touch_order(path)
    assert uffdkvm.read_touch_order(path) == record.touch_order
    r = run(pattern="random", prefetch="replay", replay_from=str(path))
    assert r.config.replay_from == record.touch_order
    assert record.faults == PAGES
    assert r.faults < PAGES // 2, r.faults
    assert r.faults_avoided > PAGES // 2 and r.pushed_pages > PAGES // 2
    assert r.resident_seconds is not None


def test_replay_installs_only_the_pages_it_is_given(kvm):
    """Half the recorded order: the pusher installs that half (or meets its
    faults), and the other half faults. Each fault waits 200 us (the pusher
    does not), so that the vCPU, whose last access ends the run and the
    pusher with it, cannot get through its pages before the pusher through
    the half: in the 6.1 guest under TCG it did, 7 pages short of 512."""
    record = run(pattern="random", record_touch_order=True)
    half = record.touch_order[:PAGES // 2]
    r = run(pattern="random", prefetch="replay", replay_from=half, delay_us=200)
    assert r.pushed_pages + r.prefetch_eexist >= len(half) - 1
    assert r.pushed_pages <= len(half)
    assert r.faults == PAGES - r.pushed_pages >= PAGES // 2


def test_a_touch_order_file_is_one_page_a_line(kvm, tmp_path):
    r = run(mem_per_vcpu="64K", record_touch_order=True)
    path = tmp_path / "order"
    r.save_touch_order(path)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# uffdkvm touch_order: 16 page indices (4096-byte pages")
    assert [int(x) for x in lines[1:]] == list(r.touch_order) == list(range(16))
    bad = tmp_path / "bad"
    bad.write_text("1\n2\nthree\n")
    with pytest.raises(uffdkvm.ConfigError, match="line 3: 'three' is not a page index"):
        uffdkvm.Config(prefetch="replay", replay_from=bad)


# ---- races ----

@pytest.mark.parametrize("how", [
    dict(prefetch="readahead", readers=2, delay_us=200),
    dict(prefetch="readahead", resolver="vcpu"),
    dict(prefetch="background", readers=2, prefetch_bandwidth_mbps=20),
], ids=["readahead", "readahead-vcpu-resolver", "background-paced"])
def test_races_between_prefetch_and_faults_are_counted_not_failed(kvm, how):
    """Several vCPUs on the same pages: a fault finds its page prefetched (or
    another's), a prefetch finds its page faulted. Every run verifies, and
    with readers every EEXIST is followed by a wake."""
    r = run(vcpus=3, overlap=True, **how)
    assert r.prefetched_pages > 0
    assert r.faults + r.prefetched_pages == PAGES
    if r.config.resolver == "readers":
        assert r.wakes == r.eexist
    else:
        assert r.wakes == 0  # a vCPU resolving its own fault never sleeps on it
    if how["prefetch"] == "background":
        # the pusher paces itself while the vCPUs fault the page it picked
        assert r.prefetch_eexist > 0
    else:
        assert r.eexist + r.prefetch_eexist > 0 or r.config.resolver == "vcpu"


# ---- results as data ----

def test_prefetch_results_round_trip_json_and_frames(kvm):
    r = run(prefetch="readahead", prefetch_pages=4, record_touch_order=True)
    back = Result.from_json(r.to_json())
    assert back == r and back.touch_order == r.touch_order
    d = json.loads(r.to_json())
    assert d["config"]["prefetch"] == "readahead" and d["prefetched_pages"] == r.prefetched_pages
    row = r.to_frame().iloc[0]
    assert row["prefetched_pages"] == r.prefetched_pages
    assert row["faults_avoided"] == r.faults_avoided
    assert "touch_order" not in row  # a column per page would be no use
    assert r.readers_frame()["prefetched"].sum() == r.prefetched_pages
    replay = run(prefetch="replay", replay_from=r.touch_order[:8])
    assert Result.from_json(replay.to_json()) == replay


def test_stats_basic_counts_prefetch_but_reads_no_clock_for_residency(kvm):
    r = run(prefetch="readahead", stats="basic")
    assert r.prefetched_pages > 0 and r.faults + r.prefetched_pages == PAGES
    assert r.resident_seconds is None


def test_modes_without_tracking_report_none(kvm):
    r = run(resolve="zeropage")
    assert r.prefetched_pages is None and r.resident_seconds is None
    assert r.faults_avoided is None and r.touch_order == ()
    with pytest.raises(uffdkvm.ResultError, match="touch_order"):
        r.save_touch_order(os.devnull)


def test_cli_flags(kvm, capsys, tmp_path):
    from uffdkvm.cli import main
    assert main(["-b", "1M", "--prefetch", "readahead", "--prefetch-pages", "3", "--json",
                 "-q"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config"]["prefetch"] == "readahead" and d["config"]["prefetch_pages"] == 3
    assert abs(d["faults"] - 256 / 4) <= 16
    path = tmp_path / "order"
    path.write_text("".join(f"{i}\n" for i in range(0, 256, 2)))
    assert main(["-b", "1M", "--prefetch", "replay", "--replay-from", str(path),
                 "--prefetch-bandwidth-mbps", "1000", "--json", "-q"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config"]["replay_from"] == list(range(0, 256, 2))
    assert d["config"]["prefetch_bandwidth_mbps"] == 1000
    assert main(["-b", "1M", "--prefetch", "background", "-q"]) == 0
    text = capsys.readouterr().out
    assert "\nPrefetch (background):\t" in text and " by the pusher)" in text, text
    assert main(["-b", "1M", "-q"]) == 0
    assert "Prefetch" not in capsys.readouterr().out


# ---- the pusher's thread on every ending ----

def _peak_threads_during(call):
    """The most threads this process had while call ran, and what it raised."""
    peak, done = [len(os.listdir("/proc/self/task"))], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(len(os.listdir("/proc/self/task")) - 1)  # less the sampler
            time.sleep(0.005)
    sampler = threading.Thread(target=sample)
    sampler.start()
    error = None
    try:
        call()
    except (uffdkvm.UffdkvmError, KeyboardInterrupt) as e:
        error = e
    finally:
        done.set()
        sampler.join()
    return max(peak), error


# The pusher paced at 1 Mbit/s (a 4 KiB page every 33 ms) still has most of
# 1 MiB to go when each of these ends the run.
BASE = dict(vcpus=2, mem_per_vcpu="1M", readers=2)
PUSHER = dict(prefetch="background", prefetch_bandwidth_mbps=1)
REPLAY = dict(prefetch="replay", prefetch_bandwidth_mbps=1, replay_from=range(511, -1, -1))


def _interrupted(**fields):
    """Ctrl-C once the run's vCPUs and readers are up (a fixed 0.3 s came
    before them on a busy machine, and the run ended with no pusher)."""
    up = len(os.listdir("/proc/self/task")) + 1 + fields["vcpus"] + fields["readers"]

    def interrupt():
        deadline = time.monotonic() + 10
        while len(os.listdir("/proc/self/task")) < up and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.1)
        signal.raise_signal(signal.SIGINT)
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        uffdkvm.run(**fields, delay_us=20_000)
    finally:
        interrupter.join()


# name: (how the run ends, the prefetch that runs a pusher, the error)
ENDINGS = {
    "failed": (lambda **f: run_with_fault(**f, fault="resolve_eio", after=40, delay_us=2000),
               PUSHER, uffdkvm.RunError),
    "timed-out": (lambda **f: uffdkvm.run(**f, delay_us=20_000, timeout_s=0.4), PUSHER,
                  uffdkvm.RunTimeoutError),
    "interrupted": (_interrupted, PUSHER, KeyboardInterrupt),
    "replay-failed": (lambda **f: run_with_fault(**f, fault="resolve_eio", after=40,
                                                 delay_us=2000), REPLAY, uffdkvm.RunError),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_pusher_leaves_no_thread_when_the_run_ends_early(kvm, ending):
    """The pusher ran (one thread more than the same run without it) and is
    gone when the run fails, times out or is interrupted."""
    end, prefetch, raised = ENDINGS[ending]
    _peak_threads_during(lambda: end(**BASE, **prefetch))  # what fills once (thread stacks)
    before = resources()
    without, error = _peak_threads_during(lambda: end(**BASE))
    assert isinstance(error, raised), error
    assert_released(before)
    with_pusher, error = _peak_threads_during(lambda: end(**BASE, **prefetch))
    assert isinstance(error, raised), error
    assert with_pusher == without + 1, (with_pusher, without)
    assert_released(before, maps_slack=4)
    # and the process runs the next experiment
    assert run(mem_per_vcpu="64K", prefetch="background").verified


def test_a_bad_prefetched_page_the_guest_never_touches_is_named_as_prefetched(kvm, tmp_path):
    """A page prefetch installed that the guest never touches must hold the
    source's bytes; when it does not, the message says prefetch put it
    there (not that it should hold what it held before the run)."""
    snap = uffdkvm.make_snapshot(tmp_path / "mem.img", MEM, seed=5)
    fields = dict(mem_per_vcpu=MEM, source="file", source_path=snap, touch_percent=50,
                  prefetch="readahead", prefetch_pages=64, timeout_s=60)
    visits = run(**fields, trace_faults=True).page_visits
    first = next(i for i, v in enumerate(visits) if v)
    # Readahead after the first fault installs every page of the next 64
    # the guest has not faulted: an untouched one among them for certain.
    page = next(i for i in range(first + 1, first + 65) if not visits[i])
    r = run_with_fault(**fields, fault="source_wrong_offset", after=page)
    assert not r.verified and r.bad_pages == 1, r.verify_message
    assert "untouched by the guest, installed by prefetch: the source file's bytes" \
        in r.verify_message, r.verify_message


def test_a_page_a_fault_installed_is_not_counted_as_prefetched(kvm):
    """With prefetch on, verification knows which pages a fault installed.
    The host's record of visits drops the guest's first page (test hook),
    which its fault installed: it must not pass as prefetch's (holding the
    resolver's data, it would), and the message says a fault installed it."""
    r = run_with_fault(mem_per_vcpu="2M", touch_percent=25, write_percent=0,
                       prefetch="readahead", fault="untouched_page", after=0)
    assert not r.verified and r.bad_pages == 1, r.verify_message
    assert "untouched by the guest, yet a fault installed it" in r.verify_message, \
        r.verify_message


THP_RESOLVER_CHILD = """
import uffdkvm
try:
    for i in range(40):
        r = uffdkvm.run(vcpus=2, mem_per_vcpu="16M", backing="anonymous_thp", resolver="vcpu",
                        timeout_s=60, **(dict(prefetch="background") if i % 2 else
                                         dict(overlap=True)))
        assert r.verified, r.verify_message
except uffdkvm.HostUnsupportedError as e:
    print("unsupported:", e)
else:
    print("ok")
"""


def test_a_vcpu_resolver_never_touches_a_thp_page_another_copy_has_not_reached(kvm):
    """anonymous_thp units go in 4 KiB at a time: a vCPU resolving its own
    fault whose copy meets the pusher's (or, with overlap, another vCPU's)
    copy of the same unit half done gets EEXIST before its page is there.
    It must wait for the page before touching it (the MMIO completion's
    memcpy): on its SIGBUS uffd, the process would die of SIGBUS. Without
    the wait some 1 run in 4 died here."""
    p = subprocess.run(python(code=THP_RESOLVER_CHILD), capture_output=True,
                       text=True, timeout=300, env=CHILD_ENV)
    if p.stdout.startswith("unsupported:"):
        host_skip(NO_THP, p.stdout.strip())
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])


def test_replay_refuses_an_order_recorded_with_another_page_size(kvm, tmp_path):
    """Indices count pages of the backing's size: a THP run's order names
    2 MiB pages, which on 4 KiB pages would be other memory."""
    thp = run_or_skip(vcpus=1, mem_per_vcpu="4M", backing="anonymous_thp",
                      record_touch_order=True)
    path = tmp_path / "thp.txt"
    thp.save_touch_order(path)
    with pytest.raises(uffdkvm.ConfigError, match="counts 2097152-byte pages") as info:
        uffdkvm.Config(vcpus=1, mem_per_vcpu="4M", prefetch="replay", replay_from=path)
    assert info.value.field == "replay_from"
    again = uffdkvm.Config(vcpus=1, mem_per_vcpu="4M", backing="anonymous_thp",
                           prefetch="replay", replay_from=path)
    assert again.replay_from == thp.touch_order
