"""Who may read from a page server: the key's holder, and on a Unix socket
only the server's own user (and root). Real processes and sockets: a
client dropped to ``nobody`` that speaks the wire by hand, clients with no
key, a wrong one, a truncated or silent handshake; many silent connections
and a server out of fds; key files with loose modes; ``uffdkvm serve`` in
one network namespace and a run in another; the libcrypto the build loads.
docs/robustness.md ("Page servers: keys, peers and the threat model") says
what each of these guards."""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers.children import ENV as CHILD_ENV
from helpers.children import python, uffdkvm_command
from helpers.hostfacts import (NOT_ROOT, NO_ASAN_RUNTIME, NO_CC, NO_NETNS, c_compiler, host_skip,
                               missing_tool)
from helpers.pagewire import (AUTH, HELLO, KEYED, LABEL_CLIENT, LABEL_SERVER, MAGIC, VERSION,
                              WELCOME, client_handshake, mac, read_key, recv_exact)
from helpers.skips import needs_keys, needs_loopback

import uffdkvm
from uffdkvm import ConfigError
from uffdkvm.pages.server import PageClient, PageServer, PageServerError, write_key

SNAPSHOT_BYTES = 1 << 20
NOBODY = 65534

# The script `nobody` runs, under the system's own Python and the standard
# library only (it imports nothing of uffdkvm): it drops to uid/gid 65534,
# then tries every way in that needs no key, and prints what it got.
NOBODY_SCRIPT = r"""
import json, os, socket, struct, sys
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
address = sys.argv[1]
got, notes = b"", []

def connect():
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(15)
        s.connect(address[5:])
    else:
        host, port = address[4:].rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=15)
    return s

def drain(s):
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        notes.append(f"recv: {e}")
    return data

# 1. A request record at once, as if there were no handshake.
# 2. A handshake answered with a zero mac (no key), then the request.
# 3. The hello's nonce sent back as the client's, with the server's own
#    hello bytes as the "mac".
for attempt in range(3):
    try:
        s = connect()
    except OSError as e:
        notes.append(f"connect {attempt}: {e}")
        continue
    request = struct.pack("<QII", 0, 4096, 1)
    with s:
        try:
            if attempt == 0:
                s.sendall(request * 5)
            else:
                hello = b""
                while len(hello) < 40:
                    chunk = s.recv(40 - len(hello))
                    if not chunk:
                        break
                    hello += chunk
                got += hello
                nonce = hello[8:40] if len(hello) == 40 else bytes(32)
                mac = bytes(32) if attempt == 1 else hello[8:40]
                s.sendall(struct.pack("<IHH32s32s", 0x53504B55, 1, 0, nonce, mac) + request)
        except OSError as e:
            notes.append(f"send {attempt}: {e}")
        got += drain(s)
print(json.dumps({"uid": os.getuid(), "got": got.hex(), "notes": notes}))
"""


@pytest.fixture(scope="module")
def private_snapshot(tmp_path_factory):
    """A 0600 snapshot of root's (or of whoever runs the tests) that nobody cannot open:
    not the suite's snapshot fixture (conftest.py), which anyone may read."""
    path = tmp_path_factory.mktemp("auth") / "snapshot.img"
    path.write_bytes(os.urandom(SNAPSHOT_BYTES))
    path.chmod(0o600)
    return path


