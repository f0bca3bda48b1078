"""Card telemetry through libefml, collected on a thread of its own; a scrape reads the last pass.

Every ``interval`` seconds the collector reads each card with :func:`efml.reading.read_card` on
that card's own worker (:class:`efml.bounded.BoundedCalls`), so a card whose calls hang or whose
identity cannot be read drops out of that pass with a reason while the others are read; a single
failing reading only leaves that reading out and counts the error per call. The plugin's
allocation work never touches libefml. No libefml on the host: one INFO line, telemetry off, the
plugin goes on (the library is looked for again every ``RELOAD_EVERY`` passes, so installing it
later works). After a driver reload (the driver version changes) or ``REINIT_AFTER`` node-level
errors in a row, libefml is shut down and initialised again. Events (``EfmlGetEvent``, the
library's XID analogue) are read on a thread of their own and counted by type. Energy is the
integral of the power reading over the passes (libefml has no energy counter).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from enflame_gcu.efml import bounded, library, reading, types
from enflame_gcu.errors import EfmlError, EfmlTimeout

log = logging.getLogger(__name__)
MAX_DEVICE_COUNT = 128  # efml.h
RELOAD_EVERY = 30
REINIT_AFTER = 3  # node-level errors in a row before libefml is shut down and initialised again
EVENT_WAIT_MS = 1000  # how long one EfmlGetEvent call waits for an event
EVENT_BACKOFF = 5.0  # seconds after an event error before the next call (as gcu-exporter)


@dataclass(frozen=True, slots=True)
class CardFailure:
    """A card left out of a pass: its library index, PCI address if ever learnt, and why."""

    index: int
    bdf: str
    reason: str
    detail: str
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One collection pass: what was read, what failed, and how long it took.

    ``cause`` is the short reason telemetry is off (a label value); ``reason`` the whole text.
    Counters (reading errors, energy, events, inits) are totals since the plugin started.
    """

    up: bool
    reason: str = ""
    driver_version: str = ""
    count: int = 0
    cards: tuple[reading.CardReading, ...] = ()
    failures: tuple[CardFailure, ...] = ()
    seconds: float = 0.0
    finished: float = field(default_factory=time.time)
    cause: str = ""
    # (library index, PCI address, call, error name, count)
    reading_errors: tuple[tuple[int, str, str, str, int], ...] = ()
    energy: tuple[tuple[str, float], ...] = ()  # (PCI address, joules)
    events: tuple[tuple[str, int], ...] = ()  # (event type name, count)
    inits: int = 0


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
        self.snapshot = Snapshot(up=False, reason="not collected yet", cause="not_collected_yet")
        self._lib: library.Library | None = None
        self._bdfs: dict[int, str] = {}
        self._uuids: dict[int, str] = {}
        self._passes = 0
        self._said: str | None = None
        self._cause = ""
        self._failing: dict[int, str] = {}
        self._node_errors = 0
        self._driver: str | None = None
        self._inits = 0
        self._reading_errors: dict[tuple[int, str, str, str], int] = {}
        self._energy: dict[str, float] = {}
        self._power_at: dict[str, tuple[float, float]] = {}  # bdf -> (monotonic time, power)
        self._events: dict[str, int] = {}
        self._events_lock = threading.Lock()
        self._events_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Collect now and then every ``interval`` seconds on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the threads and shut the library down (bounded: a hung library is left alone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.calls.timeout + self.interval)
        if self._events_thread is not None:
            self._events_thread.join(EVENT_WAIT_MS / 1000 + self.calls.timeout)
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

    def _off(self, reason: str, cause: str, started: float) -> Snapshot:
        if reason != self._said:
            log.info("card telemetry off: %s; the plugin works on without it", reason)
            self._said = reason
            self._cause = cause
        return Snapshot(
            up=False,
            reason=reason,
            cause=self._cause or cause,
            seconds=time.monotonic() - started,
            inits=self._inits,
            events=self._event_counts(),
        )

    def _open(self) -> library.Library:
        lib = library.Library.load(self.host_root, self.library_path)
        self.calls.run("node", lib.init, "EfmlInit")
        self._inits += 1
        log.info("card telemetry on: %s", lib.path)
        self._said = None
        return lib

    def _reinit(self, lib: library.Library, why: str) -> None:
        """Shut libefml down and initialise it again (a driver reload, repeated node errors)."""
        log.warning("re-initialising libefml: %s", why)
        # Shutdown and init in one go, once no other call (the events thread's) is inside.
        self.calls.run("node", lib.reinit, "EfmlInit")
        self._inits += 1
        self._node_errors = 0

    def _node(self, lib: library.Library) -> tuple[int, str]:
        driver = self.calls.run("node", lib.driver_version, "EfmlGetDriverVer")
        if self._driver is not None and driver != self._driver:
            self._reinit(lib, f"the driver changed from {self._driver} to {driver}")
        self._driver = driver
        count = self.calls.run("node", lib.device_count, "EfmlGetDevCount")
        return count, driver

    def collect_once(self) -> Snapshot:
        """One pass over every card (also what tests and the benchmark call directly)."""
        started = time.monotonic()
        self._passes += 1
        if self._lib is None:
            if self._said is not None and self._passes % RELOAD_EVERY != 1:
                return self._off(self._said, self._cause, started)
            try:
                self._lib = self._open()
            except EfmlError as exc:
                cause = "no_library" if exc.function == "dlopen" else f"init_failed:{exc.name}"
                return self._off(f"libefml not usable ({exc})", cause, started)
            self._start_events(self._lib)
        lib = self._lib
        try:
            count, driver = self._node(lib)
        except EfmlError as exc:
            self._node_errors += 1
            if self._node_errors >= REINIT_AFTER and not isinstance(exc, EfmlTimeout):
                try:
                    self._reinit(lib, f"{self._node_errors} node-level errors in a row ({exc})")
                    count, driver = self._node(lib)
                except EfmlError as again:
                    return self._off(
                        f"libefml does not answer ({again})", f"no_answer:{again.name}", started
                    )
            else:
                return self._off(
                    f"libefml does not answer ({exc})", f"no_answer:{exc.name}", started
                )
        self._node_errors = 0
        self._said = None
        self._cause = ""
        cards, failures = [], []
        indexes = range(min(count, MAX_DEVICE_COUNT))
        calls = [
            (str(i), functools.partial(reading.read_card, lib, i), f"card {i}") for i in indexes
        ]
        for index, outcome in zip(indexes, self.calls.run_many(calls), strict=True):
            bdf, uuid = self._bdfs.get(index, ""), self._uuids.get(index, "")
            if isinstance(outcome, EfmlError):
                failures.append(CardFailure(index, bdf, outcome.name, str(outcome), uuid))
            elif isinstance(outcome, BaseException):
                failures.append(CardFailure(index, bdf, "error", repr(outcome), uuid))
            else:
                self._bdfs[index] = outcome.identity.bdf
                if outcome.uuid:
                    self._uuids[index] = outcome.uuid
                cards.append(outcome)
        self._report(failures)
        self._count(cards)
        return Snapshot(
            up=True,
            driver_version=driver,
            count=count,
            cards=tuple(cards),
            failures=tuple(failures),
            seconds=time.monotonic() - started,
            reading_errors=tuple((*key, n) for key, n in sorted(self._reading_errors.items())),
            energy=tuple(sorted(self._energy.items())),
            events=self._event_counts(),
            inits=self._inits,
        )

    def _count(self, cards: list[reading.CardReading]) -> None:
        """Add this pass's reading errors and energy to the running totals."""
        now = time.monotonic()
        for card in cards:
            bdf = card.identity.bdf
            for call, name in card.errors:
                key = (card.index, bdf, call, name)
                self._reading_errors[key] = self._reading_errors.get(key, 0) + 1
            self._energy.setdefault(bdf, 0.0)
            if card.power is None:
                self._power_at.pop(bdf, None)  # a gap is not integrated
                continue
            before = self._power_at.get(bdf)
            if before is not None:
                self._energy[bdf] += before[1] * (now - before[0])
            self._power_at[bdf] = (now, card.power.consumption)

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

    # --- events ----------------------------------------------------------------------------

    def _event_counts(self) -> tuple[tuple[str, int], ...]:
        with self._events_lock:
            return tuple(sorted(self._events.items()))

    def _start_events(self, lib: library.Library) -> None:
        if self._events_thread is not None or not lib.has("EfmlGetEvent"):
            return
        with self._events_lock:  # every known type from 0, so increase() sees the first event
            for name in types.EVENT_TYPES.values():
                self._events.setdefault(name, 0)
        self._events_thread = threading.Thread(
            target=self._read_events, args=(lib,), name="efml-events", daemon=True
        )
        self._events_thread.start()

    def _read_events(self, lib: library.Library) -> None:
        """EfmlGetEvent in a loop on its own thread (it blocks up to EVENT_WAIT_MS by design)."""
        while not self._stop.is_set():
            try:
                event = lib.event(EVENT_WAIT_MS)
            except EfmlError as exc:
                log.debug("libefml events: %s", exc)
                self._stop.wait(EVENT_BACKOFF)
                continue
            if event is None:
                continue
            card, kind, message = event
            name = types.EVENT_TYPES.get(kind, f"type_{kind}")
            with self._events_lock:
                self._events[name] = self._events.get(name, 0) + 1
            log.warning("libefml event %s (id %d): %s", name, card, message)
