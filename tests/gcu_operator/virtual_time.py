"""Simulated time for the operator's threads: minutes of the chart's real intervals in a second.

A VirtualClock stands in for ``time.monotonic``; its VirtualEvents for ``threading.Event``,
whose timed waits end when the clock reaches their deadline, not after real seconds. The test
moves the clock on with :meth:`VirtualClock.advance`, which steps from one waiter's deadline
to the next and only once every thread that waits on the clock is waiting again: a pass that
takes real milliseconds takes no simulated time, however loaded the machine is, and a thread
blocked for good (a wedged pass) is one waiting on a deadline that never comes.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


class VirtualClock:
    """Simulated monotonic seconds, moved on only by :meth:`advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._cond = threading.Condition()
        # Every thread that ever waited on the clock, and the deadline and wake-up condition of
        # each one waiting now.
        self._members: set[threading.Thread] = set()
        self._waiting: dict[threading.Thread, tuple[float, Callable[[], bool]]] = {}
        self.closed = False

    def monotonic(self) -> float:
        """Now (after :meth:`close`, the end of time: every wait and watch is over)."""
        with self._cond:
            return math.inf if self.closed else self._now

    def wait(self, timeout: float | None, ready: Callable[[], bool] = lambda: False) -> bool:
        """Wait until ``ready()``, at most ``timeout`` simulated seconds (None: no end)."""
        me = threading.current_thread()
        with self._cond:
            deadline = math.inf if timeout is None else self._now + max(0.0, timeout)
            self._members.add(me)
            try:
                while not ready() and not self.closed and self._now < deadline:
                    self._waiting[me] = (deadline, ready)
                    self._cond.wait(0.5)  # real seconds: only a safety net, advance() notifies
            finally:
                self._waiting.pop(me, None)
            return ready()

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` on this clock."""
        self.wait(seconds)

    def notify(self) -> None:
        """Something a waiter's ``ready`` reads has changed."""
        with self._cond:
            self._cond.notify_all()

    def _running(self) -> list[threading.Thread]:
        """Members not (or no longer) waiting: the clock must not move while they run."""
        out = []
        for thread in self._members:
            if not thread.is_alive():
                continue
            waiting = self._waiting.get(thread)
            if waiting is None or waiting[0] <= self._now or waiting[1]():
                out.append(thread)
        return out

    def watch(self, thread: threading.Thread) -> None:
        """Count ``thread`` (started) as a member before its first wait."""
        with self._cond:
            self._members.add(thread)

    def settle(self, real_timeout: float = 30.0) -> None:
        """Return once every member waits (seen twice in a row); AssertionError naming the
        threads still running, with their stacks, after ``real_timeout`` real seconds."""
        limit = time.monotonic() + real_timeout
        quiet = 0
        while quiet < 2:
            with self._cond:
                running = self._running()
            quiet = 0 if running else quiet + 1
            if running and time.monotonic() > limit:
                frames = sys._current_frames()
                stacks = "\n".join(
                    f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
                    for t in running
                    if t.ident in frames
                )
                raise AssertionError(f"threads never waited on the clock again:\n{stacks}")
            time.sleep(0.0002)

    def advance(self, to: float, real_timeout: float = 30.0) -> None:
        """Move the clock on to ``to``, deadline by deadline, every member running in between
        until it waits again; returns settled at ``to``."""
        while True:
            self.settle(real_timeout)
            with self._cond:
                if self._now >= to:
                    return
                upcoming = [d for d, _ in self._waiting.values() if d > self._now]
                self._now = min([to, *upcoming])
                self._cond.notify_all()

    def step(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` at once, whatever runs (to wind a test down)."""
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def close(self) -> None:
        """End of the test: every wait returns and time reads as infinite."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class VirtualEvent(threading.Event):
    """A ``threading.Event`` whose timed waits run on a VirtualClock."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock
        self._is_set = False

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        self._is_set = True
        self._clock.notify()

    def clear(self) -> None:
        self._is_set = False

    def wait(self, timeout: float | None = None) -> bool:
        return self._clock.wait(timeout, self.is_set)


class ClockThreading:
    """The ``threading`` module as a module under test sees it, its Events on ``clock``."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock

    def Event(self) -> VirtualEvent:
        return VirtualEvent(self._clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)
