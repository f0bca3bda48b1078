"""Inotify on directories that may come and go, on the asyncio loop (asyncinotify).

The device plugin watches its kubelet plugin dir with it, the DRA driver its registration
dir, and :class:`enflame_gcu.health.HealthMonitor` the device, PCI and driver trees.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import logging
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any


def _no_libc_lookup(name: str) -> str | None:
    return None if name == "c" else _find_library(name)


# At import, asyncinotify looks libc up with ``ctypes.util.find_library("c")``, which on Linux
# forks ``/sbin/ldconfig -p`` (a child the size of this process, on every plugin start, before
# it can register). When that finds nothing, asyncinotify takes the inotify calls from the
# symbols already loaded in this process (``ctypes.CDLL(None)``), where libc's are: its import
# takes that branch at once. Only the name ``c`` is answered so, and only while asyncinotify
# is imported (tests/device_plugin/test_startup_imports.py checks no process is started).
_find_library = ctypes.util.find_library
ctypes.util.find_library = _no_libc_lookup
try:
    from asyncinotify import Inotify, Mask
finally:
    ctypes.util.find_library = _find_library

log = logging.getLogger(__name__)

_DIR_EVENTS = (
    Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.ATTRIB | Mask.CLOSE_WRITE
)
_SELF_EVENTS = Mask.DELETE_SELF | Mask.MOVE_SELF


class ChangeWatcher:
    """Inotify on directories that may come and go; :meth:`wait` returns on any change."""

    def __init__(self, directories: Sequence[str]) -> None:
        self._directories = tuple(directories)
        self._inotify: Any = None
        self._watches: dict[str, Any] = {}

    def __enter__(self) -> ChangeWatcher:
        self._inotify = Inotify()
        # sync_get() must not block: it only drains what has already arrived.
        self._inotify.sync_timeout = 0
        self.refresh()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inotify.close()
        self._watches.clear()

    def refresh(self) -> bool:
        """Watch every listed directory that exists now (ones that vanished were dropped).

        True when a watch was added: what happened in that directory before it was watched
        raised no event, so a caller that acts only on events must look at it once now.
        """
        added = False
        for directory in self._directories:
            if directory in self._watches or not os.path.isdir(directory):
                continue
            try:
                self._watches[directory] = self._inotify.add_watch(
                    directory, _DIR_EVENTS | _SELF_EVENTS | Mask.ONLYDIR
                )
            except OSError as exc:  # raced with removal; the next refresh tries again
                log.debug("cannot watch %s: %s", directory, exc)
                continue
            added = True
        return added

    def _note(self, event: Any, seen: list[tuple[str, str]]) -> None:
        watch = event.watch
        directory = str(watch.path) if watch is not None else ""
        if event.mask & (Mask.IGNORED | _SELF_EVENTS) and directory:
            self._watches.pop(directory, None)
        seen.append((directory, str(event.name) if event.name is not None else ""))

    async def wait(self, timeout: float) -> list[tuple[str, str]]:
        """Events as ``(directory, name)`` pairs; empty after ``timeout`` seconds of quiet."""
        seen: list[tuple[str, str]] = []
        try:
            event = await asyncio.wait_for(self._inotify.get(), timeout)
        except asyncio.TimeoutError:
            return seen
        self._note(event, seen)
        while (more := self._inotify.sync_get()) is not None:
            self._note(more, seen)
        return seen
