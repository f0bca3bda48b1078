"""One serving instance per socket: an exclusive lock on ``<socket>.lock`` beside it.

Two instances of a plugin on one node using the same socket names (a DaemonSet rolling update with
surge, a Helm release next to a static manifest, a manual run) would otherwise each delete the
other's socket and re-register forever. The device plugin locks each resource's socket; the DRA
driver without a pod UID locks its service socket for the pair (docs/dra.md). The rule: whoever
holds the lock serves the socket; any other instance stands by, says once why, and takes over as
soon as the holder stops (the kernel drops the lock when its process ends, even on SIGKILL). The
lock file holds a line naming its holder (pid, host name = pod name, start time) for that message.

The file is removed by its holder on a clean stop; an older kubelet that wipes the plugin dir
(or a cleanup script) may delete it while held, so holding means holding the lock on the file
now at the path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time

LOCK_SUFFIX = ".lock"
_HOLDER_BYTES = 512


def _identity(fd_or_path: int | str) -> tuple[int, int] | None:
    try:
        info = (
            os.stat(fd_or_path, follow_symlinks=False)
            if isinstance(fd_or_path, str)
            else os.fstat(fd_or_path)
        )
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _printable(text: str) -> str:
    # What another process wrote: control characters escaped, one safe line for a log.
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


class SocketLock:
    """The lock for one socket path; :meth:`try_acquire` never blocks."""

    def __init__(self, socket_path: str) -> None:
        self.path = socket_path + LOCK_SUFFIX
        self._fd: int | None = None

    @property
    def acquired(self) -> bool:
        """True while we hold the lock (it may have been deleted since: see :meth:`held`)."""
        return self._fd is not None

    def held(self) -> bool:
        """True when we hold the lock on the file that is at the path now."""
        return self._fd is not None and _identity(self.path) == _identity(self._fd)

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; OSError when the plugin dir is unusable."""
        if self.held():
            return True
        self.release(unlink=False)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        if _identity(self.path) != _identity(fd):
            os.close(fd)  # deleted or replaced between open and flock: not the live lock
            return False
        since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"pid {os.getpid()} on {socket.gethostname()} since {since}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (best effort, one printable line)."""
        try:
            # Non-blocking and checked: a FIFO planted at the lock's path must not hang us.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return "unknown"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "unknown"
            raw = os.read(fd, _HOLDER_BYTES)
        except OSError:
            return "unknown"
        finally:
            os.close(fd)
        text = raw.decode("utf-8", "replace").strip()
        return _printable(text.splitlines()[0]) if text else "unknown"

    def release(self, *, unlink: bool = True) -> None:
        """Drop the lock; remove the file first when it is still ours."""
        if self._fd is None:
            return
        if unlink and self.held():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None