def as_nobody(address: str) -> dict:
    """NOBODY_SCRIPT against address, as uid 65534, under /usr/bin/python3."""
    if NOT_ROOT.holds:
        host_skip(NOT_ROOT, "drops to uid 65534, which takes root")
    interpreter = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    p = subprocess.run([interpreter, "-I", "-c", NOBODY_SCRIPT, address], capture_output=True,
                       text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["uid"] == NOBODY
    out["got"] = bytes.fromhex(out["got"])
    return out


def assert_no_snapshot_bytes(got: bytes, data: bytes) -> None:
    """Nothing of the file: no 16-byte run of it anywhere in what came back,
    and no more than the handshake's records could hold."""
    assert len(got) <= 3 * (HELLO.size + WELCOME.size), len(got)
    for off in range(0, len(data) - 16, 16):
        assert data[off:off + 16] not in got, f"the snapshot's bytes at {off} were read"


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_nobody_reads_nothing_from_the_server_run_starts(private_snapshot, transport):
    """The server PageServer (and so run()) starts, as root: nobody cannot
    read one byte over TCP (no key) or the Unix socket (its 0700 directory;
    and with the directory opened up, SO_PEERCRED); every try is refused
    and counted."""
    data = private_snapshot.read_bytes()
    with PageServer(private_snapshot, transport=transport) as server:
        if transport == "unix":
            out = as_nobody(server.address)
            assert all("Permission denied" in n for n in out["notes"]), out["notes"]
            assert out["got"] == b""
            # The second wall: the directory and socket opened to everyone.
            sock = server.address[len("unix:"):]
            os.chmod(os.path.dirname(sock), 0o755)
            os.chmod(sock, 0o777)
        before = server.stats().refused
        out = as_nobody(server.address)
        assert_no_snapshot_bytes(out["got"], data)
        stats = server.stats()
        assert stats.refused - before == 3, (stats, out)
        assert stats.requests == 0 and stats.bytes == 0, stats
        log = server._process.stderr_text()
    assert ("uid 65534" if transport == "unix" else "refused tcp:127.0.0.1:") in log, log


@pytest.fixture
def open_dir():
    """A directory everyone may enter (tmp_path's parents are root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="uffdkvm-open-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_nobody_on_a_keyless_unix_socket_is_refused_by_uid(private_snapshot, open_dir):
    """`uffdkvm serve` on a Unix socket without a key, its socket open to
    all: SO_PEERCRED alone keeps nobody out (refused before the hello)."""
    sock = open_dir / "sock"
    with serving(private_snapshot, f"unix:{sock}") as (proc, address):
        os.chmod(sock, 0o777)
        out = as_nobody(address)
        with PageClient(address) as client:   # root, without a key: let in
            assert client.fetch(0, 4096) == private_snapshot.read_bytes()[:4096]
            assert client.stats().refused == 3
    assert out["got"] == b"", out
    assert "uid 65534" in proc.stderr_text


class _Served:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.stderr_text = ""


@contextlib.contextmanager
def serving(snapshot, listen, *extra, netns=None):
    """`uffdkvm serve SNAPSHOT --listen LISTEN EXTRA...` (in netns, if given),
    until the block ends; yields (the process, its address)."""
    cmd = uffdkvm_command("serve", snapshot, "--listen", listen, *extra)
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=CHILD_ENV)
    served = _Served(proc)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready "):
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"uffdkvm serve said {line!r}: {err}")
        yield served, line.split()[1]
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            _, served.stderr_text = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, served.stderr_text = proc.communicate(timeout=30)


def test_a_wrong_key_no_key_and_a_truncated_handshake_are_refused(private_snapshot, tmp_path):
    """TCP: the key's holder is served; a wrong key, no key, a handshake cut
    short are refused (the client says which, naming the address), counted
    and logged with the peer."""
    needs_loopback()
    needs_keys()
    wrong = write_key(tmp_path / "wrong.key")
    with PageServer(private_snapshot, transport="tcp") as server:
        with server.connect() as client:
            assert client.fetch(4096, 4096) == private_snapshot.read_bytes()[4096:8192]
        with pytest.raises(PageServerError, match="refused the key") as e:
            PageClient(server.address, key_file=wrong)
        assert e.value.errno == errno.EACCES and server.address in str(e.value)
        with pytest.raises(PageServerError, match="requires a key") as e:
            PageClient(server.address)
        assert server.address in str(e.value)
        host, port = server.address[4:].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.recv(HELLO.size)
            s.sendall(b"\x55\x4b\x50\x53" + bytes(20))   # 24 of the auth's 72 bytes
        time.sleep(0.2)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            # The handshake in Python (tests/helpers/pagewire.py), with the right key: passes.
            assert client_handshake(s, read_key(server.key_file)) == (0, True)
        stats = server.stats()
        log = server._process.stderr_text()
    assert stats.refused == 3, stats
    assert log.count("refused tcp:127.0.0.1:") == 3, log
    assert "wrong key" in log and "closed without a handshake" in log and \
        "in the middle of its handshake" in log, log


def _one_byte_off(mac):
    """A MAC right in every byte but the last: a comparison of fewer bytes
    than all 32 (a first-byte check, a prefix) takes it."""
    return mac[:-1] + bytes([mac[-1] ^ 1])


def test_the_server_checks_every_byte_of_the_clients_proof(private_snapshot):
    needs_loopback()
    needs_keys()
    with PageServer(private_snapshot, transport="tcp") as server:
        key = read_key(server.key_file)
        host, port = server.address[4:].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            _, _, _, server_nonce = HELLO.unpack(recv_exact(s, HELLO.size))
            nonce = os.urandom(32)
            proof = _one_byte_off(mac(key, LABEL_CLIENT, server_nonce, nonce))
            s.sendall(AUTH.pack(MAGIC, VERSION, 0, nonce, proof))
            _, status, _ = WELCOME.unpack(recv_exact(s, WELCOME.size))
        assert status == -errno.EACCES
        with socket.create_connection((host, int(port)), timeout=10) as s:
            assert client_handshake(s, key) == (0, True)    # the whole proof passes
        assert server.stats().refused == 1


def test_the_client_checks_every_byte_of_the_servers_proof(tmp_path):
    """A server that answers the handshake with a proof one byte off (as a
    server without the key would have to guess it) is refused by the client,
    which never asks it for a page."""
    needs_loopback()
    needs_keys()
    key_file = tmp_path / "page.key"
    write_key(key_file)
    key = read_key(key_file)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    asked = []

    def serve():
        conn, _ = listener.accept()
        with conn:
            server_nonce = os.urandom(32)
            conn.sendall(HELLO.pack(MAGIC, VERSION, KEYED, server_nonce))
            _, _, _, nonce, _ = AUTH.unpack(recv_exact(conn, AUTH.size))
            proof = _one_byte_off(mac(key, LABEL_SERVER, nonce, server_nonce))
            conn.sendall(WELCOME.pack(MAGIC, 0, proof))
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                asked.append(conn.recv(64))
    fake = threading.Thread(target=serve, daemon=True)
    fake.start()
    try:
        with pytest.raises(PageServerError, match="did not prove it holds the key"):
            PageClient(f"tcp:127.0.0.1:{port}", key_file=key_file)
    finally:
        fake.join(10)
        listener.close()
    assert asked in ([], [b""]), asked    # closed, never a request


def test_a_silent_client_is_closed_at_its_deadline_and_stalls_nobody(private_snapshot):
    needs_loopback()
    needs_keys()
    with PageServer(private_snapshot, transport="tcp", handshake_timeout_s=1.0) as server:
        host, port = server.address[4:].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as silent:
            t0 = time.monotonic()
            with server.connect() as client:   # served while the silent one waits
                for off in range(0, 64 * 4096, 4096):
                    client.fetch(off, 4096)
            assert time.monotonic() - t0 < 0.9
            hello = silent.recv(HELLO.size)
            assert len(hello) == HELLO.size
            assert silent.recv(1) == b""       # closed by the server: EOF
            waited = time.monotonic() - t0
        assert 0.9 <= waited < 4, waited
        assert server.stats().refused == 1
        assert "no handshake before its deadline" in server._process.stderr_text()


def test_key_files_with_loose_modes_are_refused(private_snapshot, tmp_path):
    """0644 (others may read it): refused by the client, by a run and by the
    server, each saying chmod 600."""
    needs_loopback()
    needs_keys()
    loose = tmp_path / "loose.key"
    write_key(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600
    loose.chmod(0o644)
    with PageServer(private_snapshot, transport="tcp") as server:
        with pytest.raises(ConfigError, match="chmod 600") as e:
            PageClient(server.address, key_file=loose)
        assert e.value.field == "key_file"
        with pytest.raises(ConfigError, match="mode 0644.*chmod 600") as e:
            uffdkvm.run(vcpus=1, mem_per_vcpu="1M", source="remote",
                        source_address=server.address, source_key_file=loose)
        assert e.value.field == "source_key_file"
    p = subprocess.run(uffdkvm_command("serve", private_snapshot, "--listen", "tcp:127.0.0.1:0",
                                       "--key-file", loose), capture_output=True, text=True,
                       env=CHILD_ENV, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "chmod 600" in p.stderr, p


@pytest.mark.parametrize("listen,why", [("tcp:127.0.0.1:0", "a TCP server needs a key"),
                                        ("tcp:0.0.0.0:0", "listens beyond loopback")])
def test_tcp_without_a_key_file_is_refused(private_snapshot, listen, why):
    needs_keys()
    p = subprocess.run(uffdkvm_command("serve", private_snapshot, "--listen", listen),
                       capture_output=True, text=True, env=CHILD_ENV, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p
    assert why in p.stderr and "key" in p.stderr and p.stdout == "", p


def test_serve_new_key_writes_a_0600_key_and_never_overwrites(private_snapshot, tmp_path):
    needs_loopback()
    needs_keys()
    key = tmp_path / "k"
    with serving(private_snapshot, "tcp:127.0.0.1:0", "--key-file", key,
                 "--new-key") as (_, address):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert len(read_key(key)) == 32
        with PageClient(address, key_file=key) as client:
            assert client.fetch(0, 4096) == private_snapshot.read_bytes()[:4096]
    p = subprocess.run(uffdkvm_command("serve", private_snapshot, "--listen", "tcp:127.0.0.1:0",
                                       "--key-file", key, "--new-key"),
                       capture_output=True, text=True, env=CHILD_ENV, timeout=60)
    assert p.returncode == 2 and "exists" in p.stderr, p


def test_a_run_pages_from_a_server_already_running(kvm, private_snapshot, tmp_path):
    """source_address on this host: verified against a local copy; without
    one, the Result says the bytes were not checked."""
    needs_loopback()
    needs_keys()
    key = tmp_path / "k"
    with serving(private_snapshot, "tcp:127.0.0.1:0", "--key-file", key,
                 "--new-key") as (_, address):
        r = uffdkvm.run(vcpus=1, mem_per_vcpu="1M", source="remote", source_address=address,
                        source_key_file=key, source_path=private_snapshot)
        assert r.verified and r.contents_verified, r.verify_message
        assert r.source_bytes == SNAPSHOT_BYTES
        blind = uffdkvm.run(vcpus=1, mem_per_vcpu="1M", source="remote",
                            source_address=address, source_key_file=key)
    assert blind.verified and not blind.contents_verified


# ---- two network namespaces ----

NS_SERVER, NS_RUN = f"uffdkvm-srv-{os.getpid()}", f"uffdkvm-run-{os.getpid()}"
ADDR_SERVER, ADDR_RUN = "10.250.19.1", "10.250.19.2"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns_pair():
    """Two network namespaces joined by a veth pair, 10.250.19.1/30 (the
    server's) and .2 (the run's); deleted however the test ends."""
    if NO_NETNS.holds:
        host_skip(NO_NETNS, f"two network namespaces: {NO_NETNS.evidence}")
    try:
        ip("netns", "add", NS_SERVER)
        ip("netns", "add", NS_RUN)
        ip("-n", NS_SERVER, "link", "add", "ukvm0", "type", "veth", "peer", "name", "ukvm1",
           "netns", NS_RUN)
        ip("-n", NS_SERVER, "addr", "add", f"{ADDR_SERVER}/30", "dev", "ukvm0")
        ip("-n", NS_RUN, "addr", "add", f"{ADDR_RUN}/30", "dev", "ukvm1")
        for ns, dev in ((NS_SERVER, "ukvm0"), (NS_RUN, "ukvm1")):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for ns in (NS_SERVER, NS_RUN):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)


RUN_IN_NS = r"""
import json, sys, uffdkvm
address, key, local = sys.argv[1], sys.argv[2] or None, sys.argv[3] or None
try:
    r = uffdkvm.run(vcpus=2, mem_per_vcpu="512K", source="remote", source_address=address,
                    source_key_file=key, source_path=local)
    print(json.dumps({"verified": r.verified, "contents": r.contents_verified,
                      "bytes": r.source_bytes, "faults": r.faults}))
except uffdkvm.UffdkvmError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def run_in(ns: str, *args: object) -> dict:
    p = subprocess.run(["ip", "netns", "exec", ns,
                        *python(*[str(a) for a in args], code=RUN_IN_NS)],
                       capture_output=True, text=True, env=CHILD_ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_serve_and_source_address_across_two_network_namespaces(kvm, netns_pair, private_snapshot,
                                                                tmp_path):
    """`uffdkvm serve` in one namespace on its veth address with a key file;
    a run in the other pages every page over the veth and verifies it
    against a local copy; without the key, or with a wrong one, it is
    refused with an error naming the address."""
    needs_keys()
    key = tmp_path / "k"
    wrong = write_key(tmp_path / "wrong")
    local = tmp_path / "local-copy.img"
    shutil.copyfile(private_snapshot, local)
    listen = f"tcp:{ADDR_SERVER}:4719"
    with serving(private_snapshot, listen, "--key-file", key, "--new-key",
                 netns=NS_SERVER) as (served, address):
        assert address == listen
        ok = run_in(NS_RUN, address, key, local)
        assert ok == {"verified": True, "contents": True, "bytes": 2 * 512 * 1024,
                      "faults": ok["faults"]}, ok
        no_key = run_in(NS_RUN, address, "", local)
        wrong_key = run_in(NS_RUN, address, wrong, local)
        # The server is not reachable from this namespace's loopback.
        unreachable = run_in(NS_RUN, "tcp:127.0.0.1:4719", key, local)
    assert no_key["error"] == "RunError" and address in no_key["message"] and \
        "requires a key" in no_key["message"], no_key
    assert wrong_key["error"] == "RunError" and address in wrong_key["message"] and \
        "refused the key" in wrong_key["message"], wrong_key
    assert unreachable["error"] == "RunError", unreachable
    assert served.stderr_text.count(f"refused tcp:{ADDR_RUN}:") == 2, served.stderr_text
    assert "2 refused" in served.stderr_text, served.stderr_text


def test_a_build_without_libcrypto_refuses_tcp_and_keys(tmp_path):
    """tests/c/auth.c and remote.c built with UFFDKVM_NO_LIBCRYPTO=1: a TCP
    server or a key file is refused naming libcrypto, never served keyless;
    keyless Unix sockets still work."""
    facts = (NO_CC, missing_tool("make"), NO_ASAN_RUNTIME)
    if any(f.holds for f in facts):
        host_skip(facts, "builds tests/c's auth program")
    c_tests = Path(__file__).resolve().parents[1] / "c"
    build = tmp_path / "no-libcrypto"
    env = {**os.environ, "UFFDKVM_NO_LIBCRYPTO": "1"}
    # At -O0 (CFLAGS come last): what is checked is which paths refuse, and
    # the core's -O1 under ASan doubled this build's time.
    p = subprocess.run(["make", "-s", "-C", str(c_tests), f"BUILD={build}", "-j2",
                        "CFLAGS=-O0", f"{build}/asan/auth", f"{build}/asan/remote"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    for program in ("auth", "remote"):
        r = subprocess.run([str(build / "asan" / program)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        if program == "auth":
            assert "built without libcrypto" in r.stdout
            assert "without libcrypto a key file is refused" in r.stdout


def test_config_says_which_remote_fields_go_together(tmp_path):
    """A server already running takes no model from the Config; a key file
    is that server's; a remote run needs a snapshot or an address; an
    address is a page server's."""
    with pytest.raises(ConfigError, match="shapes the page server run.. starts") as e:
        uffdkvm.Config(source="remote", source_address="tcp:10.0.0.1:4000",
                       remote_latency_us=100)
    assert e.value.field == "remote_latency_us"
    with pytest.raises(ConfigError, match="the server run.. starts gets a fresh key") as e:
        uffdkvm.Config(source="remote", source_path=tmp_path / "s", source_key_file="k")
    assert e.value.field == "source_key_file"
    with pytest.raises(ConfigError, match="needs the snapshot") as e:
        uffdkvm.Config(source="remote")
    assert e.value.field == "source_path"
    with pytest.raises(ConfigError, match="a page server's address") as e:
        uffdkvm.Config(source="remote", source_address="10.0.0.1:4000")
    assert e.value.field == "source_address"
    with pytest.raises(ConfigError, match="source_address") as e:
        uffdkvm.Config(source="file", source_path=tmp_path / "s",
                       source_address="tcp:10.0.0.1:4000")
    assert e.value.field == "source_address"
    c = uffdkvm.Config(source="remote", source_address="tcp:10.0.0.1:4000",
                       source_key_file=tmp_path / "k")
    assert c.source_path is None and c.source_key_file == str(tmp_path / "k")


def test_the_cli_pages_from_a_server_already_running(kvm, private_snapshot, tmp_path):
    """`uffdkvm --source remote --source-address ... --source-key-file ...`:
    with --source-path verified; without, it says the bytes went unchecked
    (and still exits 0: what it checked held)."""
    needs_loopback()
    needs_keys()
    key = tmp_path / "k"
    with serving(private_snapshot, "tcp:127.0.0.1:0", "--key-file", key,
                 "--new-key") as (_, address):
        common = ["-v", "1", "-b", "1M", "-q", "--source", "remote", "--source-address",
                  address, "--source-key-file", key]
        checked = subprocess.run(uffdkvm_command(*common, "--source-path", private_snapshot),
                                 capture_output=True, text=True, env=CHILD_ENV, timeout=300)
        blind = subprocess.run(uffdkvm_command(*common), capture_output=True, text=True,
                               env=CHILD_ENV, timeout=300)
    assert checked.returncode == 0, checked.stderr
    assert "Memory verified:" in checked.stdout and address in checked.stdout, checked.stdout
    assert blind.returncode == 0, blind.stderr
    assert "Memory counted, NOT verified" in blind.stdout and "Memory verified" not in \
        blind.stdout, blind.stdout



# A page server under RLIMIT_NOFILE argv[3] (its stdin the stop fd); prints
# its final counters as JSON when stopped.
SCARCE_SERVER = """
import dataclasses, json, resource, sys
nofile = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
from uffdkvm.pages.server import serve
stats = serve(sys.argv[1], "tcp:127.0.0.1:0", key_file=sys.argv[2], ready_fd=1, stop_fd=0,
              handshake_timeout_s=5.0)
print(json.dumps(dataclasses.asdict(stats)), flush=True)
"""


class _Scarce:
    """SCARCE_SERVER running: its process, address, port; stop() -> its
    final counters and its stderr."""

    def __init__(self, snapshot, key, nofile, log):
        self.proc = subprocess.Popen(python(snapshot, key, nofile, code=SCARCE_SERVER),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True, env=CHILD_ENV)
        self.log = log
        line = self.proc.stdout.readline()
        assert line.startswith("ready "), line
        self.address = line.split()[1]
        self.port = int(self.address.rsplit(":", 1)[1])

    def cpu_seconds(self) -> float:
        """Its user + system time, the kernel's own count (/proc/PID/stat)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> tuple[dict, str]:
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(timeout=30)
        return json.loads(out), self.log.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def scarce_server(snapshot, tmp_path, nofile):
    needs_loopback()
    needs_keys()
    key = write_key(tmp_path / "key")
    server = _Scarce(snapshot, key, nofile, tmp_path / "server.log")
    server.key = key
    try:
        yield server
    finally:
        server.kill()


def test_silent_connections_out_of_fds_do_not_stall_a_keyed_client(private_snapshot, tmp_path):
    """100 silent connections (no key) against a server with 64 fds, and
    more arriving all the while (one every 5 ms): out of fds, the oldest
    handshake is closed for the newer (counted in refused), so the keyed
    client, whose handshake takes far less time than new connections take
    to push it out, is served within a second (not at the silent ones' 5 s
    deadline), and the server's CPU time stays under half the wall time."""
    silent: list[socket.socket] = []
    stop = threading.Event()

    def attacker(port: int) -> None:
        held: list[tuple[float, socket.socket]] = []
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append((time.monotonic(),
                             socket.create_connection(("127.0.0.1", port), timeout=1)))
            while held and time.monotonic() - held[0][0] > 1:
                held.pop(0)[1].close()
            time.sleep(0.005)
        for _, s in held:
            s.close()

    with scarce_server(private_snapshot, tmp_path, 64) as server:
        try:
            for _ in range(100):
                silent.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            thread = threading.Thread(target=attacker, args=(server.port,), daemon=True)
            thread.start()
            time.sleep(0.5)
            cpu0, wall0 = server.cpu_seconds(), time.monotonic()
            waits = []
            for _ in range(3):
                t0 = time.monotonic()
                with PageClient(server.address, key_file=server.key) as client:
                    assert client.fetch(0, 4096) == private_snapshot.read_bytes()[:4096]
                waits.append(time.monotonic() - t0)
                time.sleep(0.5)
            cpu, wall = server.cpu_seconds() - cpu0, time.monotonic() - wall0
        finally:
            stop.set()
            for s in silent:
                s.close()
        thread.join(timeout=30)
        stats, log = server.stop()
    assert max(waits) < 1.0, waits
    assert cpu < 0.5 * wall, (cpu, wall)
    assert stats["refused"] >= 100 - 64, stats
    assert "closed for a newer connection: out of fds" in log


def test_at_most_64_connections_wait_in_their_handshake(private_snapshot, tmp_path):
    """Fds to spare: of 100 silent connections the 36 oldest are closed at
    once (EOF after the hello, long before the 5 s deadline), counted in
    refused and logged."""
    with scarce_server(private_snapshot, tmp_path, 1024) as server:
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
                  for _ in range(100)]
        try:
            t0 = time.monotonic()
            for s in silent[:36]:
                assert len(s.recv(HELLO.size, socket.MSG_WAITALL)) == HELLO.size
                assert s.recv(1) == b""            # closed by the server
            assert time.monotonic() - t0 < 2
            for s in silent[36:]:                  # still waiting for their auth
                assert len(s.recv(HELLO.size, socket.MSG_WAITALL)) == HELLO.size
                s.setblocking(False)
                with pytest.raises(BlockingIOError):
                    s.recv(1)
            stats, log = server.stop()
        finally:
            for s in silent:
                s.close()
    assert stats["refused"] == 36, stats           # those left when it stopped are not
    assert log.count("closed for a newer connection: too many handshakes") == 36, log


def test_out_of_fds_with_no_handshake_to_close_the_server_does_not_spin(private_snapshot, tmp_path):
    """Every fd held by keyed clients: a new connection waits in the backlog
    while the server's CPU time stays under half the wall time (the
    listening socket is not polled), and is accepted (gets its hello) once
    a client closes."""
    with scarce_server(private_snapshot, tmp_path, 40) as server:
        clients = []
        try:
            for _ in range(64):
                # A connection the server accepts gets its hello at once: then a client.
                with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as probe:
                    try:
                        probe.recv(HELLO.size, socket.MSG_WAITALL)
                    except TimeoutError:
                        break
                clients.append(PageClient(server.address, key_file=server.key))
            assert 16 < len(clients) < 40, len(clients)
            waiting = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            time.sleep(0.2)
            cpu0, wall0 = server.cpu_seconds(), time.monotonic()
            time.sleep(1.5)
            cpu, wall = server.cpu_seconds() - cpu0, time.monotonic() - wall0
            waiting.settimeout(0.1)
            with pytest.raises(TimeoutError):
                waiting.recv(1)                      # not accepted: no fd
            clients.pop().close()
            waiting.settimeout(2)
            assert len(waiting.recv(HELLO.size, socket.MSG_WAITALL)) == HELLO.size
            assert clients[0].fetch(0, 4096) == private_snapshot.read_bytes()[:4096]
            waiting.close()
        finally:
            for c in clients:
                c.close()
    assert cpu < 0.5 * wall, (cpu, wall)


@pytest.mark.parametrize("version, soname", [
    ("#define OPENSSL_VERSION_NUMBER 0x1010117fL", "libcrypto.so.1.1"),   # 1.1.1w: no MAJOR
    ("#define OPENSSL_VERSION_MAJOR 3\n#define OPENSSL_VERSION_NUMBER 0x30000000L",
     "libcrypto.so.3"),
])
def test_the_libcrypto_soname_follows_the_headers_built_against(tmp_path, version, soname):
    """auth.c preprocessed against stand-ins for OpenSSL 1.1's and 3's
    <openssl/opensslv.h>: the library it dlopens is the one those headers
    belong to (1.1's have no OPENSSL_VERSION_MAJOR to name it by)."""
    if NO_CC.holds:
        host_skip(NO_CC, "preprocesses csrc/remote/auth.c")
    cc = c_compiler()
    csrc = Path(__file__).resolve().parents[2] / "csrc"
    (tmp_path / "openssl").mkdir()
    (tmp_path / "openssl" / "opensslv.h").write_text(version + "\n")
    (tmp_path / "openssl" / "evp.h").write_text("typedef struct evp_md_st EVP_MD;\n")
    p = subprocess.run([*cc, "-E", "-P", "-DUKVM_HAVE_LIBCRYPTO", f"-I{tmp_path}", f"-I{csrc}",
                        str(csrc / "remote" / "auth.c")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    opens = [line for line in p.stdout.splitlines() if "dlopen(" in line]
    assert len(opens) == 1, opens
    # The preprocessor leaves adjacent literals apart: join them as the compiler would.
    literals = "".join(re.findall(r'"([^"]*)"', opens[0]))
    assert literals == soname, opens[0]


def test_no_former_key_is_a_live_field():
    """serial.FORMER_KEYS names keys that are not fields (any more): a name
    that is a field again (Config.source_address, the page server's
    address) must leave the list, or the list says what is not so."""
    from uffdkvm.pages import server as pageserver
    from uffdkvm.io import serial
    classes = {"Result": uffdkvm.Result, "Config": uffdkvm.Config,
               "PageServerStats": pageserver.PageServerStats}
    assert set(serial.FORMER_KEYS) <= set(classes), serial.FORMER_KEYS
    for name, keys in serial.FORMER_KEYS.items():
        live = keys & {f.name for f in dataclasses.fields(classes[name])}
        assert not live, f"{name}: {sorted(live)} listed as former keys, but are fields"
