"""The page server's handshake (csrc/remote/protocol.h) written again in
Python from the header's comment, for tests that speak the wire by hand:
raw requests to a real server, a fake server the C client talks to. An
independent reading of the format: if the C side drifts from its own
header, these tests go red."""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

MAGIC, VERSION, KEYED = 0x53504B55, 1, 1 << 0
LABEL_CLIENT = b"uffdkvm page server v1: client"
LABEL_SERVER = b"uffdkvm page server v1: server"
HELLO = struct.Struct("<IHH32s")        # magic, version, flags, nonce
AUTH = struct.Struct("<IHH32s32s")      # magic, version, flags, nonce, mac
WELCOME = struct.Struct("<Ii32s")       # magic, status, mac


def read_key(path: str | os.PathLike[str]) -> bytes:
    with open(path) as f:
        return bytes.fromhex(f.read().strip())


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def mac(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, hashlib.sha256).digest()


def client_handshake(sock: socket.socket, key: bytes | None) -> tuple[int, bool]:
    """The client's side: (the welcome's status, whether the server proved the key)."""
    magic, version, flags, server_nonce = HELLO.unpack(recv_exact(sock, HELLO.size))
    assert (magic, version) == (MAGIC, VERSION), (hex(magic), version)
    nonce = os.urandom(32)
    ours = mac(key, LABEL_CLIENT, server_nonce, nonce) if key else bytes(32)
    sock.sendall(AUTH.pack(MAGIC, VERSION, 0, nonce, ours))
    magic, status, theirs = WELCOME.unpack(recv_exact(sock, WELCOME.size))
    assert magic == MAGIC
    proved = bool(key) and hmac.compare_digest(
        theirs, mac(key, LABEL_SERVER, nonce, server_nonce))
    return status, proved


def server_handshake(conn: socket.socket) -> None:
    """A keyless server's side (a Unix socket's): hello, the client's auth, welcome."""
    conn.sendall(HELLO.pack(MAGIC, VERSION, 0, os.urandom(32)))
    recv_exact(conn, AUTH.size)
    conn.sendall(WELCOME.pack(MAGIC, 0, bytes(32)))
