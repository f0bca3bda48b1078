"""Every daemon's ``--log-format``: plain text, or JSON lines with UTC timestamps for collectors.

With ``json`` every line the process writes to stderr follows the format, including what the
gRPC C-core (``chttp2_transport.cc:... Got goaway``) and the interpreter itself (warnings, a
traceback) write straight to file descriptor 2: fd 2 becomes a pipe, a thread reads it and logs
each line through the ``logging`` module, and the handler writes to the original stderr.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import re
import threading
from typing import IO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The C-core's (absl's, formerly gpr's) prefix: severity letter, date, time, thread id,
# file:line]. "I1125 18:02:33.123456  4711 chttp2_transport.cc:1234] Got goaway ..."
_NATIVE = re.compile(r"^([DIWEF])\d{4} [\d:.]+\s+\d+ ([^\s\]]+:\d+)\]\s?(.*)$")
_NATIVE_LEVELS = {
    "D": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
# Lines on fd 2 that are not the C-core's (the interpreter's own writes to stderr).
STDERR_LOGGER = "stderr"
NATIVE_LOGGER = "grpc.core"
_OURS = "_enflame_gcu_handler"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, RFC 3339, ms), ``level``, ``logger``, ``msg``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        moment = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        entry = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(log_format: str) -> None:
    """Send the root logger's records to stderr in ``log_format`` (``text`` or ``json``).

    For ``json``, what is written to fd 2 outside ``logging`` is captured and logged too.
    """
    stream: IO[str] | None = None
    if log_format == "json":
        stream = _capture_fd2()
    handler = logging.StreamHandler(stream)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        # Ours from an earlier call, or logging's default; a test's capture handler stays.
        if getattr(old, _OURS, False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    setattr(handler, _OURS, True)
    root.addHandler(handler)


def record_for_line(line: str) -> tuple[str, int, str]:
    """``(logger, level, message)`` for one line found on fd 2."""
    match = _NATIVE.match(line)
    if match is None:
        return STDERR_LOGGER, logging.WARNING, line
    letter, where, message = match.groups()
    return NATIVE_LOGGER, _NATIVE_LEVELS[letter], f"{message} ({where})"


class _Fd2Capture:
    """fd 2 redirected into a pipe whose lines a daemon thread logs; undone at exit."""

    def __init__(self) -> None:
        self.original = os.dup(2)
        self.stream = open(self.original, "w", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.reader = threading.Thread(
            target=self._pump, args=(read_end,), name="fd2-capture", daemon=True
        )
        self.reader.start()
        atexit.register(self.close)

    def _pump(self, read_end: int) -> None:
        with open(read_end, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.strip():
                    continue
                name, level, message = record_for_line(line)
                logging.getLogger(name).log(level, "%s", message)

    def close(self) -> None:
        """Give fd 2 back and log what is still in the pipe (the last lines before exit)."""
        try:
            os.dup2(self.original, 2)  # closes the pipe's last write end: the reader sees EOF
        except OSError:
            return
        self.reader.join(timeout=2.0)


_capture: _Fd2Capture | None = None


def _capture_fd2() -> IO[str]:
    """Capture fd 2 once per process; the stream that reaches the real stderr."""
    global _capture  # noqa: PLW0603 - one fd 2 per process
    if _capture is None:
        _capture = _Fd2Capture()
    return _capture.stream
