"""source="remote": run() starts a page server process for the run, the
installing threads (readers, resolving vCPUs, the prefetch pusher) fetch
every page from it over connections of their own, every page is verified
against the snapshot, the server's model (latency, bandwidth, inflight cap)
has its effect on the run, and a server that dies or hangs fails the run
cleanly: a clear error, no hang, nothing left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command
from helpers.hostfacts import NO_UFFD_MOVE, host_skip
from helpers.resources import assert_released, resources
from helpers.runs import run_or_skip, run_with_fault
from helpers.skips import needs_loopback

import uffdkvm
from uffdkvm import ConfigError, RunError, RunTimeoutError
from uffdkvm.pages.server import PageServer

pytestmark = pytest.mark.kvm

PAGE = 4096
VCPUS = 2
MEM = 2 << 20                       # per vCPU: one 2 MiB huge page, 512 pages of 4 KiB
REGION = VCPUS * MEM
SERVE_PAGES = "uffdkvm.pages.process"
RUN_MODULE = sys.modules["uffdkvm.run"]   # uffdkvm.run is the function


@pytest.fixture
def servers(monkeypatch):
    """The PageServers run() starts, in order (the same class, recorded)."""
    started: list[PageServer] = []

    class Recorded(PageServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(RUN_MODULE, "PageServer", Recorded)
    return started


def remote_run(snapshot, **fields):
    return run_or_skip(**{"vcpus": VCPUS, "mem_per_vcpu": MEM, "source": "remote",
                          "source_path": snapshot, **fields})


def fetches(r):
    """(the fault fetches, the prefetch fetches) the run made, from its
    own counts: each reader fetched source_bytes, of which its readahead
    copies (prefetched, prefetch_eexist) were prefetch; the pusher fetched
    pusher_source_bytes over its own connection."""
    page = r.page_size
    readers = sum(x.source_bytes for x in r.readers) // page
    readahead = sum(x.prefetched + x.prefetch_eexist for x in r.readers)
    return readers - readahead, readahead + r.pusher_source_bytes // page


# The pusher's pipeline from a page server (csrc/uffd/pusher.c): requests
# in flight, and pages per request at most.
PUSHER_DEPTH, PUSHER_CHUNK = 16, 16


def in_flight_at_end(r):
    """(requests, pages) the prefetching threads may have had in flight
    when the run ended: asked for and counted by the server, given up by
    the thread (not in source_bytes): a readahead request per reader, of up
    to its window, or the pusher's pipeline."""
    c = r.config
    if c.prefetch == "readahead":
        return len(r.readers), len(r.readers) * c.prefetch_pages
    if c.prefetch in ("background", "replay"):
        return PUSHER_DEPTH, PUSHER_DEPTH * PUSHER_CHUNK
    return 0, 0


def assert_from_server(r):
    """Verified against the snapshot, and the server's own counters (another
    process's) agree with what the run says it fetched: faults urgent,
    prefetch not, every byte."""
    assert r.verified, r.verify_message
    assert r.source == "remote"
    s = r.page_server
    assert s is not None
    fault_fetches, prefetch_pages = fetches(r)
    slack_requests, slack_pages = in_flight_at_end(r)
    assert s.errors == 0, s
    assert s.requests == s.urgent + s.background, s
    assert s.served <= s.requests, s
    assert s.urgent == fault_fetches, (s, fault_fetches)
    # Prefetch asks for runs of pages: a request per run, at most one per page.
    assert s.background <= prefetch_pages + slack_requests, (s, prefetch_pages)
    if prefetch_pages:
        assert s.background > 0, s
    # Those cut short were served, or dropped unserved (their connection
    # closed first).
    assert r.source_bytes <= s.bytes <= r.source_bytes + slack_pages * r.page_size, s
    # Each resolved fault fetched its page; a message whose page prefetch
    # had installed needs no fetch.
    messages = sum(x.faults + x.eexist for x in r.readers)
    assert r.faults <= s.urgent <= messages, (r.faults, s.urgent, messages)


def server_children():
    """Processes of ours running the page server."""
    out = []
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rpartition(")")[2].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ppid == me and SERVE_PAGES.encode() in cmdline:
            out.append(int(pid))
    return out


