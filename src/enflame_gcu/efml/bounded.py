"""Run each card's libefml calls on a thread of its own, each with a deadline.

A C call cannot be interrupted: a card whose call never returns keeps its thread. So each key
(a card index, or "node" for node-wide calls) has one daemon worker; a call that misses its
deadline raises :class:`~enflame_gcu.errors.EfmlTimeout`, and while that worker is still stuck
every later call for the same key fails at once with the same error instead of queueing. The
other keys' workers go on. At most one thread per key, ever.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from enflame_gcu.efml import types
from enflame_gcu.errors import EfmlTimeout

T = TypeVar("T")


class _Job(Generic[T]):
    def __init__(self, work: Callable[[], T]) -> None:
        self.work = work
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


class _Worker:
    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[_Job[object]] = queue.SimpleQueue()
        self.busy_since: float | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job.result = job.work()
            except BaseException as exc:  # handed to the caller, never lost
                job.error = exc
            finally:
                self.busy_since = None
                job.done.set()


class BoundedCalls:
    """``run(key, work)``: ``work()`` on the key's worker, or EfmlTimeout after ``timeout`` s."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._workers: dict[str, _Worker] = {}
        self._lock = threading.Lock()

    def _worker(self, key: str) -> _Worker:
        with self._lock:
            worker = self._workers.get(key)
            if worker is None:
                worker = self._workers[key] = _Worker(f"efml-{key}")
            return worker

    def stuck(self, key: str) -> float | None:
        """Seconds the key's worker has been inside one call beyond reach, or None."""
        worker = self._workers.get(key)
        since = None if worker is None else worker.busy_since
        return None if since is None else time.monotonic() - since

    def run(self, key: str, work: Callable[[], T], what: str = "libefml call") -> T:
        """The result of ``work()``; its exception re-raised; EfmlTimeout if it overruns."""
        worker = self._worker(key)
        since = worker.busy_since
        if since is not None:
            raise EfmlTimeout(
                what, types.TIMEOUT, "timeout",
                f"{key} is still blocked in an earlier call ({time.monotonic() - since:.0f} s)",
            )  # fmt: skip
        job: _Job[T] = _Job(work)
        worker.busy_since = time.monotonic()
        worker.jobs.put(job)  # type: ignore[arg-type]
        if not job.done.wait(self.timeout):
            raise EfmlTimeout(
                what, types.TIMEOUT, "timeout", f"{key} did not answer within {self.timeout:g} s"
            )
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def threads(self) -> int:
        """Workers started so far (one per key)."""
        return len(self._workers)
