"""Card health that flips both ways: inotify on /dev, the PCI bus and the driver, plus a rescan.

A card is healthy when its ``/dev/gcuN`` node is the character device discovery found, its PCI
directory and driver entry exist, the driver is loaded and discovery, run again for that card,
finds nothing wrong with it: the runtime rediscovers at every create, so whatever it would refuse
is reported unhealthy here first (one definition of a usable card). Anything we cannot
establish counts as unhealthy (SPEC §6.5 and DESIGN 11). Derived devices (slices, vGCUs)
follow their parent card through :meth:`HealthReport.for_derived`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu import devices, fileio, naming, sysfs
from enflame_gcu.support import inotify

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class CardHealth:
    """Health of one card; ``reason`` says why it is unhealthy (empty when healthy)."""

    name: str
    healthy: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Health of every known card plus the driver version seen while checking."""

    cards: tuple[CardHealth, ...]
    driver_version: str | None

    def healthy(self) -> dict[str, bool]:
        """``{card name: healthy}``."""
        return {card.name: card.healthy for card in self.cards}

    def for_derived(self, parent_of: Mapping[str, str]) -> dict[str, bool]:
        """Health of derived devices (``{device id: parent card}``); unknown parent = unhealthy."""
        by_card = self.healthy()
        return {device: by_card.get(parent, False) for device, parent in parent_of.items()}

    def reasons(self) -> dict[str, str]:
        """``{card name: reason}`` for the unhealthy cards."""
        return {card.name: card.reason for card in self.cards if not card.healthy}


def _card_problem(root: str, card: devices.Card, simulated: bool) -> str:
    """Why the card cannot be used right now, or ``""``."""
    pci = fileio.host_path(root, f"{naming.PCI_DEVICES}/{card.bdf}")
    if not os.path.isdir(pci):
        return f"PCI device {card.bdf} is gone ({naming.PCI_DEVICES}/{card.bdf} missing)"
    if not os.path.isdir(os.path.join(pci, card.driver_dir, card.name)):
        return f"driver entry {card.driver_dir}/{card.name} of {card.bdf} is gone"
    try:
        info = os.stat(fileio.host_path(root, card.dev_path))
    except FileNotFoundError:
        return f"{card.dev_path} is missing"
    except OSError as exc:
        return f"cannot stat {card.dev_path}: {exc.strerror or exc}"
    if stat.S_ISCHR(info.st_mode):
        numbers = (os.major(info.st_rdev), os.minor(info.st_rdev))
        if card.node.major is not None and numbers != (card.node.major, card.minor):
            return f"{card.dev_path} is now {numbers[0]}:{numbers[1]}"
    elif not (simulated and stat.S_ISREG(info.st_mode)):
        return f"{card.dev_path} is not a character device"
    return "; ".join(devices.recheck(root, card, driver_loaded=True, simulated=simulated))


def check(root: str, cards: Sequence[devices.Card], *, disabled: bool = False) -> HealthReport:
    """Health of ``cards`` now; with ``disabled`` every card keeps its discovery verdict."""
    version = devices.read_driver_version(root)
    if disabled:
        return HealthReport(
            tuple(CardHealth(c.name, c.usable, "; ".join(c.problems)) for c in cards), version
        )
    simulated = devices.is_simulated(root)
    # Without the control node no container can use any card (SPEC §4).
    _, control_problem = devices.stat_node(root, naming.CONTROL_NODE, simulated)
    result = []
    for card in cards:
        if version is None:
            problem = "driver not loaded"
        else:
            problem = control_problem or _card_problem(root, card, simulated)
        result.append(CardHealth(card.name, not problem, problem or ""))
    return HealthReport(tuple(result), version)


def present_nodes(root: str) -> frozenset[str]:
    """Names of the GCU and vGCU nodes in ``/dev`` now (``gcuN``, ``vgcuN``): one listdir."""
    try:
        entries = os.listdir(fileio.host_path(root, "/dev"))
    except OSError:
        return frozenset()
    found = (sysfs.node_name(entry) for entry in entries)
    return frozenset(f"{kind}{minor}" for kind, minor in (f for f in found if f is not None))


