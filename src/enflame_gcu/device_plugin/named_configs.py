"""One config per node pool (``--config-dir``): a node label names which config file applies.

The directory holds one config file per name, as a ConfigMap mounted as a volume gives it (its
keys become files; the kubelet's ``..data`` links are skipped). The plugin reads its own Node's
label ``--config-label`` before it serves and every ``--config-label-interval`` seconds after:

* the label names a config in the directory: that config;
* the label is absent or empty: ``--config-default`` (none given: flags and environment alone);
* the label names no config there: an ERROR naming the value and the names there, then the
  default, so a typo in a label never leaves a node unserved (a default that is not there is
  an ERROR too, and then no config file applies: flags and environment alone).

A change of the chosen name goes through the SIGHUP path (:func:`runner._reloaded`): a valid
config applies make-before-break, an invalid one is refused and the running one kept. A label
that cannot be read (API down, no permission) keeps the running config and is tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import Gauge

from enflame_gcu.device_plugin import config as plugin_config

log = logging.getLogger(__name__)
RETRY = 2.0  # seconds between tries of the first read, before anything is served


class NodeLabels(Protocol):
    """Reads the labels of one Node."""

    async def node_labels(self, node: str) -> Mapping[str, str]:
        """``metadata.labels`` of ``node``."""
        ...


def available(directory: str) -> tuple[str, ...]:
    """The config names in ``directory``: regular files (or links to one) named as a label
    value may be; anything else (``..data``, sub-directories) is not a config."""
    try:
        entries = os.listdir(directory)
    except OSError as exc:
        log.error("cannot list the named configs in %s: %s", directory, exc.strerror or exc)
        return ()
    names = []
    for entry in entries:
        try:
            plugin_config.config_name(entry)
            if stat.S_ISREG(os.stat(os.path.join(directory, entry)).st_mode):
                names.append(entry)
        except (ValueError, OSError):
            continue
    return tuple(sorted(names))


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """Which named config applies, and why (for the log)."""

    name: str  # "" = none: flags and environment alone
    label: str | None  # the label's value; None when the node has no such label
    why: str
    # The label, or the default, names a config that does not exist (logged as an error).
    trouble: bool = False


def choose(label: str | None, names: tuple[str, ...], default: str) -> Choice:
    """The config the label value chooses among ``names``; the default when it chooses none."""
    fallback = default if default else ""
    if default and default not in names:
        fallback = ""
    if label and label in names:
        return Choice(label, label, f"node label names {label!r}")
    shown = "none" if not fallback else repr(fallback)
    if default and not fallback:
        shown += f" (the default {default!r} is not there either)"
    if label:
        why = (
            f"node label names {label!r}, which is not a config here (available: "
            f"{', '.join(names) or 'none'}); using the default: {shown}"
        )
        return Choice(fallback, label, why, trouble=True)
    why = f"node has no label; using the default: {shown}"
    if default and not fallback:
        why += f" (available: {', '.join(names) or 'none'})"
    return Choice(fallback, label, why, trouble=bool(default and not fallback))


class NamedConfigs:
    """The choice last made from the node's label, and the name running (for the metric)."""

    def __init__(self, config: plugin_config.PluginConfig) -> None:
        self.directory = config.config_dir or ""
        self.default = config.config_default
        self.label_key = config.config_label
        self.node = config.node_name
        self.interval = config.config_label_interval
        self.choice: Choice | None = None
        self.applied: str | None = None  # the name running (None: not yet started)
        self.pending = False  # a label change is waiting for the runner's reload
        self.on_applied: Callable[[str], None] | None = None
        self._trouble = ""

    @property
    def wanted(self) -> str:
        """The name the label chooses now ("" = none)."""
        return "" if self.choice is None else self.choice.name

    def path(self, name: str) -> str:
        """The file of a named config."""
        return os.path.join(self.directory, name)

    def applied_now(self, name: str) -> None:
        """``name`` is running now (after the start or a reload)."""
        self.applied = name
        if self.on_applied is not None:
            self.on_applied(name)

    async def read(self, api: NodeLabels) -> Choice | None:
        """Read the label and choose; None (and one WARNING while it persists) on failure."""
        try:
            labels = await api.node_labels(self.node)
        except Exception as exc:  # any API or network failure: keep what runs, try again
            if str(exc) != self._trouble:
                log.warning(
                    "cannot read node %s's label %s (%s); keeping config %r and trying again",
                    self.node,
                    self.label_key,
                    exc,
                    self.wanted,
                )
                self._trouble = str(exc)
            return None
        if self._trouble:
            log.info("node %s's labels read again", self.node)
            self._trouble = ""
        value = labels.get(self.label_key)
        choice = choose(value or None, available(self.directory), self.default)
        if choice != self.choice:
            if choice.trouble:
                log.error("%s=%s: %s", self.label_key, value, choice.why)
            else:
                log.info("%s=%s: %s", self.label_key, value or "(none)", choice.why)
        self.choice = choice
        return choice

    async def first(self, api: NodeLabels, stop: asyncio.Event) -> bool:
        """Read the label before anything is served, trying again until it can be read;
        False when ``stop`` is set first."""
        while await self.read(api) is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY)
            if stop.is_set():
                return False
        return True

    async def run(self, api: NodeLabels, restart: Callable[[], None]) -> None:
        """Read the label every interval; a change of the chosen name calls ``restart``."""
        if not self.interval:
            return
        while True:
            await asyncio.sleep(self.interval)
            before = self.wanted
            choice = await self.read(api)
            # Only a new choice reloads: a refused config is not tried again every interval.
            if choice is not None and choice.name not in (before, self.applied):
                log.info("node label chooses config %r: reloading", choice.name or "(none)")
                self.pending = True
                restart()

    def take_pending(self) -> bool:
        """Whether a label change caused this reload (cleared)."""
        pending, self.pending = self.pending, False
        return pending


def export(registry: Any, named: NamedConfigs) -> None:
    """``enflame_gcu_plugin_config_info{name}``: 1 for the named config running."""
    gauge = Gauge(
        "enflame_gcu_plugin_config_info",
        "Always 1; the named config (--config-dir) the plugin runs, as a label",
        ["name"],
        registry=registry,
    )

    def show(name: str) -> None:
        gauge.clear()
        gauge.labels(name=name).set(1)

    named.on_applied = show
