"""The runtime's own log file: a few appended lines, without importing :mod:`logging`.

``logging`` costs about 12 ms to import, a large share of the wrapper's budget on every
create; the runtime only ever appends a handful of lines, so this small writer does it.
If the file cannot be written: one warning on stderr, and the container still starts.
"""

from __future__ import annotations

import os
import time

from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import invocation as runtime_invocation

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


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
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the configured path
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
