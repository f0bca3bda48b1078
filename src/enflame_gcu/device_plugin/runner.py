"""The plugin's life: discover, watch health, serve every resource; SIGHUP starts it all over.

One discovery and one health monitor per process feed every served resource (whole cards,
vGCUs, shared slices), each on its own socket with its own registration. A card's health
reaches its vGCUs and slices through :meth:`HealthReport.for_derived`, so they fail and recover
together. SIGHUP re-reads the config file: a valid one applies, an invalid one is refused and the
running config kept; either way the node is rediscovered and every resource served again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable

from enflame_gcu import devices, health
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet, metrics, resources, service
from enflame_gcu.device_plugin import state as plugin_state
from enflame_gcu.errors import ConfigError

log = logging.getLogger(__name__)
Reload = Callable[[], plugin_config.PluginConfig]
HealthListener = Callable[[str, plugin_state.Snapshot], None]


def _describe(inventory: devices.Inventory) -> str:
    usable = ", ".join(card.name for card in inventory.usable_cards()) or "none"
    version = inventory.driver_version or "not loaded"
    vgcus = f", {len(inventory.vgcus)} vGCU(s)" if inventory.vgcus else ""
    return f"driver {version}; {len(inventory.cards)} card(s){vgcus}, usable: {usable}"


def _describe_assignment(placed: resources.Assignment, config: plugin_config.PluginConfig) -> str:
    def names(cards: tuple[devices.Card, ...]) -> str:
        return ", ".join(card.name for card in cards) or "none"

    served = ", ".join(f"{kind}={name}" for kind, name in config.resource_names().items())
    return (
        f"serving {served}; whole cards: {names(placed.whole)}; shared cards: "
        f"{names(placed.shared)}; cards in vGCU mode: {names(placed.vgcu_mode)}"
    )


class NodeResources:
    """One discovery and health monitor; a :class:`PluginState` per served resource."""

    def __init__(
        self, config: plugin_config.PluginConfig, listener: HealthListener | None = None
    ) -> None:
        self.config = config
        self._listener = listener
        inventory = devices.discover(config.host_root)
        self.monitor = health.HealthMonitor(
            config.host_root,
            inventory.cards,
            driver_version=inventory.driver_version,
            interval=config.health_interval,
            disabled=config.disable_healthchecks,
        )
        kinds, self.assignment = resources.build(inventory, config)
        report = self.monitor.report
        self.states = {
            key: plugin_state.PluginState(
                plugin_state.Snapshot(kind, resources.health_of(kind, report))
            )
            for key, kind in kinds.items()
        }
        self._notify()

    @property
    def state(self) -> plugin_state.PluginState:
        """The first served resource's state (whole cards with the default --resources)."""
        return next(iter(self.states.values()))

    @property
    def inventory(self) -> devices.Inventory:
        """The current discovery."""
        return self.state.snapshot.inventory

    def _notify(self) -> None:
        if self._listener is not None:
            names = self.config.resource_names()
            for key, state in self.states.items():
                self._listener(names[key], state.snapshot)

    def on_health(self, update: health.HealthUpdate) -> None:
        """Apply a health update; a driver change means the cards may differ: rediscover."""
        if update.rediscover:
            inventory = devices.discover(self.config.host_root)
            report = self.monitor.reset(inventory.cards, inventory.driver_version)
            kinds, self.assignment = resources.build(inventory, self.config)
            log.info("rediscovered after driver change: %s", _describe(inventory))
            for key, kind in kinds.items():
                self.states[key].replace(
                    plugin_state.Snapshot(kind, resources.health_of(kind, report))
                )
        else:
            for state in self.states.values():
                kind = state.snapshot.kind
                state.set_health(resources.health_of(kind, update.report))
        self._notify()

    def servers(
        self, observer: service.AllocationObserver | None = None
    ) -> list[kubelet.ResourceServer]:
        """One ResourceServer per served resource, on its own socket."""
        names = self.config.resource_names()
        return [
            kubelet.ResourceServer(
                self.config,
                state,
                resource_name=names[key],
                socket_name=self.config.socket_for(key),
                observer=observer,
            )
            for key, state in self.states.items()
        ]


async def _serve_all(
    node: NodeResources, signals: kubelet.Signals, observer: metrics.Metrics | None
) -> str:
    servers = node.servers(observer)
    outcomes = await asyncio.gather(*(s.serve_until_signal(signals) for s in servers))
    return "stop" if "stop" in outcomes else "restart"


def _health_listener(exported: metrics.Metrics) -> HealthListener:
    def listen(resource: str, snapshot: plugin_state.Snapshot) -> None:
        exported.set_devices(resource, ((d.id, d.healthy) for d in snapshot.devices()))

    return listen


def _reloaded(
    config: plugin_config.PluginConfig, reload: Reload | None
) -> plugin_config.PluginConfig:
    if reload is None:
        return config
    try:
        new = reload()
    except ConfigError as exc:
        log.error("SIGHUP: new config refused, keeping the running one: %s", exc)
        return config
    if new != config:
        log.info("SIGHUP: config reloaded: %s", new.describe())
    if new.metrics_port != config.metrics_port:
        log.warning("SIGHUP: a new metrics port takes effect only after a restart")
    return new


async def run(
    config: plugin_config.PluginConfig,
    signals: kubelet.Signals,
    reload: Reload | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0); 1 when init fails and that is fatal."""
    exported: metrics.Metrics | None = None
    if config.metrics_port:
        exported = metrics.Metrics()
        exported.serve(config.metrics_port)
    while True:
        listener = None if exported is None else _health_listener(exported)
        if exported is not None:
            exported.retain(config.resource_names().values())
        node = NodeResources(config, listener)
        log.info("discovered under %s: %s", config.host_root, _describe(node.inventory))
        log.info("%s", _describe_assignment(node.assignment, config))
        for problem in (*node.inventory.problems, *node.assignment.notes):
            log.warning("%s", problem)
        for name, reason in node.monitor.report.reasons().items():
            log.warning("%s is unhealthy: %s", name, reason)
        if not node.inventory.usable_cards():
            if config.fail_on_init_error:
                log.error(
                    "no usable GCU found under %s and --fail-on-init-error is set", config.host_root
                )
                return 1
            log.warning("no usable GCU yet; serving an empty list until the driver appears")
        # Start-up objects (grpc, protobuf, discovery) live for the whole process: keeping them
        # out of the collector's scans removes most GC pauses from the RPC latency tail.
        gc.freeze()
        monitor_task = asyncio.ensure_future(node.monitor.run(node.on_health))
        try:
            outcome = await _serve_all(node, signals, exported)
        finally:
            monitor_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor_task
        if outcome == "stop":
            log.info("stopped")
            return 0
        signals.restart.clear()
        config = _reloaded(config, reload)
        log.info("SIGHUP: restarting with a fresh discovery")
