"""The page server: a separate process serving a snapshot file's bytes over a socket.

For ``source="remote"``: the readers fetch each faulted page from a server
that uffdkvm starts and stops, as QEMU's post-copy destination asks the
migration source. The server is C (csrc/remote/server.c) run inside
``python -m uffdkvm.pages.process``; it models a remote source on its side:
a latency per request, one link of a given bandwidth, a cap on the
requests in flight, and faults (URGENT requests) served ahead of queued
background ones. The wire protocol is defined in one place,
csrc/remote/protocol.h, and spoken here only through the C client
(csrc/remote/client.c, reached through ``_core.remote_*``): this module has
no struct layout of its own, and the counters' names come from the C core's
one list (``_core.REMOTE_STATS_FIELDS``).

    >>> with PageServer("snap.img", latency_us=30) as server:
    ...     with server.connect() as client:
    ...         page = client.fetch(0, 4096, urgent=True)
    ...     server.stats().requests
    1

The server never outlives the process that started it: :meth:`PageServer.stop`
(or leaving the ``with`` block, or the interpreter exiting, or the object
being collected) sends SIGTERM and, after a bounded wait, SIGKILL; and the
server exits by itself when its stdin (a pipe from its parent) closes, which
happens when the parent dies however it dies.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno as errnos
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from .. import _core
from .._spawn import child_env, python_command
from ..config import REMOTE_TRANSPORTS as TRANSPORTS
from ..errors import ConfigError, HostUnsupportedError, RunError

START_TIMEOUT_S = 30.0   # Python's start and the import of uffdkvm, on a loaded host
KEY_BYTES = 32           # a fresh key's random bytes (written as 64 hex digits)
STOP_TIMEOUT_S = 5.0     # after SIGTERM, before SIGKILL
REPLY_TIMEOUT_S = 30.0


class PageServerError(RunError):
    """The page server could not start, refused a request, or answered
    something that is not a reply."""


class PageServerGone(PageServerError, ConnectionError):  # type: ignore[misc]
    """The page server closed the connection (it stopped, or died)."""


class PageServerTimeout(PageServerError, TimeoutError):  # type: ignore[misc]
    """No reply within the client's ``timeout_s`` (the connection is then spent)."""


@dataclass(frozen=True)
class PageServerStats:
    """The server's counters since it started (:meth:`PageServer.stats`), named
    and explained as the C core's one list does (csrc/ukvm.h,
    UKVM_REMOTE_STATS_FIELDS, read here as ``_core.REMOTE_STATS_FIELDS`` and
    ``_core.REMOTE_STATS_MEANINGS``: the list below comes from it).

    Queue time is what a request waited beyond its modelled latency: for an
    inflight slot (``max_inflight``), then for the link (``bandwidth_mbps``).
    """

    requests: int
    urgent: int
    background: int
    served: int
    errors: int
    bytes: int
    queue_ns_total: int
    queue_ns_max: int
    connections: int           # stats() holds one of them
    dropped: int
    stats_requests: int
    refused: int               # connections that did not prove they may connect

    @property
    def queue_seconds_total(self) -> float:
        return self.queue_ns_total / 1e9

    @property
    def queue_seconds_max(self) -> float:
        return self.queue_ns_max / 1e9

    @classmethod
    def from_counters(cls, c: dict[str, int]) -> PageServerStats:
        """From the core's {name: value} (a STATS reply, or the server's final counters)."""
        return cls(**{name: c[name] for name in _core.REMOTE_STATS_FIELDS})


# The fields above are typed for mypy; the names are the core's. A core
# whose list differs is refused here, at import, not somewhere in a result.
if tuple(f.name for f in dataclasses.fields(PageServerStats)) != _core.REMOTE_STATS_FIELDS:
    raise ImportError("uffdkvm.pages.server: PageServerStats does not match the C core's "
                      f"counters {_core.REMOTE_STATS_FIELDS} (csrc/ukvm.h, "
                      "UKVM_REMOTE_STATS_FIELDS): rebuild, or update the dataclass")