@dataclass(frozen=True, slots=True)
class HealthUpdate:
    """A changed report; ``rediscover`` says the driver version changed since discovery.

    ``appeared`` names device nodes present now that the last discovery did not make usable
    (a card plugged in or bound after start); only set when the consumer asked for arrivals
    with :meth:`HealthMonitor.expect`. ``report_changed`` is False when only that is new.
    """

    report: HealthReport
    rediscover: bool = False
    appeared: tuple[str, ...] = ()
    report_changed: bool = True


class HealthMonitor:
    """Keeps :class:`HealthReport` current for known cards: inotify events plus a rescan."""

    def __init__(
        self,
        root: str,
        cards: Sequence[devices.Card],
        *,
        driver_version: str | None,
        interval: float = DEFAULT_INTERVAL,
        disabled: bool = False,
    ) -> None:
        self.root = root
        self.interval = interval
        self.disabled = disabled
        self._cards = tuple(cards)
        self._baseline = driver_version
        self._report = check(root, self._cards, disabled=disabled)
        self._expected: frozenset[str] | None = None

    def expect(self, names: frozenset[str]) -> None:
        """Watch for arrivals: device nodes outside ``names`` (the usable ones discovery
        found) are reported in :attr:`HealthUpdate.appeared` at every rescan until a new
        discovery makes them usable and the consumer calls this again."""
        self._expected = names

    @property
    def report(self) -> HealthReport:
        """The latest report."""
        return self._report

    @property
    def baseline(self) -> str | None:
        """The driver version the current discovery was made with."""
        return self._baseline

    def reset(self, cards: Sequence[devices.Card], driver_version: str | None) -> HealthReport:
        """Start over with a new discovery (after a driver change or SIGHUP)."""
        self._cards = tuple(cards)
        self._baseline = driver_version
        self._report = check(self.root, self._cards, disabled=self.disabled)
        return self._report

    def watched_directories(self) -> list[str]:
        """Where events can tell us about a card or the driver."""
        paths = ["/dev", naming.PCI_DEVICES, "/sys/module", "/sys/module/enflame"]
        return [fileio.host_path(self.root, path) for path in paths]

    def rescan(self) -> HealthUpdate | None:
        """Check now; an update when anything changed since the last report, else None."""
        report = check(self.root, self._cards, disabled=self.disabled)
        version = report.driver_version
        rediscover = version is not None and version != self._baseline
        if rediscover:
            log.info("driver version changed: %s -> %s", self._baseline or "none", version)
            self._baseline = version  # report the change once; reset() follows
        appeared: tuple[str, ...] = ()
        if self._expected is not None:
            appeared = tuple(sorted(present_nodes(self.root) - self._expected))
        report_changed = report != self._report
        if not report_changed and not rediscover and not appeared:
            return None
        for name, reason in report.reasons().items():
            if self._report.healthy().get(name, True):
                log.warning("%s is unhealthy: %s", name, reason)
        for name, ok in report.healthy().items():
            if ok and not self._report.healthy().get(name, False):
                log.info("%s is healthy", name)
        self._report = report
        return HealthUpdate(report, rediscover, appeared, report_changed)

    def _step(self, notify: Callable[[HealthUpdate], None]) -> None:
        update = self.rescan()
        if update is None:
            return
        try:
            notify(update)
        except Exception:
            # A failing consumer must not end health watching; the next change retries.
            log.exception("applying a health update failed")

    async def run(self, notify: Callable[[HealthUpdate], None]) -> None:
        """Watch until cancelled, calling ``notify`` with every update."""
        try:
            watcher = inotify.ChangeWatcher(self.watched_directories()).__enter__()
        except OSError as exc:
            log.warning(
                "inotify unavailable (%s); health relies on %ss rescans", exc, self.interval
            )
            while True:
                self._step(notify)
                await asyncio.sleep(self.interval)
        try:
            while True:
                watcher.refresh()
                self._step(notify)
                await watcher.wait(self.interval)
        finally:
            watcher.__exit__(None, None, None)
