"""The page server (csrc/remote/, uffdkvm/pageserver.py): a real process, a real socket.

What it serves (the file's bytes, refusals past the end), its model on the
server's side (latency, bandwidth, max_inflight, URGENT ahead of background),
its counters, and its lifetime: stop() leaves no process, socket or fd; a
server killed mid-fetch fails the fetch at once with the server-gone error
(Python client and C client); a server whose parent dies exits by itself.

Timing checks are lower bounds that the model guarantees (a reply is never
earlier than its latency; n replies never beat the link) plus generous
"does not hang" upper bounds; no test times speed.
"""
from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from children import ENV as CHILD_ENV
from children import python
from conftest import needs_test_hooks

import uffdkvm
from uffdkvm import ConfigError
from uffdkvm.pageserver import (
    PageClient,
    PageServer,
    PageServerError,
    PageServerGone,
    PageServerStats,
)

SNAPSHOT_BYTES = 8 << 20
_2M = 2 << 20


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    path = tmp_path_factory.mktemp("pageserver") / "snapshot.img"
    path.write_bytes(random.Random(11).randbytes(SNAPSHOT_BYTES))
    return path


@pytest.fixture(scope="module")
def data(snapshot):
    return snapshot.read_bytes()


def server_processes(marker: str) -> list[int]:
    """Live processes whose command line holds marker (zombies do not count)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


def gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


# ---- what it serves ----

OFFSETS_LENGTHS = [(0, 4096), (4096, 4096), (12345, 4096), (0, _2M), (_2M, _2M),
                   (SNAPSHOT_BYTES - 4096, 4096), (SNAPSHOT_BYTES - _2M, _2M),
                   (SNAPSHOT_BYTES - 1, 1), (7, 1), (3 * _2M + 4096, 3 * 4096)]


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_bytes_served_are_the_files(snapshot, data, transport):
    rng = random.Random(5)
    cases = OFFSETS_LENGTHS + [(rng.randrange(0, SNAPSHOT_BYTES // 4096) * 4096, 4096)
                               for _ in range(40)]
    with PageServer(snapshot, transport=transport) as server:
        assert server.address.startswith(transport + ":")
        with server.connect() as client:
            for offset, length in cases:
                assert client.fetch(offset, length, urgent=offset % 2 == 0) == \
                    data[offset:offset + length], (offset, length)
            # Pipelined: every reply whole, each matched by its offset.
            for offset, length in cases:
                client.send(offset, length)
            replies = [client.recv() for _ in cases]
            assert [(r.offset, r.data) for r in replies] == \
                [(o, data[o:o + n]) for o, n in cases]


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_c_client_gets_the_files_bytes(snapshot, data, transport):
    needs_test_hooks("the C client is reached through _core.remote_fetch")
    with PageServer(snapshot, transport=transport) as server:
        for offset, length in OFFSETS_LENGTHS:
            got = uffdkvm._core.remote_fetch(server.address, offset, length, True, 30.0)
            assert got == data[offset:offset + length], (offset, length)
        stats = server.stats()
    assert stats.requests == len(OFFSETS_LENGTHS)
    assert stats.bytes == sum(n for _, n in OFFSETS_LENGTHS)


def test_requests_outside_the_file_are_refused(snapshot, data):
    with PageServer(snapshot) as server, server.connect() as client:
        with pytest.raises(PageServerError, match="Numerical result out of range") as e:
            client.fetch(SNAPSHOT_BYTES - 4095, 4096)
        assert e.value.errno == errno.ERANGE
        with pytest.raises(PageServerError) as e:
            client.fetch(0, 0)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(PageServerError) as e:
            client.fetch(2**63, 4096)
        assert e.value.errno == errno.ERANGE
        # The connection is still good: a refusal is a whole reply.
        assert client.fetch(4096, 4096) == data[4096:8192]
        client.send(0, 4096)
        with pytest.raises(PageServerError, match="pipelined replies still to recv"):
            client.fetch(0, 4096)
        assert client.recv().data == data[:4096]
        assert server.stats().errors == 3


# ---- the model ----

def test_latency_is_honoured(snapshot):
    latency_us = 20_000
    with PageServer(snapshot, latency_us=latency_us) as server, server.connect() as client:
        for _ in range(5):
            t0 = time.monotonic()
            client.fetch(0, 4096, urgent=True)
            elapsed = time.monotonic() - t0
            assert elapsed >= latency_us * 1e-6, f"a reply after {elapsed * 1e6:.0f} us"
            assert elapsed < 10.0, "does not hang"


def test_bandwidth_is_honoured(snapshot):
    mbps, n, size = 80, 8, 256 << 10     # 10 MB/s: 8 x 256 KiB take >= 0.21 s
    with PageServer(snapshot, bandwidth_mbps=mbps) as server, server.connect() as client:
        t0 = time.monotonic()
        for i in range(n):
            client.send(i * size, size)
        for _ in range(n):
            client.recv()
        elapsed = time.monotonic() - t0
    floor = n * size * 8 / (mbps * 1e6)
    assert elapsed >= floor, f"{n} x {size} bytes in {elapsed:.3f} s, the link allows {floor:.3f}"
    assert elapsed < 30.0, "does not hang"


def concurrent_fetches(server, clients: int) -> float:
    """Seconds for `clients` threads, each on its own connection, to fetch
    one page at the same moment."""
    conns = [server.connect() for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def fetch(c: PageClient, i: int) -> None:
        try:
            barrier.wait()
            c.fetch(i * 4096, 4096)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=fetch, args=(c, i)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    for c in conns:
        c.close()
    assert not errors, errors
    return elapsed


def test_max_inflight_1_serialises_concurrent_clients(snapshot):
    latency = 0.2
    with PageServer(snapshot, latency_us=int(latency * 1e6), max_inflight=1) as server:
        elapsed = concurrent_fetches(server, 4)
        stats = server.stats()
    assert elapsed >= 4 * latency, f"4 fetches one at a time in {elapsed:.3f} s"
    assert elapsed < 30.0, "does not hang"
    # The last of the four waited for three others: queue time beyond its latency.
    assert stats.queue_seconds_max >= 2 * latency, stats
    assert stats.queue_seconds_total >= 5 * latency, stats


def test_no_inflight_cap_serves_concurrent_clients_together(snapshot):
    latency = 0.2
    with PageServer(snapshot, latency_us=int(latency * 1e6), max_inflight=0) as server:
        concurrent_fetches(server, 4)
        stats = server.stats()
    # Each started as it arrived: none queued (the server's own clock).
    assert stats.served == 4
    assert stats.queue_seconds_max < latency / 4, stats


def test_urgent_jumps_a_queue_of_background_requests(snapshot):
    latency = 0.05
    background = 6
    with PageServer(snapshot, latency_us=int(latency * 1e6), max_inflight=1) as server, \
            server.connect() as bg, server.connect() as fault:
        arrived: list[float] = []
        for i in range(background):
            bg.send(i * 4096, 4096)
        # Wait until the server holds them all (one in flight, the rest queued).
        deadline = time.monotonic() + 10
        while server.stats().requests < background:
            assert time.monotonic() < deadline, "does not hang"
            time.sleep(0.001)

        def take() -> None:
            for _ in range(background):
                bg.recv()
                arrived.append(time.monotonic())

        reader = threading.Thread(target=take)
        reader.start()
        fault.fetch(_2M, 4096, urgent=True)
        urgent_at = time.monotonic()
        reader.join(30)
        assert len(arrived) == background
        stats = server.stats()
    before = sum(1 for t in arrived if t < urgent_at)
    # Without the jump it would come after all six; with it, after the one in
    # flight (and perhaps one more that took the slot while it was sent).
    assert before <= 2, f"{before} of {background} background replies came before the fault's"
    assert (stats.urgent, stats.background) == (1, background)


def test_urgent_overtakes_background_on_the_same_connection(snapshot):
    with PageServer(snapshot, latency_us=50_000, max_inflight=1) as server, \
            server.connect() as client:
        for i in range(5):
            client.send(i * 4096, 4096)
        client.send(_2M, 4096, urgent=True)
        order = [client.recv().offset for _ in range(6)]
    assert order.index(_2M) <= 1, order


def test_stats_count_what_was_sent(snapshot):
    sizes = [4096, 8192, _2M, 1, 4096 * 3]
    with PageServer(snapshot) as server:
        with server.connect() as a, server.connect() as b:
            for i, n in enumerate(sizes):
                a.fetch(i * _2M // 2, n, urgent=True)
            for i in range(7):
                b.fetch(i * 4096, 4096)
            with pytest.raises(PageServerError):
                b.fetch(SNAPSHOT_BYTES, 4096)
        stats = server.stats()
    assert isinstance(stats, PageServerStats)
    assert stats.requests == len(sizes) + 7
    assert stats.urgent == len(sizes)
    assert stats.background == 7
    assert stats.served == len(sizes) + 7
    assert stats.bytes == sum(sizes) + 7 * 4096
    assert stats.errors == 1
    assert stats.connections == 3          # a, b and the stats connection
    assert stats.stats_requests == 1
    assert stats.dropped == 0
    assert 0 <= stats.queue_seconds_max <= stats.queue_seconds_total


def test_many_connections_each_get_their_own_bytes(snapshot, data):
    conns, each = 32, 16
    with PageServer(snapshot) as server:
        clients = [server.connect() for _ in range(conns)]
        rng = random.Random(3)
        asked = [[rng.randrange(SNAPSHOT_BYTES // 4096) * 4096 for _ in range(each)]
                 for _ in clients]
        for client, offsets in zip(clients, asked, strict=True):
            for offset in offsets:
                client.send(offset, 4096, urgent=offset % 3 == 0)
        for client, offsets in zip(clients, asked, strict=True):
            got = sorted((r.offset, r.data) for r in (client.recv() for _ in offsets))
            assert got == sorted((o, data[o:o + 4096]) for o in offsets)
            client.close()
        stats = server.stats()
    assert stats.connections == conns + 1
    assert stats.requests == stats.served == conns * each


def test_a_client_far_ahead_of_its_replies_is_served_whole(snapshot, data):
    # More requests than the server reads ahead for one connection (4096):
    # it stops reading that connection and starts again as replies drain.
    n = 6000
    with PageServer(snapshot) as server, server.connect(timeout_s=20) as client:
        # 96 KiB of requests: one write, within the socket's buffer.
        client.send_many([((i % 2048) * 4096, 4096) for i in range(n)])
        offsets = [client.recv().offset for _ in range(n)]
    assert offsets == [(i % 2048) * 4096 for i in range(n)]


def test_a_client_that_leaves_drops_its_queue_and_others_go_on(snapshot, data):
    with PageServer(snapshot, latency_us=20_000, max_inflight=1) as server:
        leaver = server.connect()
        for i in range(10):
            leaver.send(i * 4096, 4096)
        deadline = time.monotonic() + 10
        while server.stats().requests < 10:
            assert time.monotonic() < deadline, "does not hang"
            time.sleep(0.001)
        leaver.close()
        with server.connect() as client:
            assert client.fetch(_2M, 4096) == data[_2M:_2M + 4096]
        stats = server.stats()
    assert stats.dropped >= 8, stats          # at most one in flight, one on the link
    assert stats.served <= 3, stats


# ---- lifetime ----

def test_server_killed_mid_fetch_fails_the_fetch_promptly(snapshot):
    latency_s = 10.0     # a reply this late would mean the client waited for one
    with PageServer(snapshot, latency_us=int(latency_s * 1e6)) as server:
        client = server.connect()
        threading.Timer(0.3, os.kill, (server.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(PageServerGone, match="page server closed the connection"):
            client.fetch(0, 4096, urgent=True)
        assert time.monotonic() - t0 < latency_s / 2
        client.close()
        assert gone(server.pid, 10)      # the kernel closes its fds before it is gone
        with pytest.raises(PageServerError):
            server.connect(timeout_s=2)
    # Killed, it could not remove its socket: stop() did.
    assert not os.path.exists(os.path.dirname(server.address[len("unix:"):]))


def test_c_client_fails_promptly_when_the_server_is_killed(snapshot):
    needs_test_hooks("the C client is reached through _core.remote_fetch")
    latency_s = 10.0
    with PageServer(snapshot, latency_us=int(latency_s * 1e6)) as server:
        threading.Timer(0.3, os.kill, (server.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(uffdkvm._core.CoreError) as e:
            uffdkvm._core.remote_fetch(server.address, 0, 4096, True, latency_s * 2)
        assert time.monotonic() - t0 < latency_s / 2
    kind, errnum, message = e.value.args
    assert errnum in (errno.ECONNRESET, errno.EPIPE), message
    assert "page server closed the connection" in message


def test_c_client_deadline(snapshot):
    needs_test_hooks("the C client is reached through _core.remote_fetch")
    with PageServer(snapshot, latency_us=5_000_000) as server:
        t0 = time.monotonic()
        with pytest.raises(uffdkvm._core.CoreError) as e:
            uffdkvm._core.remote_fetch(server.address, 0, 4096, True, 0.2)
        assert 0.2 <= time.monotonic() - t0 < 4.0
    assert e.value.args[1] == errno.ETIMEDOUT


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_stop_leaves_no_process_socket_or_fd(snapshot, transport):
    fds = fd_targets()
    server = PageServer(snapshot, transport=transport)
    pid, address = server.pid, server.address
    with server.connect() as client:
        client.fetch(0, 4096)
    server.stats()
    path = address[len("unix:"):] if transport == "unix" else None
    if path:
        assert os.path.exists(path)
    server.stop()
    assert server.stopped
    server.stop()                        # idempotent
    assert gone(pid, 0), f"page server {pid} still running after stop()"
    assert not Path(f"/proc/{pid}").exists(), "stop() reaped it: no zombie either"
    if path:
        assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    assert fd_targets() == fds
    with pytest.raises(PageServerError, match="connect"):
        PageClient(address, timeout_s=2)
    with pytest.raises(PageServerError, match="stopped"):
        server.stats()


def test_a_forgotten_server_dies_with_its_object(snapshot):
    fds = fd_targets()
    server = PageServer(snapshot)
    pid, path = server.pid, server.address[len("unix:"):]
    del server                           # the finalizer stops it
    assert gone(pid, 0)
    assert not os.path.exists(os.path.dirname(path))
    assert fd_targets() == fds


def test_a_forked_child_does_not_stop_its_parents_server(snapshot, data):
    with PageServer(snapshot) as server:
        pid = os.fork()
        if pid == 0:                     # the child: its copy stops, and exits
            try:
                server.stop()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        with server.connect() as client:
            assert client.fetch(0, 4096) == data[:4096]


PARENT = """
import sys, time
from uffdkvm.pageserver import PageServer
server = PageServer(sys.argv[1])
print(server.pid, server.address, flush=True)
time.sleep(600)
"""


def test_server_whose_parent_dies_exits_by_itself(snapshot, tmp_path):
    parent = subprocess.Popen(python(str(snapshot), code=PARENT), env=CHILD_ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_text, address = parent.stdout.readline().split()
        pid = int(pid_text)
        assert not gone(pid, 0)
        parent.kill()                    # no finalizer, no stop(): only the pipe closes
        parent.wait(10)
        assert gone(pid, 10), f"page server {pid} outlived its parent"
        sock = address[len("unix:"):]
        assert not os.path.exists(sock) and not os.path.exists(os.path.dirname(sock))
    finally:
        parent.kill()
        parent.wait(10)


INTERRUPTED = """
import os, signal, sys, threading, time
import uffdkvm.pageserver as ps
# A slow server: its ready line comes a second late, so the Ctrl-C lands inside
# PageServer() (in Popen, or waiting for the line) whatever this host's speed.
read_ready = ps._read_ready
ps._read_ready = lambda proc, timeout_s: (time.sleep(1.0), read_ready(proc, timeout_s))[1]
threading.Timer(float(sys.argv[2]), os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    server = ps.PageServer(sys.argv[1])
except KeyboardInterrupt:
    marker = sys.argv[1].encode()
    alive = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and entry != str(os.getpid()) and state != "Z":
            alive.append(entry)
    print("interrupted", *alive, flush=True)
    os._exit(0)                          # no finalizers, no atexit: what is left, stays
print("started", flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("after_s", [0.02, 0.1, 0.5])
def test_ctrl_c_while_starting_leaves_no_process(snapshot, tmp_path, after_s):
    # Its own copy of the snapshot: the process list is searched for its path.
    snap = tmp_path / f"interrupted-{after_s}.img"
    snap.write_bytes(snapshot.read_bytes()[:65536])
    out = subprocess.run(python(str(snap), str(after_s), code=INTERRUPTED),
                         env=CHILD_ENV, capture_output=True, text=True, timeout=60)
    words = out.stdout.split()
    assert words[:1] == ["interrupted"], out
    assert words[1:] == [], f"page server processes left after Ctrl-C: {words[1:]}"
    assert not server_processes(str(snap))


def test_start_failure_raises_with_the_servers_stderr(snapshot, monkeypatch):
    fds = fd_targets()
    monkeypatch.setattr(PageServer, "_listen_address", lambda self, tmpdir: "tcp:256.1.1.1:0")
    with pytest.raises(PageServerError, match=r"exited with status 1.*getaddrinfo"):
        PageServer(snapshot, transport="tcp")
    assert not server_processes("tcp:256.1.1.1:0")
    assert fd_targets() == fds


def test_bad_arguments_name_the_field(snapshot, tmp_path):
    with pytest.raises(ConfigError, match="transport"):
        PageServer(snapshot, transport="udp")
    with pytest.raises(ConfigError, match="latency_us"):
        PageServer(snapshot, latency_us=-1)
    with pytest.raises(ConfigError, match="max_inflight"):
        PageServer(snapshot, max_inflight=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="snapshot_path.*make_snapshot"):
        PageServer(tmp_path / "missing.img")


def test_server_command_reports_a_missing_snapshot(tmp_path):
    out = subprocess.run(python("--snapshot", tmp_path / "none.img",
                                "--listen", f"unix:{tmp_path}/s", module="uffdkvm.serve_pages"),
                         env=CHILD_ENV, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 1
    assert "none.img" in out.stderr and "No such file" in out.stderr
    assert not (tmp_path / "s").exists()


def test_config_fields_for_the_remote_source():
    c = uffdkvm.Config(source="remote", source_path="/var/tmp/snapshot.img",
                       remote_transport="TCP", remote_latency_us=30,
                       remote_bandwidth_mbps=10_000, max_inflight=4)
    assert (c.remote_transport, c.remote_latency_us, c.remote_bandwidth_mbps,
            c.max_inflight) == ("tcp", 30, 10_000, 4)
    d = uffdkvm.Config()
    assert (d.remote_transport, d.remote_latency_us, d.remote_bandwidth_mbps,
            d.max_inflight) == ("unix", 0, 0, 0)


REMOTE_FD_CHILD = """
import errno, json, os, re, resource, sys, uffdkvm
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
kw = dict(vcpus=2, mem_per_vcpu="1M", readers=8, allow_oversubscribe=True, wait="poll",
          source="remote", source_path=sys.argv[1], prefetch="background")
out = {}
def attempt(extra):
    opened = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (opened + extra, hard))
    try:
        return {"verified": uffdkvm.run(**kw).verified}
    except uffdkvm.UffdkvmError as e:
        return {"type": type(e).__name__, "emfile": e.errno == errno.EMFILE, "error": str(e)}
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
out["short"] = attempt(14)  # enough to start the page server, not for the run
m = re.search(r"needs (\\d+) more", out["short"].get("error", ""))
if m:
    out["enough"] = attempt(int(m.group(1)) + 8)  # + the page server's own pipes here
print(json.dumps(out))
"""


def test_a_remote_runs_fd_budget_counts_its_connections(kvm, snapshot):
    """The fd check before a run counts a page server connection per
    installing thread (16 readers here), the snapshot kept open to verify
    against, and the pusher's eventfd and connection: with the fds it says
    it needs, the run goes through instead of meeting EMFILE halfway."""
    p = subprocess.run(python(str(snapshot), code=REMOTE_FD_CHILD),
                       capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    short = out["short"]
    assert short.get("type") == "HostUnsupportedError" and short["emfile"], short
    assert "16 for page server connections" in short["error"], short
    assert "1 for the source file" in short["error"], short
    assert "2 for the prefetch pusher" in short["error"], short
    assert out.get("enough") == {"verified": True}, out