def assert_server_gone(server):
    """The server process is reaped and its socket directory removed."""
    with pytest.raises(ProcessLookupError):
        os.kill(server.pid, 0)
    assert server.stopped
    if server.address.startswith("unix:"):
        assert not os.path.exists(os.path.dirname(server.address[5:])), server.address
    assert not server_children()


def signal_server_later(servers, sig, after_s):
    """A thread that sends sig to the run's server after_s after it is up."""
    def go():
        deadline = time.monotonic() + 30
        while not servers and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(after_s)
        if servers:
            os.kill(servers[0].pid, sig)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


# ---- every page from the server ----

@pytest.mark.parametrize("resolver", ["readers", "vcpu"])
@pytest.mark.parametrize("backing", ["anonymous", "anonymous_thp"])
def test_every_page_holds_the_snapshots_bytes(kvm, snapshot, backing, resolver):
    readers = {"readers": 2} if resolver == "readers" else {}
    r = remote_run(snapshot, backing=backing, resolver=resolver, write_percent=50, **readers)
    assert_from_server(r)
    assert r.page_server.background == 0
    assert r.source_bytes == REGION


@pytest.mark.parametrize("resolver", ["readers", "vcpu"])
def test_move_installs_the_snapshots_bytes(kvm, snapshot, resolver):
    if NO_UFFD_MOVE.holds:
        host_skip(NO_UFFD_MOVE, f"resolve='move': {NO_UFFD_MOVE.evidence}")
    r = remote_run(snapshot, resolver=resolver, resolve="move", write_percent=50)
    assert_from_server(r)
    assert all(x.moves == x.faults + x.eexist and x.copies == 0 for x in r.readers)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_the_transport_is_the_one_asked_for(kvm, snapshot, servers, transport):
    r = remote_run(snapshot, remote_transport=transport)
    assert_from_server(r)
    assert len(servers) == 1
    assert servers[0].address.startswith({"unix": "unix:/", "tcp": "tcp:127.0.0.1:"}[transport])
    # The run's connections: one per reader, and run()'s own for the stats.
    assert r.page_server.connections == len(r.readers) + 1
    assert_server_gone(servers[0])


