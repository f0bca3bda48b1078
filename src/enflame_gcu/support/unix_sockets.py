"""Unix sockets the kubelet dials: is anybody listening, which file is it, and private bind names.

Both plugins bind their gRPC sockets under a private name (``.<socket>.<8 hex digits>``) and
rename it into place: gRPC deletes the path it bound, by name, when the server stops, whoever's
file is there by then. A private name nobody listens on was left by an instance killed between
the bind and the rename.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket

log = logging.getLogger(__name__)

BIND_TOKEN_BYTES = 4  # .<socket>.<8 hex digits>: the private name gRPC binds before the rename
_HEX = frozenset("0123456789abcdef")


def inode(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of a file, None when absent: survives a rename of the same file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def identity(path: str) -> tuple[int, int, int] | None:
    """``(device, inode, ctime)`` of a file, None when absent: a re-created file may get the
    inode number of the one just deleted (ext4 reuses it at once); the change time differs."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


def listening(path: str) -> bool:
    """True when a server accepts connections on the unix socket at ``path`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
    except BlockingIOError:
        return True  # a full backlog: somebody listens
    except OSError:
        return False  # ECONNREFUSED (stale file), ENOENT, not a socket ...
    finally:
        probe.close()
    return True


def private_bind_name(path: str) -> str:
    """A fresh private name beside ``path`` to bind before renaming it into place."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{secrets.token_hex(BIND_TOKEN_BYTES)}")


def remove_stale_binds(path: str) -> None:
    """Remove the private bind names of ``path`` nobody listens on (an instance killed while
    starting); names of another shape are never touched."""
    directory, prefix = os.path.dirname(path), f".{os.path.basename(path)}."
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        token = name[len(prefix) :]
        if not name.startswith(prefix) or len(token) != 2 * BIND_TOKEN_BYTES:
            continue
        if not _HEX.issuperset(token):
            continue
        stale = os.path.join(directory, name)
        if not listening(stale):
            log.info("removing %s left by an instance that was killed while starting", stale)
            with contextlib.suppress(OSError):
                os.unlink(stale)
