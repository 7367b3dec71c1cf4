"""The page server (csrc/remote/, uffdkvm/pages/server.py): a real process, a real socket.

What it serves (the file's bytes, refusals past the end), its model on the
server's side (latency, bandwidth, max_inflight, URGENT ahead of background),
its counters, and its lifetime: stop() leaves no process, socket or fd; a
server killed mid-fetch fails the fetch at once with the server-gone error;
a server whose parent dies exits by itself.

PageClient is the C client (csrc/remote/client.c, through _core), the one
the readers use. The wire format is written out here by hand, on purpose:
an independent record of csrc/remote/protocol.h, for a raw socket that
sends the server what no client would, and for a fake server that answers
the client with malformed replies (each an error, never a crash).

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
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python
from helpers.pagewire import client_handshake, read_key, recv_exact, server_handshake

import uffdkvm
from uffdkvm import ConfigError
from uffdkvm.schema import fields as schema
from uffdkvm.pages.server import (
    PageClient,
    PageServer,
    PageServerError,
    PageServerGone,
    PageServerStats,
    PageServerTimeout,
    check_limits,
)

SNAPSHOT_BYTES = 8 << 20  # the snapshot fixture's (conftest.py)
_2M = 2 << 20


@pytest.fixture(scope="module")
def data(snapshot):
    """The snapshot's bytes (the snapshot fixture, conftest.py)."""
    data = Path(snapshot).read_bytes()
    assert len(data) == SNAPSHOT_BYTES
    return data


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


def test_requests_outside_the_file_are_refused(snapshot, data):
    with PageServer(snapshot) as server, server.connect() as client:
        with pytest.raises(PageServerError, match="Numerical result out of range") as e:
            client.fetch(SNAPSHOT_BYTES - 4095, 4096)
        assert e.value.errno == errno.ERANGE
        with pytest.raises(PageServerError) as e:
            client.fetch(2**63, 4096)
        assert e.value.errno == errno.ERANGE
        # The connection is still good: a refusal is a whole reply.
        assert client.fetch(4096, 4096) == data[4096:8192]
        # A length the protocol cannot carry: refused by the client, not sent.
        with pytest.raises(PageServerError) as e:
            client.fetch(0, 0)
        assert e.value.errno == errno.EINVAL
        for offset, length in ((-1, 4096), (0, -4096), (2**64, 1), (0, 1.5)):
            with pytest.raises(ValueError, match="expected an integer"):
                client.fetch(offset, length)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="expected an integer"):
                client.send(offset, length)  # type: ignore[arg-type]
        assert client.outstanding == 0
        client.send(0, 4096)
        with pytest.raises(PageServerError, match="pipelined replies still to take") as e:
            client.fetch(0, 4096)
        assert e.value.errno == errno.EBUSY
        reply = client.recv()
        assert (reply.offset, reply.urgent, reply.status, reply.data) == \
            (0, False, 0, data[:4096])
        assert server.stats().errors == 2


# protocol.h, by hand: request (offset u64, length u32, flags u32) and reply
# header (offset u64, length u32, status i32, flags u32, reserved u32).
REQUEST = struct.Struct("<QII")
REPLY = struct.Struct("<QIiII")
URGENT, STATS = 1 << 0, 1 << 1


