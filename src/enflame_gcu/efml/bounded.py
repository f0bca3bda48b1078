"""Run each card's libefml calls on a thread of its own, each with a deadline.

A C call cannot be interrupted: a card whose call never returns keeps its thread. So each key
(a card index, or "node" for node-wide calls) has one daemon worker; a call that misses its
deadline raises :class:`~enflame_gcu.errors.EfmlTimeout`, and while that worker is still stuck
every later call for the same key fails at once with the same error instead of queueing. The
other keys' workers go on. At most one thread per key, ever; :meth:`BoundedCalls.run_many`
starts every card at once under one deadline, so several hung cards cost one timeout.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
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
        [outcome] = self.run_many([(key, work, what)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def run_many(
        self, calls: Sequence[tuple[str, Callable[[], T], str]]
    ) -> list[T | BaseException]:
        """Start every call on its key's worker at once and wait for all with one deadline, so
        N hung cards cost one timeout, not N; each entry is a result or the exception."""
        started: list[_Job[T] | EfmlTimeout] = []
        for key, work, what in calls:
            worker = self._worker(key)
            since = worker.busy_since
            if since is not None:
                started.append(
                    EfmlTimeout(
                        what,
                        types.TIMEOUT,
                        "timeout",
                        f"{key} is still blocked in an earlier call "
                        f"({time.monotonic() - since:.0f} s)",
                    )
                )
                continue
            job: _Job[T] = _Job(work)
            worker.busy_since = time.monotonic()
            worker.jobs.put(job)  # type: ignore[arg-type]
            started.append(job)
        deadline = time.monotonic() + self.timeout
        outcomes: list[T | BaseException] = []
        for (key, _, what), job_or_error in zip(calls, started, strict=True):
            if isinstance(job_or_error, EfmlTimeout):
                outcomes.append(job_or_error)
            elif not job_or_error.done.wait(max(0.0, deadline - time.monotonic())):
                outcomes.append(
                    EfmlTimeout(
                        what,
                        types.TIMEOUT,
                        "timeout",
                        f"{key} did not answer within {self.timeout:g} s",
                    )
                )
            elif job_or_error.error is not None:
                outcomes.append(job_or_error.error)
            else:
                outcomes.append(job_or_error.result)  # type: ignore[arg-type]
        return outcomes

    def threads(self) -> int:
        """Workers started so far (one per key)."""
        return len(self._workers)
