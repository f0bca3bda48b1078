"""Card telemetry through libefml, collected on a thread of its own; a scrape reads the last pass.

Every ``interval`` seconds the collector reads each card with :func:`efml.reading.read_card` on
that card's own worker (:class:`efml.bounded.BoundedCalls`), so a card whose calls hang or fail
drops out of that pass with a reason while the others are read; the plugin's allocation work
never touches libefml. No libefml on the host: one INFO line, telemetry off, the plugin goes on
(the library is looked for again every ``RELOAD_EVERY`` passes, so installing it later works).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from enflame_gcu.efml import bounded, library, reading
from enflame_gcu.errors import EfmlError

log = logging.getLogger(__name__)
MAX_DEVICE_COUNT = 128  # efml.h
RELOAD_EVERY = 30


@dataclass(frozen=True, slots=True)
class CardFailure:
    """A card left out of a pass: its library index, PCI address if ever learnt, and why."""

    index: int
    bdf: str
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One collection pass: what was read, what failed, and how long it took."""

    up: bool
    reason: str = ""
    driver_version: str = ""
    count: int = 0
    cards: tuple[reading.CardReading, ...] = ()
    failures: tuple[CardFailure, ...] = ()
    seconds: float = 0.0
    finished: float = field(default_factory=time.time)


class TelemetryCollector:
    """The collector thread: :meth:`start`, :attr:`snapshot` (the last pass), :meth:`stop`."""

    def __init__(
        self,
        host_root: str,
        interval: float,
        timeout: float,
        library_path: str | None = None,
    ) -> None:
        self.host_root = host_root
        self.interval = interval
        self.library_path = library_path
        self.calls = bounded.BoundedCalls(timeout)
        self.snapshot = Snapshot(up=False, reason="not collected yet")
        self._lib: library.Library | None = None
        self._bdfs: dict[int, str] = {}
        self._passes = 0
        self._said: str | None = None
        self._failing: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Collect now and then every ``interval`` seconds on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and shut the library down (bounded: a hung library is left alone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.calls.timeout + self.interval)
        lib = self._lib
        if lib is not None:
            try:
                self.calls.run("node", lib.shutdown, "EfmlShutdown")
            except EfmlError as exc:
                log.warning("libefml shutdown: %s", exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.snapshot = self.collect_once()
            self._stop.wait(self.interval)

    def _off(self, reason: str, started: float) -> Snapshot:
        if reason != self._said:
            log.info("card telemetry off: %s; the plugin works on without it", reason)
            self._said = reason
        return Snapshot(up=False, reason=reason, seconds=time.monotonic() - started)

    def _open(self) -> library.Library:
        lib = library.Library.load(self.host_root, self.library_path)
        self.calls.run("node", lib.init, "EfmlInit")
        log.info("card telemetry on: %s", lib.path)
        self._said = None
        return lib

    def collect_once(self) -> Snapshot:
        """One pass over every card (also what tests and the benchmark call directly)."""
        started = time.monotonic()
        self._passes += 1
        if self._lib is None:
            if self._said is not None and self._passes % RELOAD_EVERY != 1:
                return self._off(self._said, started)
            try:
                self._lib = self._open()
            except EfmlError as exc:
                return self._off(f"libefml not usable ({exc})", started)
        lib = self._lib
        try:
            count = self.calls.run("node", lib.device_count, "EfmlGetDevCount")
            driver = self.calls.run("node", lib.driver_version, "EfmlGetDriverVer")
        except EfmlError as exc:
            return self._off(f"libefml does not answer ({exc})", started)
        self._said = None
        cards, failures = [], []
        indexes = range(min(count, MAX_DEVICE_COUNT))
        calls = [
            (str(i), functools.partial(reading.read_card, lib, i), f"card {i}") for i in indexes
        ]
        for index, outcome in zip(indexes, self.calls.run_many(calls), strict=True):
            if isinstance(outcome, EfmlError):
                failures.append(
                    CardFailure(index, self._bdfs.get(index, ""), outcome.name, str(outcome))
                )
            elif isinstance(outcome, BaseException):
                failures.append(
                    CardFailure(index, self._bdfs.get(index, ""), "error", repr(outcome))
                )
            else:
                self._bdfs[index] = outcome.identity.bdf
                cards.append(outcome)
        self._report(failures)
        return Snapshot(
            up=True,
            driver_version=driver,
            count=count,
            cards=tuple(cards),
            failures=tuple(failures),
            seconds=time.monotonic() - started,
        )

    def _report(self, failures: list[CardFailure]) -> None:
        """One WARNING when a card drops out (or its reason changes), one INFO when it is back."""
        now = {f.index: f.reason for f in failures}
        for failure in failures:
            if self._failing.get(failure.index) != failure.reason:
                log.warning(
                    "card %d (%s) left out of telemetry: %s",
                    failure.index,
                    failure.bdf or "address unknown",
                    failure.detail,
                )
        for index in set(self._failing) - set(now):
            log.info("card %d answers libefml again", index)
        self._failing = now