# What each counter means, from the same list.
PageServerStats.__doc__ = (PageServerStats.__doc__ or "") + "\n    Counters::\n\n" + "".join(
    f"        {name:<15} {_core.REMOTE_STATS_MEANINGS[name]}\n"
    for name in _core.REMOTE_STATS_FIELDS)


class Reply(NamedTuple):
    """One reply taken by :meth:`PageClient.recv`."""

    offset: int
    urgent: bool    # the request's URGENT flag
    status: int     # 0, or -errno: the server refused the request
    data: bytes


def write_key(path: str | os.PathLike[str]) -> str:
    """A fresh key at ``path``: 32 random bytes (``secrets``) as 64 hex digits
    and a newline, in a new file of mode 0600 (never over an existing one:
    FileExistsError). Returns the path. The same format ``openssl rand -hex
    32`` prints; a page server and its clients read it the same way
    (csrc/remote/auth.c: ukvm_remote_key_load)."""
    path = os.fspath(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)   # whatever the umask
        os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode())
    finally:
        os.close(fd)
    return path


def serve(snapshot_path: str, listen: str, *, key_file: str | None = None,
          latency_us: int = 0, bandwidth_mbps: int = 0, max_inflight: int = 0,
          ready_fd: int = -1, stop_fd: int = -1, handshake_timeout_s: float = 0.0
          ) -> PageServerStats:
    """Serve ``snapshot_path`` on ``listen`` in this process until SIGTERM or
    SIGINT (or ``stop_fd`` polls readable), writing "ready ADDRESS" to
    ``ready_fd`` once listening: the body of ``uffdkvm serve`` and of the
    process :class:`PageServer` starts. Every TCP server needs ``key_file``;
    a Unix socket's without one lets in only this user and root
    (SO_PEERCRED). Raises ConfigError naming the field (``key_file``,
    ``listen``, a limit) or HostUnsupportedError (no libcrypto); returns the
    final counters."""
    check_limits(latency_us, bandwidth_mbps, max_inflight)
    try:
        counters = _core.pageserver_serve(snapshot_path, listen, latency_us * 1000,
                                          bandwidth_mbps, max_inflight, ready_fd, stop_fd,
                                          key_file, handshake_timeout_s)
    except _core.CoreError as e:
        kind, errnum, message = e.args
        if kind == _core.ERR_CONFIG:
            field = message.partition(":")[0]
            raise ConfigError(message, errnum,
                              field=field if field.isidentifier() else "listen") from None
        if kind == _core.ERR_HOST:
            raise HostUnsupportedError(message, errnum) from None
        raise PageServerError(message, errnum) from None
    return PageServerStats.from_counters(counters)