def raw_exchange(server: PageServer, *batches: list[tuple[int, int, int]]) -> list[tuple]:
    """On a plain socket, after the handshake with the server's key, each
    batch of raw requests sent at once and its replies read before the
    next: every reply (its header's fields and its payload) in the order
    they came."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(server.address[len("unix:"):])
        assert client_handshake(sock, read_key(server.key_file)) == (0, True)
        out = []
        for requests in batches:
            sock.sendall(b"".join(REQUEST.pack(*r) for r in requests))
            for _ in requests:
                offset, length, status, flags, reserved = REPLY.unpack(
                    recv_exact(sock, REPLY.size))
                out.append((offset, length, status, flags, reserved, recv_exact(sock, length)))
        return out


def test_server_refuses_what_no_client_sends(snapshot, data):
    """The server's own checks, which the C client never lets a request
    reach: length 0, above the maximum, unknown flags. Each a whole reply
    (-EINVAL, no payload), the connection still served after them."""
    bad = [(0, 0, 0), (0, (1 << 30) + 1, 0), (0, 4096, 1 << 5)]
    with PageServer(snapshot) as server:
        replies = raw_exchange(server, bad, [(8192, 4096, URGENT)])
        stats = server.stats()
    for (offset, _, flags), (r_off, r_len, status, r_flags, reserved, payload) in \
            zip(bad, replies, strict=False):
        assert (r_off, r_len, status, r_flags, reserved, payload) == \
            (offset, 0, -errno.EINVAL, flags, 0, b"")
    assert replies[-1] == (8192, 4096, 0, URGENT, 0, data[8192:12288])
    assert stats.errors == 3 and stats.requests == 1


def test_a_stats_reply_is_the_cores_list_in_order(snapshot):
    """A STATS reply's payload, decoded by hand with _core.REMOTE_STATS_FIELDS
    (the one list, ukvm.h) as its order, says what was done; and
    PageServerStats has exactly those fields."""
    fields = uffdkvm._core.REMOTE_STATS_FIELDS
    assert tuple(f for f in PageServerStats.__dataclass_fields__) == fields
    assert set(uffdkvm._core.REMOTE_STATS_MEANINGS) == set(fields)
    with PageServer(snapshot) as server:
        replies = raw_exchange(server, [(0, 4096, URGENT), (4096, 8192, 0),
                                                (1 << 40, 4096, 0)], [(0, 0, STATS)])
    offset, length, status, flags, _, payload = replies[-1]
    assert (offset, length, status, flags) == (0, 8 * len(fields), 0, STATS)
    counters = dict(zip(fields, struct.unpack(f"<{len(fields)}Q", payload), strict=True))
    assert counters == {
        "requests": 2, "urgent": 1, "background": 1, "served": 2, "errors": 1,
        "bytes": 4096 + 8192, "queue_ns_total": counters["queue_ns_total"],
        "queue_ns_max": counters["queue_ns_max"], "connections": 1, "dropped": 0,
        "stats_requests": 1, "refused": 0}
    assert 0 <= counters["queue_ns_max"] <= counters["queue_ns_total"]


# ---- the client against a fake server's malformed replies ----

def fake_server(tmp_path: Path, answer: Callable[[int, int, int], bytes],
                hang_up: bool = False) -> tuple[str, threading.Thread]:
    """A one-connection server on a Unix socket: reads one request, sends
    answer(offset, length, flags), then (unless hang_up) waits for the
    client to close."""
    path = tmp_path / f"fake-{random.randrange(1 << 30)}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        with listener:
            listener.settimeout(10)
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            server_handshake(conn)
            offset, length, flags = REQUEST.unpack(recv_exact(conn, REQUEST.size))
            conn.sendall(answer(offset, length, flags))
            if not hang_up:
                try:
                    conn.recv(1)     # EOF when the client closes
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"unix:{path}", thread


def header(offset: int, length: int, status: int = 0, flags: int = 0, reserved: int = 0) -> bytes:
    return REPLY.pack(offset, length, status, flags, reserved)


# (name, what the client asks, the fake's answer to (offset, length, flags))
MALFORMED = [
    ("fetch: more payload than asked", "fetch",
     lambda o, n, f: header(o, n * 2, flags=f) + bytes(n * 2)),
    ("fetch: less payload than asked", "fetch",
     lambda o, n, f: header(o, n // 2, flags=f) + bytes(n // 2)),
    ("fetch: another offset", "fetch", lambda o, n, f: header(o + 4096, n, flags=f) + bytes(n)),
    ("fetch: another request's flags", "fetch", lambda o, n, f: header(o, n, flags=0) + bytes(n)),
    ("fetch: a positive status", "fetch", lambda o, n, f: header(o, 0, 5, f)),
    ("fetch: a status beyond errno", "fetch", lambda o, n, f: header(o, 0, -5000, f)),
    ("fetch: a refusal with a payload", "fetch",
     lambda o, n, f: header(o, n, -errno.ERANGE, f) + bytes(n)),
    ("fetch: a length above the maximum", "fetch", lambda o, n, f: header(o, (1 << 31), 0, f)),
    ("fetch: unknown flags", "fetch", lambda o, n, f: header(o, n, flags=f | 1 << 9) + bytes(n)),
    ("fetch: reserved not 0", "fetch", lambda o, n, f: header(o, n, flags=f, reserved=1)),
    ("stats: 11 counters", "stats", lambda o, n, f: header(0, 88, flags=STATS) + bytes(88)),
    ("stats: 13 counters", "stats", lambda o, n, f: header(0, 104, flags=STATS) + bytes(104)),
    ("stats: not a STATS reply", "stats", lambda o, n, f: header(0, 96, flags=0) + bytes(96)),
    ("stats: a refusal", "stats", lambda o, n, f: header(0, 0, -errno.EINVAL, STATS)),
    ("recv: longer than any request asked", "recv",
     lambda o, n, f: header(o, n + 1, flags=f) + bytes(n + 1)),
    ("recv: a STATS reply to a page request", "recv",
     lambda o, n, f: header(o, 88, flags=STATS) + bytes(88)),
]


@pytest.mark.parametrize("name,call,answer", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_reply_is_an_error_and_spends_the_connection(tmp_path, name, call, answer):
    address, thread = fake_server(tmp_path, answer)
    with PageClient(address, timeout_s=10) as client:
        with pytest.raises(PageServerError, match="does not answer the request") as e:
            if call == "fetch":
                client.fetch(8192, 4096, urgent=True)
            elif call == "stats":
                client.stats()
            else:
                client.send(8192, 4096)
                client.recv()
        assert e.value.errno == errno.EPROTO, e.value
        # Half a reply may follow: the connection is given up, not read on.
        with pytest.raises(PageServerError, match="given up") as e:
            client.fetch(0, 4096)
        assert e.value.errno == errno.ENOTCONN
    thread.join(10)
    assert not thread.is_alive()


def test_random_replies_are_errors_never_a_crash(tmp_path):
    """Seeded garbage for a reply: random bytes, and headers that answer the
    request's offset and flags but with random lengths, statuses and
    reserved words, to fetch, recv and stats. Each ends in a
    PageServerError (malformed, cut short, or no reply in time), or in the
    bytes a well-formed reply carried; the process never dies."""
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    for i in range(60):
        call = ("fetch", "recv", "stats")[i % 3]
        if i % 2:
            junk = rng.randbytes(rng.randrange(0, 64))
            answer = (lambda j: lambda o, n, f: j)(junk)
        else:
            length = rng.choice([0, 1, 4095, 4096, 4097, 88, 1 << 30, (1 << 32) - 1])
            status = rng.choice([0, 0, -errno.ERANGE, 1, -(1 << 31)])
            reserved = rng.choice([0, 0, 1])
            tail = rng.randbytes(rng.randrange(0, 5000))
            answer = (lambda ln, st, rs, t: lambda o, n, f:
                      header(o, ln, st, f, rs) + t)(length, status, reserved, tail)
        address, thread = fake_server(tmp_path, answer, hang_up=True)
        with PageClient(address, timeout_s=0.5) as client:
            try:
                if call == "fetch":
                    client.fetch(0, 4096)
                elif call == "stats":
                    client.stats()
                else:
                    client.send(0, 4096)
                    client.recv()
                outcome = "ok"
            except PageServerError as e:
                outcome = errno.errorcode.get(e.errno, str(e.errno))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        thread.join(10)
    assert set(outcomes) <= {"ok", "EPROTO", "ECONNRESET", "EPIPE", "ETIMEDOUT"}, outcomes
    assert outcomes.get("EPROTO", 0) >= 10, outcomes


@pytest.mark.parametrize("cut", [0, 10, REPLY.size, REPLY.size + 100])
def test_a_reply_cut_short_is_the_server_gone(tmp_path, cut):
    """The fake hangs up after `cut` bytes of a whole reply (header and 4096
    bytes of payload): the client says the server went away."""
    address, thread = fake_server(
        tmp_path, lambda o, n, f: (header(o, n, flags=f) + bytes(n))[:cut], hang_up=True)
    with PageClient(address, timeout_s=10) as client:
        with pytest.raises(PageServerGone, match="page server closed the connection"):
            client.fetch(0, 4096)
    thread.join(10)


def test_no_reply_within_the_timeout_is_a_timeout(tmp_path):
    address, thread = fake_server(tmp_path, lambda o, n, f: header(o, n, flags=f)[:7])
    with PageClient(address, timeout_s=0.3) as client:
        t0 = time.monotonic()
        with pytest.raises(PageServerTimeout, match="no reply before the deadline") as e:
            client.fetch(0, 4096)
        assert 0.3 <= time.monotonic() - t0 < 5
        assert isinstance(e.value, TimeoutError) and e.value.errno == errno.ETIMEDOUT
    thread.join(10)


def test_a_second_threads_call_is_refused_and_a_closed_client_refuses(snapshot):
    with PageServer(snapshot, latency_us=300_000) as server:
        client = server.connect()
        errors: list[BaseException] = []

        def slow() -> None:
            try:
                client.fetch(0, 4096)
            except BaseException as e:  # noqa: BLE001 - checked below
                errors.append(e)

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.1)
        # One thread at a time: a second call, or close(), while the first waits.
        with pytest.raises(RuntimeError, match="one thread at a time"):
            client.fetch(4096, 4096)
        with pytest.raises(RuntimeError, match="another thread"):
            client.close()
        t.join(10)
        assert not errors, errors
        client.close()
        assert client.closed
        client.close()                   # idempotent
        with pytest.raises(PageServerError, match="closed"):
            client.fetch(0, 4096)


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


def test_client_deadline(snapshot):
    with PageServer(snapshot, latency_us=5_000_000) as server, \
            server.connect(timeout_s=0.2) as client:
        t0 = time.monotonic()
        with pytest.raises(PageServerTimeout) as e:
            client.fetch(0, 4096)
        assert 0.2 <= time.monotonic() - t0 < 4.0
    assert e.value.errno == errno.ETIMEDOUT


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
from uffdkvm.pages.server import PageServer
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
import uffdkvm.pages.server as ps
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
def test_ctrl_c_while_starting_leaves_no_process(data, tmp_path, after_s):
    # Its own copy of the snapshot: the process list is searched for its path.
    snap = tmp_path / f"interrupted-{after_s}.img"
    snap.write_bytes(data[:65536])
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


LIMITS = (("latency_us", schema.LIMITS["MAX_REMOTE_LATENCY_US"], "--latency-us"),
          ("bandwidth_mbps", schema.LIMITS["MAX_REMOTE_BANDWIDTH_MBPS"], "--bandwidth-mbps"),
          ("max_inflight", schema.LIMITS["MAX_INFLIGHT"], "--max-inflight"))


@pytest.mark.parametrize("field,limit,flag", LIMITS, ids=[f for f, _, _ in LIMITS])
def test_the_core_checks_the_limits_once_for_both_entries(snapshot, tmp_path, field, limit,
                                                          flag):
    """ukvm_pageserver_check is the one check: at the limit is fine, one
    past it (or below 0) is refused naming the field, both by PageServer
    (in-process, before it spawns anything) and by the server command
    (the check ukvm_pageserver_serve makes itself)."""
    at_limit = {"latency_us": 0, "bandwidth_mbps": 0, "max_inflight": 0, field: limit}
    check_limits(**at_limit)
    for bad in (limit + 1, -1, 1 << 70):
        with pytest.raises(ConfigError) as info:
            PageServer(snapshot, **{field: bad})
        assert info.value.field == field, str(info.value)
        assert str(info.value).startswith(f"{field}: at most {limit}"), str(info.value)
    out = subprocess.run(python("--snapshot", snapshot, "--listen", f"unix:{tmp_path}/s",
                                flag, str(limit + 1), module="uffdkvm.pages.process"),
                         env=CHILD_ENV, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out
    assert f"uffdkvm.pages.process: {field}: at most {limit}" in out.stderr, out.stderr
    assert not (tmp_path / "s").exists()


def test_server_command_reports_a_missing_snapshot(tmp_path):
    out = subprocess.run(python("--snapshot", tmp_path / "none.img",
                                "--listen", f"unix:{tmp_path}/s", module="uffdkvm.pages.process"),
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