@pytest.mark.parametrize("prefetch,fields", [
    ("readahead", {"prefetch_pages": 8}),
    ("background", {}),
    ("replay", {"replay_from": list(range(REGION // PAGE - 1, -1, -2))}),
])
def test_prefetch_fetches_are_background_and_counted(kvm, snapshot, prefetch, fields):
    r = remote_run(snapshot, prefetch=prefetch, readers=2, **fields)
    assert_from_server(r)
    assert r.page_server.background > 0
    if prefetch != "readahead":
        # The pusher's connection is counted in source_bytes (its own field).
        # What it installed or found there, and at most the chunk it had in
        # hand when the run ended.
        pusher = r.pusher_source_bytes // PAGE
        assert 0 < r.pushed_pages + r.prefetch_eexist <= pusher
        assert pusher <= r.pushed_pages + r.prefetch_eexist + PUSHER_CHUNK
    else:
        assert r.pusher_source_bytes == 0


def test_the_pushers_bytes_are_in_source_bytes(kvm, snapshot):
    """The pusher fetches most of the region; the server's byte count is
    the readers' and the pusher's together."""
    r = remote_run(snapshot, prefetch="background")
    readers = sum(x.source_bytes for x in r.readers)
    assert r.pusher_source_bytes >= r.pushed_pages * PAGE > 0
    assert r.source_bytes == readers + r.pusher_source_bytes
    # The server served them all, and at most the pusher's pipeline in
    # flight as the run ended, which it gave up.
    assert r.source_bytes <= r.page_server.bytes <= \
        r.source_bytes + PUSHER_DEPTH * PUSHER_CHUNK * PAGE


def test_background_prefetch_with_the_vcpus_resolving(kvm, snapshot):
    r = remote_run(snapshot, prefetch="background", resolver="vcpu")
    assert_from_server(r)
    assert r.page_server.background > 0


@pytest.mark.parametrize("prefetch", ["none", "readahead"])
def test_a_partial_working_set_fetches_what_it_installs(kvm, snapshot, prefetch):
    r = remote_run(snapshot, touch_percent=40, write_percent=50, prefetch=prefetch,
                   pattern="random")
    assert_from_server(r)
    assert r.touched_pages < REGION // PAGE * 0.6
    assert r.page_server.urgent <= r.touched_pages


def test_a_page_from_the_wrong_offset_fails_verification(kvm, snapshot):
    after = 5
    r = run_with_fault(vcpus=VCPUS, mem_per_vcpu=MEM, source="remote", source_path=snapshot,
                       trace_faults=True, fault="source_wrong_offset", after=after)
    assert not r.verified and r.bad_pages == 1
    assert f"page at gpa 0x{min(r.fault_trace.gpa) + after * PAGE:x}:" in r.verify_message, \
        r.verify_message


# ---- the server's model, seen from the run ----

def test_latency_is_paid_per_fault(kvm, snapshot):
    """One vCPU and one reader fault one page at a time: each waits at
    least the latency (a lower bound, not a speed test)."""
    latency_us, pages = 1000, 128
    r = remote_run(snapshot, vcpus=1, mem_per_vcpu=pages * PAGE, readers=1,
                   remote_latency_us=latency_us)
    assert_from_server(r)
    assert r.seconds >= pages * latency_us * 1e-6, r.seconds


def test_bandwidth_limits_the_bytes_a_run_can_fetch(kvm, snapshot):
    mbps = 50
    r = remote_run(snapshot, vcpus=1, mem_per_vcpu="1M", remote_bandwidth_mbps=mbps)
    assert_from_server(r)
    # Every page but the first crossed the link after the one before it.
    assert r.seconds >= (r.page_server.bytes - PAGE) * 8 / (mbps * 1e6), r.seconds


@pytest.mark.parametrize("max_inflight", [1, 0])
def test_max_inflight_1_makes_concurrent_faults_queue(kvm, snapshot, max_inflight):
    """Two vCPUs faulting through two readers: with one request in flight
    at a time one of them waits for the other's latency; with no cap none
    waits beyond its own latency."""
    latency_us = 500
    r = remote_run(snapshot, mem_per_vcpu="512K", readers=2, remote_latency_us=latency_us,
                   max_inflight=max_inflight)
    assert_from_server(r)
    s = r.page_server
    if max_inflight:
        assert s.queue_seconds_total > 20 * latency_us * 1e-6, s
        assert s.queue_seconds_max > latency_us * 1e-6 / 2, s
    else:
        assert s.queue_seconds_max < latency_us * 1e-6 / 2, s


def test_faults_are_served_ahead_of_the_pushers_requests(kvm, snapshot):
    """One request served at a time, two vCPUs faulting through two
    readers, and the pusher asking all along: a fault (URGENT) is nearly
    always waiting when the slot frees, and goes first, so the pusher gets
    the slot only when both readers are slower to ask again than a request
    takes (2 ms: rare, even on a loaded host; a few percent of the slots
    with two CPU hogs on this 2-CPU host). Served in arrival order, the
    pusher (one request of three waiting) would get about a third of them
    (taking turns between the kinds, half)."""
    r = remote_run(snapshot, mem_per_vcpu="512K", prefetch="background",
                   remote_latency_us=2000, max_inflight=1, readers=2)
    assert_from_server(r)
    s = r.page_server
    assert s.urgent > 0, s
    assert s.background < s.requests / 4, s


# ---- a server that dies or hangs ----

DEATH_BOUND_S = 20.0     # the run must end within this of the kill: no hang


@pytest.mark.parametrize("fields", [
    {},
    {"resolver": "vcpu"},
    # Paced (3 ms a page), so that the pusher is still fetching at the kill.
    {"prefetch": "background", "prefetch_bandwidth_mbps": 10},
], ids=["readers", "vcpu", "pusher"])
def test_a_server_killed_mid_run_fails_the_run(kvm, snapshot, servers, fields):
    # 1024 pages at 2 ms each: seconds of run, killed after 0.3 s of it.
    before = resources()
    killer = signal_server_later(servers, signal.SIGKILL, 0.3)
    t0 = time.monotonic()
    with pytest.raises(RunError) as info:
        uffdkvm.run(vcpus=1, mem_per_vcpu=REGION, source="remote", source_path=snapshot,
                    remote_latency_us=2000, **fields)
    assert time.monotonic() - t0 < DEATH_BOUND_S
    killer.join(5)
    message = str(info.value)
    assert servers[0].address in message, message
    assert f"the page server (pid {servers[0].pid}) was killed by signal 9" in message, message
    assert_server_gone(servers[0])
    assert_released(before, within_s=5)


def test_a_hung_server_ends_in_the_runs_timeout(kvm, snapshot, servers):
    """SIGSTOP: the server holds its connections and answers nothing. The
    run's timeout ends it, and stopping the server does not wait for it."""
    before = resources()
    stopper = signal_server_later(servers, signal.SIGSTOP, 0.3)
    timeout_s = 2.0
    t0 = time.monotonic()
    try:
        with pytest.raises(RunTimeoutError):
            uffdkvm.run(vcpus=1, mem_per_vcpu=REGION, source="remote", source_path=snapshot,
                        remote_latency_us=2000, timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        stopper.join(5)
        # Well within the server's stop timeout (pageserver.STOP_TIMEOUT_S)
        # past the run's own: a stopped server is woken to take its SIGTERM.
        assert elapsed < timeout_s + 4, elapsed
        assert_server_gone(servers[0])
        assert_released(before, within_s=5)
    finally:
        for pid in server_children():
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("prefetch", ["none", "background"])
def test_a_huge_time_limit_is_not_an_immediate_timeout(kvm, snapshot, prefetch):
    """timeout_s just under what the core takes as "no limit" (2**64 ns):
    each fetch waits up to the run's time limit, so its deadline (now plus
    that) must saturate, not wrap around into the past and fail the first
    fetch that waits at all with ETIMEDOUT (a fault's fetch, and the
    pusher's pipelined send and receive)."""
    huge_s = (2**64 - 2**34) / 1e9           # 17 s short of 2**64 ns
    assert huge_s * 1e9 < 2**64 - 1          # the core gets it, not "no limit"
    r = remote_run(snapshot, remote_latency_us=1000, timeout_s=huge_s, prefetch=prefetch)
    assert r.verified
    assert r.page_server is not None and r.page_server.served > 0


# ---- other ways out leave no server ----

def test_a_failed_run_leaves_no_server(kvm, snapshot, servers):
    before = resources()
    with pytest.raises(RunError, match="EIO|Input/output"):
        run_with_fault(vcpus=VCPUS, mem_per_vcpu=MEM, source="remote", source_path=snapshot,
                       fault="resolve_eio", after=3)
    assert_server_gone(servers[0])
    assert_released(before, within_s=5)


def test_an_interrupted_run_leaves_no_server(kvm, snapshot, servers):
    class Stop(Exception):
        pass

    def progress(p):
        if p.phase == "running" and p.done:
            raise Stop      # mid-run: pages fetched, more to fetch

    before = resources()
    with pytest.raises(Stop):
        uffdkvm.run(vcpus=1, mem_per_vcpu=REGION, source="remote", source_path=snapshot,
                    remote_latency_us=1000, progress=progress)
    assert_server_gone(servers[0])
    assert_released(before, within_s=5)


def test_ctrl_c_leaves_no_server(kvm, snapshot, servers):
    """SIGINT to this process mid-run (0.4 s after its server is up, which
    under TCG takes longer than that): KeyboardInterrupt, promptly, with
    the server stopped and reaped."""
    before = resources()
    sent = []

    def interrupt():
        deadline = time.monotonic() + 30
        while not servers and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.4)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        uffdkvm.run(vcpus=1, mem_per_vcpu=REGION, source="remote", source_path=snapshot,
                    remote_latency_us=5000)     # 5 s of run
    assert time.monotonic() - sent[0] < 2.6
    timer.join()
    assert_server_gone(servers[0])
    assert_released(before, within_s=5)


def test_a_server_that_cannot_start_fails_the_run(kvm, snapshot, servers, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")   # the server's interpreter
    before = resources()
    with pytest.raises(RunError, match="page server"):
        remote_run(snapshot)
    assert not servers and not server_children()
    assert_released(before, within_s=5)


# ---- config errors ----

@pytest.mark.parametrize("field,value", [("remote_transport", "tcp"),
                                         ("remote_latency_us", 30),
                                         ("remote_bandwidth_mbps", 100),
                                         ("max_inflight", 2)])
@pytest.mark.parametrize("source", ["synthetic", "file"])
def test_remote_fields_need_the_remote_source(tmp_path, field, value, source):
    path = {"source_path": str(tmp_path / "x.img")} if source == "file" else {}
    with pytest.raises(ConfigError, match=f"^{field}: ") as info:
        uffdkvm.Config(source=source, **path, **{field: value})
    assert info.value.field == field
    assert "source='remote'" in str(info.value)


def test_source_cache_is_the_file_sources(tmp_path):
    with pytest.raises(ConfigError, match="source_cache") as info:
        uffdkvm.Config(source="remote", source_path=str(tmp_path / "x.img"),
                       source_cache="cold")
    assert "source='file'" in str(info.value)


def test_remote_needs_a_source_path():
    with pytest.raises(ConfigError, match="^source_path: ") as info:
        uffdkvm.Config(source="remote")
    assert "make_snapshot" in str(info.value)


@pytest.mark.parametrize("size", [None, REGION // 2])
def test_a_missing_or_short_snapshot_names_source_path_and_make_snapshot(
        kvm, tmp_path, servers, size):
    path = tmp_path / "snap.img"
    if size is not None:
        uffdkvm.make_snapshot(path, size)
    for call in (uffdkvm.run, uffdkvm.probe):
        with pytest.raises(ConfigError, match="^source_path: ") as info:
            call(vcpus=VCPUS, mem_per_vcpu=MEM, source="remote", source_path=path)
        assert info.value.field == "source_path"
        assert str(path) in str(info.value) and "make_snapshot" in str(info.value)
    assert not servers and not server_children()


# ---- the CLI ----

def test_cli_runs_the_remote_source_and_reports_the_servers_counters(kvm, snapshot):
    needs_loopback("--remote-transport tcp")
    out = subprocess.run(
        uffdkvm_command("-v", "2", "-b", "1M", "--source", "remote",
                        "--source-path", str(snapshot), "--remote-transport", "tcp",
                        "--remote-latency-us", "20", "--remote-bandwidth-mbps", "8000",
                        "--max-inflight", "1",
                        "--prefetch", "background", "--json"),
        capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert out.returncode == 0, out.stderr
    r = uffdkvm.Result.from_json(out.stdout)
    c = r.config
    assert (c.source, c.source_path, c.remote_transport, c.remote_latency_us,
            c.remote_bandwidth_mbps, c.max_inflight) == ("remote", str(snapshot), "tcp", 20,
                                                         8000, 1)
    assert_from_server(r)
    assert r.page_server.background > 0

    text = subprocess.run(
        uffdkvm_command("-v", "2", "-b", "1M", "--source", "remote",
                        "--source-path", str(snapshot), "--remote-latency-us", "20",
                        "--max-inflight", "2"),
        capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.startswith("Page source:"))
    assert f"remote page server for {snapshot} (unix, latency 20 us, bandwidth unlimited, " \
           f"max in flight 2), {2 << 20} bytes fetched" in line, line
    assert f"the server: {2 << 20 >> 12} requests ({2 << 20 >> 12} urgent, 0 background), " \
           f"{2 << 20} bytes, queued " in line, line


def test_cli_remote_without_a_snapshot_names_source_path(kvm, tmp_path):
    out = subprocess.run(
        uffdkvm_command("-v", "1", "-b", "1M", "--source", "remote",
                        "--source-path", str(tmp_path / "none.img")),
        capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert out.returncode != 0
    assert "source_path" in out.stderr and "make_snapshot" in out.stderr, out.stderr


def test_the_default_time_limit_makes_room_for_the_servers_latency(kvm):
    """Without timeout_s, a slow page server's run gets the time it needs:
    twice its latency (and link) per page on top of the usual limit."""
    base = uffdkvm.Config(vcpus=1, mem_per_vcpu="64K")
    slow = base.replace(source="remote", source_path="/var/tmp/x.img",
                        remote_latency_us=5_000_000)
    fast = base.replace(source="remote", source_path="/var/tmp/x.img")
    assert fast.effective_timeout_s == base.effective_timeout_s
    assert slow.effective_timeout_s >= base.effective_timeout_s + 2 * 16 * 5.0
    link = base.replace(source="remote", source_path="/var/tmp/x.img",
                        remote_bandwidth_mbps=1)
    assert link.effective_timeout_s >= base.effective_timeout_s + 2 * 16 * 4096 * 8 / 1e6
