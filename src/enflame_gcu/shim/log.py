"""The runtime's own log file: a few appended lines, without importing :mod:`logging`.

``logging`` costs about 12 ms to import, a large share of the wrapper's budget on every
create; the runtime only ever appends a handful of lines, so this small writer does it.
If the file cannot be written: one warning on stderr, and the container still starts.

The runtime runs as root and writes text a pod chooses, so the file is only ever one that
nobody else could have put there (:func:`open_log`): every directory from ``/`` down is
opened by fd without following a link that is not our own and is owned by us; the file's own
directory is writable by us alone, one above it by nobody but us and its group (a sticky one
such as ``/tmp`` aside); the file is opened with ``O_NOFOLLOW`` and kept only when it is a
regular file of ours with one link. Anything else: no file, one warning.
"""

from __future__ import annotations

import os
import stat
import time

from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import invocation as runtime_invocation

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_MAX_LINKS = 8  # symlinks of ours followed on the way down (/var/run -> /run and the like)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(Exception):
    """A log path nobody but us should be able to redirect, and somebody could."""


def _unsafe_dir(info: os.stat_result, shown: str, *, last: bool) -> str | None:
    """Why a directory on the way could let somebody else redirect the log; None if none."""
    if info.st_uid != os.geteuid():
        return f"{shown} is owned by uid {info.st_uid}, not by uid {os.geteuid()}"
    mode = info.st_mode
    # The file's own directory: writable by us alone. Above it, a group-writable directory
    # (Ubuntu's root:syslog /var/log) or a sticky one (/tmp) can only have names swapped, and
    # every directory below is opened by fd and must be ours; others-writable is refused.
    if last and mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{shown} is writable by its group or others (mode {mode & 0o7777:o})"
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return f"{shown} is writable by others (mode {mode & 0o7777:o})"
    return None


def open_directory(path: str, *, create: bool = False) -> int:
    """An fd of directory ``path`` reached safely (see the module docstring); UnsafePath.

    With ``create``, missing directories are made (mode 0755, whatever the umask).
    """
    parts = [p for p in os.path.abspath(path).split("/") if p]
    links = 0
    fd = os.open("/", _DIR_FLAGS)
    done: list[str] = []
    try:
        reason = _unsafe_dir(os.fstat(fd), "/", last=not parts)
        while reason is None and parts:
            name = parts.pop(0)
            shown = "/" + "/".join([*done, name])
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.fchmod(child, 0o755)  # ours, just made: the umask does not decide
            except OSError:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(info.st_mode):
                    raise
                if info.st_uid != os.geteuid():
                    reason = f"{shown} is a link owned by uid {info.st_uid}"
                    break
                links += 1
                if links > _MAX_LINKS:
                    reason = f"{shown}: more than {_MAX_LINKS} links on the way"
                    break
                target = os.readlink(name, dir_fd=fd)
                base = "" if target.startswith("/") else "/" + "/".join(done)
                parts = [p for p in os.path.normpath(f"{base}/{target}").split("/") if p] + parts
                os.close(fd)
                fd = os.open("/", _DIR_FLAGS)
                done = []
                continue
            os.close(fd)
            fd = child
            done.append(name)
            reason = _unsafe_dir(os.fstat(fd), shown, last=not parts)
    except BaseException:
        os.close(fd)
        raise
    if reason is not None:
        os.close(fd)
        raise UnsafePath(reason)
    return fd


def open_log(path: str) -> int:
    """An fd to append to the log ``path``, opened safely; UnsafePath or OSError otherwise."""
    directory, name = os.path.split(os.path.abspath(path))
    if not name:
        raise UnsafePath(f"{path} names a directory")
    dir_fd = open_directory(directory, create=True)
    try:
        # O_NONBLOCK: a FIFO at the name fails (ENXIO) instead of hanging the runtime.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(name, flags | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    reason = None
    if not stat.S_ISREG(info.st_mode):
        reason = "it is not a regular file"
    elif info.st_uid != os.geteuid():
        reason = f"it is owned by uid {info.st_uid}, not by uid {os.geteuid()}"
    elif info.st_nlink != 1:
        reason = f"it has {info.st_nlink} hard links (another name for the same file)"
    if reason is not None:
        os.close(fd)
        raise UnsafePath(reason)
    return fd


class RuntimeLog:
    """Appends ``<time> pid=<pid> <LEVEL> <message>`` lines at or above a level; never stdout.

    Every line is escaped (:func:`invocation.escape`): a request's newline cannot forge a line.
    """

    __slots__ = ("_fd", "_level", "path")

    def __init__(self, path: str, level: str = "info") -> None:
        self.path = path
        self._level = LEVELS[level]
        self._fd: int | None = None
        if not path:
            return  # an empty log-file setting turns the file off
        try:
            self._fd = open_log(path)
        except (OSError, ValueError, UnsafePath) as exc:  # ValueError: a NUL in the path
            reason = getattr(exc, "strerror", None) or exc
            runtime_invocation.warn(
                f"cannot write log file {path}: {reason}; continuing without a log file"
            )

    def _write(self, level: str, message: str, args: tuple[object, ...]) -> None:
        if self._fd is None or LEVELS[level] < self._level:
            return
        text = runtime_invocation.escape(message % args if args else message)
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        line = f"{stamp},{int(now % 1 * 1000):03d} pid={os.getpid()} {level.upper()} {text}\n"
        # One write per line, so concurrent runtimes never interleave; a full disk must not
        # stop a container; contextlib.suppress would cost an import on this path.
        try:  # noqa: SIM105
            os.write(self._fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

    def debug(self, message: str, *args: object) -> None:
        """Log at debug level (``%`` arguments, formatted only when written)."""
        self._write("debug", message, args)

    def info(self, message: str, *args: object) -> None:
        """Log at info level."""
        self._write("info", message, args)

    def warning(self, message: str, *args: object) -> None:
        """Log at warning level."""
        self._write("warning", message, args)

    def error(self, message: str, *args: object) -> None:
        """Log at error level."""
        self._write("error", message, args)

    def close(self) -> None:
        """Close the file (exec would close it anyway: it is opened close-on-exec)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def setup(config: runtime_config.RuntimeConfig) -> RuntimeLog:
    """The log for this call, per the config's ``log-file`` and ``log-level``."""
    return RuntimeLog(config.log_file, config.log_level)