def check_limits(latency_us: int, bandwidth_mbps: int, max_inflight: int) -> None:
    """The core's one check of a page server's limits (ukvm_pageserver_check,
    which the server process makes again): a ConfigError naming the field
    for a value outside them."""
    for field, value in (("latency_us", latency_us), ("bandwidth_mbps", bandwidth_mbps),
                         ("max_inflight", max_inflight)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{field}={value!r}: expected an integer", field=field)
    try:
        _core.pageserver_check(latency_us * 1000, bandwidth_mbps, max_inflight)
    except _core.CoreError as e:
        message = e.args[2]
        raise ConfigError(message, field=message.partition(":")[0]) from None


def _client_error(e: _core.CoreError) -> PageServerError:
    """The C client's CoreError(kind, errno, message) as this module's error."""
    _, errnum, message = e.args
    if errnum in (errnos.ECONNRESET, errnos.EPIPE):
        return PageServerGone(message, errnum)
    if errnum == errnos.ETIMEDOUT:
        return PageServerTimeout(message, errnum)
    return PageServerError(message, errnum)


class PageClient:
    """A Python client of a page server: one connection, one thread at a time.

    ``key_file`` is the server's key (see :func:`write_key`), which a TCP
    server requires and every server uffdkvm starts has: both sides prove
    they hold it when the connection opens (HMAC-SHA256 over nonces from
    both, no key on the wire), and a server that refuses it, or cannot
    prove it holds it, raises :class:`PageServerError` (EACCES,
    EKEYREJECTED) naming the address.

    It speaks the protocol through the C client (csrc/remote/client.c), the
    one the readers use, so every reply is checked as theirs are: one that
    does not answer its request, or that no request could have (a bad
    status, length or flags), raises :class:`PageServerError` (EPROTO) and
    spends the connection. :meth:`fetch` asks for one range and waits for
    it; :meth:`send` and :meth:`recv` pipeline (replies come in the order
    the server served them: an URGENT request can overtake background ones,
    so match by offset). A server that goes away raises
    :class:`PageServerGone`; a reply not there within ``timeout_s`` raises
    :class:`PageServerTimeout` (a TimeoutError; the connection is then
    spent, as a half-read reply may follow).
    """

    def __init__(self, address: str, timeout_s: float = REPLY_TIMEOUT_S,
                 key_file: str | os.PathLike[str] | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._conn: object | None = None
        try:
            self._conn = _core.remote_connect(
                address, None if key_file is None else os.fspath(key_file))
        except _core.CoreError as e:
            kind, _, message = e.args
            if kind == _core.ERR_CONFIG:   # the key file's: its mode, owner, format
                raise ConfigError(message, field="key_file") from None
            raise _client_error(e) from None

    def __enter__(self) -> PageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            _core.remote_close(self._conn)
            self._conn = None

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def outstanding(self) -> int:
        """Requests sent whose replies :meth:`recv` has not taken yet."""
        return 0 if self._conn is None else _core.remote_outstanding(self._conn)

    @staticmethod
    def _check_range(offset: int, length: int) -> None:
        # The core takes them as u64 and would wrap a negative one around.
        for name, value in (("offset", offset), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 0 <= value < 2**64:
                raise ConfigError(f"page server client: {name}={value!r}: expected an "
                                  "integer 0 <= n < 2**64", field=name)

    def _open(self) -> object:
        if self._conn is None:
            raise PageServerError(f"page server client ({self.address}): closed", errnos.EBADF)
        return self._conn

    def send(self, offset: int, length: int, urgent: bool = False) -> None:
        """Send one request (no wait for its reply)."""
        self.send_many([(offset, length)], urgent)

    def send_many(self, ranges: list[tuple[int, int]], urgent: bool = False) -> None:
        """Send a request for each (offset, length), in one write."""
        for offset, length in ranges:
            self._check_range(offset, length)
        try:
            _core.remote_send(self._open(), ranges, urgent, self.timeout_s)
        except _core.CoreError as e:
            raise _client_error(e) from None

    def recv(self) -> Reply:
        """The next reply, whole."""
        try:
            offset, urgent, status, data = _core.remote_recv(self._open(), self.timeout_s)
        except _core.CoreError as e:
            raise _client_error(e) from None
        return Reply(offset, urgent, status, data)

    def fetch(self, offset: int, length: int, urgent: bool = False) -> bytes:
        """``length`` bytes of the snapshot at ``offset``; the server's refusal
        (past the end: ERANGE) raises PageServerError with its errno."""
        self._check_range(offset, length)
        try:
            return _core.remote_fetch(self._open(), offset, length, urgent, self.timeout_s)
        except _core.CoreError as e:
            raise _client_error(e) from None

    def stats(self) -> PageServerStats:
        """The server's counters now."""
        try:
            counters = _core.remote_stats(self._open(), self.timeout_s)
        except _core.CoreError as e:
            raise _client_error(e) from None
        return PageServerStats.from_counters(counters)


# ---- the process ----

@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A Ctrl-C inside the block takes effect at its end, so that a process
    is never left started but unrecorded, or half stopped. Only the main
    thread receives Python's signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    except ValueError:   # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old if old is not None else signal.default_int_handler)
        if caught and callable(old):
            old(signal.SIGINT, None)
        elif caught and old is not signal.SIG_IGN:
            raise KeyboardInterrupt


class _Process:
    """What a PageServer owns, apart from the PageServer itself, so that its
    finalizer can stop it after the PageServer is gone."""

    def __init__(self) -> None:
        self.owner = os.getpid()   # a forked child's copy must not stop its parent's server
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.tmpdir: str | None = None
        self.stats_client: PageClient | None = None

    def stderr_text(self) -> str:
        if self.stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.seek(0)
            return self.stderr.read().decode(errors="replace").strip()
        return ""

    def stop(self) -> int | None:
        """SIGTERM, a bounded wait, then SIGKILL; closes and removes what
        it made. Returns the exit status (None if it never started)."""
        with _sigint_deferred():
            status = None
            if self.stats_client is not None:
                self.stats_client.close()
                self.stats_client = None
            proc = self.proc
            if proc is not None and os.getpid() != self.owner:
                proc = None     # not ours to stop: fork() copied it from the parent
                self.proc = None
                self.tmpdir = None
            if proc is not None:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
                        # A stopped (SIGSTOPped, hung) server takes its
                        # SIGTERM only once it runs again.
                        proc.send_signal(signal.SIGCONT)
                    try:
                        proc.wait(STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)  # its own group: start_new_session
                        # Not reaped even then (stuck in the kernel): clean up
                        # the rest anyway; the exit status stays unknown.
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(STOP_TIMEOUT_S)
                status = proc.returncode
                for f in (proc.stdin, proc.stdout):
                    if f is not None:
                        with contextlib.suppress(OSError):
                            f.close()
                self.proc = None
            if self.stderr is not None:
                self.stderr.close()
                self.stderr = None
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
                self.tmpdir = None
            return status


def _read_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[str | None, bool]:
    """The address from the server's "ready ADDRESS" line (None if it says
    something else, closes stdout first, or timeout_s passes), and whether
    its stdout closed."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None, False
            chunk = os.read(fd, 4096)
            if not chunk:
                return None, True
            data += chunk
    line = data.split(b"\n", 1)[0].decode(errors="replace")
    return (line[len("ready "):] if line.startswith("ready ") else None), False


class PageServer:
    """A page server process serving ``snapshot_path``; started at once.

    ``transport`` is ``"unix"`` (a socket in a private temporary directory)
    or ``"tcp"`` (127.0.0.1, a free port). Either way the server gets a fresh
    random key (:func:`write_key`) in a file of mode 0600 in its own 0700
    directory, ``key_file``, which every client must prove it holds
    (:meth:`connect` does); a Unix socket's peer must also be this user or
    root. (A build without libcrypto, ``_core.HAVE_LIBCRYPTO`` False, has
    no keys: ``key_file`` is "", a Unix socket keeps its two other walls,
    and transport="tcp" raises HostUnsupportedError.) The model, on the
    server's side:
    each request is ready ``latency_us`` after it takes an inflight slot;
    at most ``max_inflight`` are served at once (0: no cap), the rest
    queue, faults (URGENT) ahead of background requests; replies share one
    link of ``bandwidth_mbps`` megabits per second (0: unlimited).

    ``address`` is what clients connect to (``"unix:/path"`` or
    ``"tcp:127.0.0.1:PORT"``), ``pid`` the server's process id.
    ``handshake_timeout_s``: how long a new connection has to prove it holds
    the key (0: the server's default, 5 s).
    """

    def __init__(self, snapshot_path: str | os.PathLike[str], transport: str = "unix",
                 latency_us: int = 0, bandwidth_mbps: int = 0, max_inflight: int = 0,
                 start_timeout_s: float = START_TIMEOUT_S,
                 handshake_timeout_s: float = 0.0) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport={transport!r}: expected one of {TRANSPORTS}",
                              field="transport")
        check_limits(latency_us, bandwidth_mbps, max_inflight)
        path = Path(snapshot_path)
        if not path.is_file():
            raise ConfigError(f"snapshot_path={str(snapshot_path)!r}: no such file; give the "
                              "snapshot to serve (uffdkvm.make_snapshot writes one)",
                              field="snapshot_path")
        self.snapshot_path = str(path.resolve())
        self.transport = transport
        self.latency_us = latency_us
        self.bandwidth_mbps = bandwidth_mbps
        self.max_inflight = max_inflight
        self.handshake_timeout_s = handshake_timeout_s
        self.address = ""
        self.key_file = ""
        self.pid = 0
        self._process = _Process()
        self._finalizer = weakref.finalize(self, self._process.stop)
        try:
            self._start(start_timeout_s)
        except BaseException:
            self._finalizer()
            raise

    def _start(self, timeout_s: float) -> None:
        p = self._process
        if not _core.HAVE_LIBCRYPTO and self.transport == "tcp":
            raise HostUnsupportedError(
                "page server: transport='tcp' needs a key, and this build of uffdkvm has no "
                "libcrypto (OpenSSL) to check one: use transport='unix', or install "
                "libssl-dev (apt-get install libssl-dev) and build uffdkvm again",
                errnos.EOPNOTSUPP)
        # 0700 (mkdtemp): the socket and the key are this user's alone.
        p.tmpdir = tempfile.mkdtemp(prefix="uffdkvm-pageserver-")
        # Without libcrypto a Unix socket still has its directory and SO_PEERCRED.
        if _core.HAVE_LIBCRYPTO:
            self.key_file = write_key(os.path.join(p.tmpdir, "key"))
        listen = self._listen_address(p.tmpdir if self.transport == "unix" else None)
        args = ["--snapshot", self.snapshot_path, "--listen", listen,
                *(["--key-file", self.key_file] if self.key_file else []),
                "--latency-us", str(self.latency_us),
                "--bandwidth-mbps", str(self.bandwidth_mbps),
                "--max-inflight", str(self.max_inflight),
                "--handshake-timeout-s", repr(float(self.handshake_timeout_s)),
                "--remove-dir", p.tmpdir]
        # The child imports this uffdkvm, wherever it was imported from, and
        # never a uffdkvm/ in our working directory (_spawn says why).
        cmd = python_command(module="uffdkvm.pages.process", args=args)
        env = child_env()
        p.stderr = tempfile.TemporaryFile()
        with _sigint_deferred():
            # stdin: a pipe that only closes, so that the server dies with us.
            p.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=p.stderr, env=env, start_new_session=True)
        self.pid = p.proc.pid
        address, closed = _read_ready(p.proc, timeout_s)
        if address is None:
            if closed:   # it is on its way out: its exit status says why
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(STOP_TIMEOUT_S)
            status = p.proc.poll()
            why = (f"did not say it was ready within {timeout_s:g} s" if status is None
                   else f"exited with status {status}")
            stderr = p.stderr_text()
            p.stop()
            raise PageServerError(f"page server for {self.snapshot_path} ({listen}) {why}: "
                                  f"{stderr or 'no output on stderr'}")
        assert p.proc.stdout is not None
        p.proc.stdout.close()
        self.address = address

    def _listen_address(self, tmpdir: str | None) -> str:
        """Where the server listens: a socket in our own directory, or any
        free loopback port."""
        if tmpdir is not None:
            return f"unix:{os.path.join(tmpdir, 'sock')}"
        return "tcp:127.0.0.1:0"

    def __enter__(self) -> PageServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else f"pid {self.pid}"
        return f"<PageServer {self.address} {state}>"

    @property
    def stopped(self) -> bool:
        return not self._finalizer.alive

    def returncode(self) -> int | None:
        """The server process's exit status once it has exited (a signal's
        number negated), else None."""
        proc = self._process.proc
        return None if proc is None else proc.poll()

    def wait(self, timeout_s: float) -> int | None:
        """The exit status once the server has exited, waiting timeout_s at
        most (None if it is still running then, or was never started). A
        killed server's sockets close before its parent can reap it: a
        client that saw them close may wait here for the status."""
        proc = self._process.proc
        if proc is None:
            return None
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def connect(self, timeout_s: float = REPLY_TIMEOUT_S) -> PageClient:
        """A new Python client connection to this server, with its key."""
        return PageClient(self.address, timeout_s, key_file=self.key_file or None)

    def stats(self) -> PageServerStats:
        """The server's counters now (over a connection it keeps for this)."""
        if self.stopped:
            raise PageServerError(f"page server {self.address}: stopped; its stats are gone")
        p = self._process
        if p.stats_client is None:
            p.stats_client = self.connect()
        try:
            return p.stats_client.stats()
        except PageServerError:
            p.stats_client.close()
            p.stats_client = None
            raise

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a bounded wait) and
        remove its socket and directory. Idempotent."""
        self._finalizer()
