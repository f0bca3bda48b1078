"""Ask a containerd its version over its socket (the ``containerd.services.version.v1`` API).

The node's containerd is not always a binary the installer can run: k3s and RKE2 run their
own containerd under ``/var/lib/rancher``. Its socket answers wherever the binary lives, so
node mode ``auto`` asks the socket first. One unary gRPC call, spoken as plain HTTP/2 frames
with the standard library (the toolkit image carries no grpcio): bounded in time and size, and
anything unexpected is "cannot tell" (None) or, for a path that is no socket, an error.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat

from enflame_gcu import fileio
from enflame_gcu.errors import EngineConfigError

METHOD = "/containerd.services.version.v1.Version/Version"
TIMEOUT_SECONDS = 5.0
MAX_ANSWER = 64 << 10
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload
    )


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    out = b"\x00"
    for text in (name.encode(), value.encode()):
        if len(text) >= 127:
            raise ValueError("header too long for a one-byte length")
        out += bytes((len(text),)) + text
    return out


def _request() -> bytes:
    headers = b"".join(
        _literal(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", METHOD),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    empty_message = b"\x00" + (0).to_bytes(4, "big")  # uncompressed, length 0
    return (
        _PREFACE
        + _frame(_SETTINGS, 0, 0)
        + _frame(_HEADERS, _END_HEADERS, 1, headers)
        + _frame(_DATA, _END_STREAM, 1, empty_message)
    )


def _receive(sock: socket.socket, count: int, budget: list[int]) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    budget[0] -= count
    if budget[0] < 0:
        raise ConnectionError("answer too long")
    return data


def _answer(sock: socket.socket) -> bytes:
    """The DATA of stream 1 once the stream ends; acknowledges SETTINGS and PING meanwhile."""
    body = b""
    budget = [MAX_ANSWER]
    while True:
        header = _receive(sock, 9, budget)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        payload = _receive(sock, length, budget)
        if kind == _SETTINGS and not flags & _ACK:
            sock.sendall(_frame(_SETTINGS, _ACK, 0))
        elif kind == _PING and not flags & _ACK:
            sock.sendall(_frame(_PING, _ACK, 0, payload))
        elif kind in (_GOAWAY, _RST_STREAM):
            raise ConnectionError("the server refused the call")
        elif stream == 1 and kind == _DATA:
            if flags & _PADDED and payload:
                payload = payload[1 : len(payload) - payload[0]]
            body += payload
        if stream == 1 and kind in (_DATA, _HEADERS) and flags & _END_STREAM:
            return body


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def version_field(message: bytes) -> str | None:
    """Field 1 (``version``) of a VersionResponse, from a gRPC length-prefixed message."""
    if len(message) < 5 or message[0] != 0:
        return None
    size = int.from_bytes(message[1:5], "big")
    body = message[5 : 5 + size]
    at = 0
    try:
        while at < len(body):
            key, at = _varint(body, at)
            field, wire = key >> 3, key & 7
            if wire == 0:
                _, at = _varint(body, at)
            elif wire == 2:
                length, at = _varint(body, at)
                if field == 1:
                    return body[at : at + length].decode("utf-8", "replace")
                at += length
            else:
                return None
    except ValueError:
        return None
    return None


def local_socket(host_root: str, path: str) -> str | None:
    """``path`` under the host root (links followed inside it); None when nothing is there.

    Raises PathOutsideRootError for a path leading out of the root, EngineConfigError when
    something other than a socket is there.
    """
    local = fileio.resolve(host_root, path)
    try:
        info = os.stat(local)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EngineConfigError(f"cannot use {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISSOCK(info.st_mode):
        raise EngineConfigError(f"{path} is not a socket (containerd socket given); refused")
    return local


def version(host_root: str, path: str) -> str | None:
    """The version string the containerd at socket ``path`` reports; None when it does not
    answer (not running, not containerd). Errors as :func:`local_socket`."""
    local = local_socket(host_root, path)
    if local is None:
        return None
    # Through /proc/self/fd: no 108-byte limit on the path, and the inode checked is the one used.
    fd = os.open(local, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_SECONDS)
            sock.connect(f"/proc/self/fd/{fd}")
            sock.sendall(_request())
            answer = _answer(sock)
    except (OSError, ConnectionError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return version_field(answer)


def major_minor(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``1.6.20~ds1``, ``v2.0.4-k3s2``."""
    match = re.search(r"(?:^|\s)v?(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None
