"""The plugin's life: discover, watch health, serve every resource; SIGHUP starts it all over.

One discovery and one health monitor per process feed every served resource (whole cards,
vGCUs, shared slices), each on its own socket with its own registration. A card's health
reaches its vGCUs and slices through :meth:`HealthReport.for_derived`, so they fail and recover
together. SIGHUP re-reads the config file: a valid one applies, an invalid one is refused and the
running config kept; either way the node is rediscovered.

SIGHUP is make-before-break without the break: a resource served before and after (same name,
same socket) keeps its server, registration and ListAndWatch stream, and the new discovery and
config reach the kubelet as the next list on that stream. Only a resource that is new is
registered, and only one that is gone (or moved to another socket) is stopped, before anything
else registers: a kubelet marks a resource unhealthy and its endpoint stopped whenever any of
its streams ends, so ending an old stream after a new registration would break the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from enflame_gcu import devices, health
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet, resources, service
from enflame_gcu.device_plugin import state as plugin_state
from enflame_gcu.errors import ConfigError, EfsmiError, EnflameError, KubeletApiError

if TYPE_CHECKING:
    # Imported where used: with the default config (no metrics port, feature file, node
    # state or named configs) start-up needs none of them, and prometheus_client with
    # http.server is a large share of the time to registration.
    from enflame_gcu.device_plugin import drs_instances, metrics, named_configs, node_annotation

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


def _usable(inventory: devices.Inventory) -> frozenset[str]:
    """The device nodes a discovery made usable (cards and vGCUs)."""
    usable = {card.name for card in inventory.cards if card.usable}
    return frozenset(usable | {vgcu.name for vgcu in inventory.vgcus if vgcu.usable})


class NodeResources:
    """One discovery and health monitor; a :class:`PluginState` per served resource."""

    def __init__(
        self,
        config: plugin_config.PluginConfig,
        listener: HealthListener | None = None,
        adopt: Mapping[str, plugin_state.PluginState] | None = None,
        instances: drs_instances.DrsInstances | None = None,
    ) -> None:
        self.config = config
        self._listener = listener
        self._instances = instances
        # Cards DRA claims hold (a node moved back from DRA): advertised Unhealthy meanwhile.
        self.dra_held: frozenset[str] = frozenset()
        inventory = devices.discover(config.host_root)
        self.monitor = health.HealthMonitor(
            config.host_root,
            inventory.cards,
            driver_version=inventory.driver_version,
            interval=config.health_interval,
            disabled=config.disable_healthchecks,
        )
        # Device nodes outside the usable ones are arrivals (a card plugged in after start).
        self.monitor.expect(_usable(inventory))
        kinds, self.assignment = resources.build(inventory, config, instances)
        report = self.monitor.report
        self.states: dict[str, plugin_state.PluginState] = {}
        for key, kind in kinds.items():
            snapshot = plugin_state.Snapshot(kind, self._health(kind, report))
            if adopt is not None and key in adopt:
                # A running server's state: its open streams send this snapshot next.
                self.states[key] = adopt[key]
                self.states[key].replace(snapshot)
            else:
                self.states[key] = plugin_state.PluginState(snapshot)
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
        """Apply a health update; a driver change, or device nodes that discovery did not make
        usable (a card plugged in after start, or while this process started), mean the cards
        may differ: rediscover."""
        inventory = None
        if update.rediscover or update.appeared:
            inventory = devices.discover(self.config.host_root)
            if not update.rediscover and _usable(inventory) == _usable(self.inventory):
                log.debug(
                    "device node(s) %s present but not usable yet", ", ".join(update.appeared)
                )
                inventory = None
                if not update.report_changed:
                    return
        if inventory is not None:
            report = self.monitor.reset(inventory.cards, inventory.driver_version)
            self.monitor.expect(_usable(inventory))
            kinds, self.assignment = resources.build(inventory, self.config, self._instances)
            why = (
                "driver change"
                if update.rediscover
                else "new device node(s) " + ", ".join(update.appeared)
            )
            log.info("rediscovered after %s: %s", why, _describe(inventory))
            for key, kind in kinds.items():
                if key in self.states:
                    self.states[key].replace(
                        plugin_state.Snapshot(kind, self._health(kind, report))
                    )
                else:
                    log.warning("%s is served after a restart (SIGHUP), not by this process", key)
        else:
            for state in self.states.values():
                kind = state.snapshot.kind
                state.set_health(self._health(kind, update.report))
        self._notify()

    def _health(self, kind: resources.DeviceKind, report: health.HealthReport) -> dict[str, bool]:
        verdicts = resources.health_of(kind, report)
        if self.dra_held:
            for device in kind.catalog:
                if (device.card or device.id) in self.dra_held:
                    verdicts[device.id] = False
        return verdicts

    def withhold_dra(self, cards: frozenset[str]) -> None:
        """Take the cards DRA claims hold now: their devices go Unhealthy until released."""
        if cards == self.dra_held:
            return
        for card in sorted(cards - self.dra_held):
            log.warning("%s is held by a DRA claim: advertised Unhealthy until released", card)
        for card in sorted(self.dra_held - cards):
            log.info("%s was released by its DRA claim: advertised by its health again", card)
        self.dra_held = cards
        for state in self.states.values():
            state.set_health(self._health(state.snapshot.kind, self.monitor.report))
        self._notify()

    def server_keys(self) -> dict[str, tuple[str, str]]:
        """``{kind: (socket path, resource name)}``: what a running server is reused for."""
        names = self.config.resource_names()
        return {
            key: (os.path.join(self.config.plugin_dir, self.config.socket_for(key)), names[key])
            for key in self.states
        }

    def server(
        self, key: str, observer: service.PluginObserver | None = None
    ) -> kubelet.ResourceServer:
        """A new ResourceServer for one served resource, on its own socket."""
        return kubelet.ResourceServer(
            self.config,
            self.states[key],
            resource_name=self.config.resource_names()[key],
            socket_name=self.config.socket_for(key),
            observer=observer,
        )

    def servers(
        self, observer: service.PluginObserver | None = None
    ) -> list[kubelet.ResourceServer]:
        """A new ResourceServer per served resource, each on its own socket."""
        return [self.server(key, observer) for key in self.states]


class Servers:
    """The running ResourceServers, kept across SIGHUPs by (socket path, resource name)."""

    def __init__(self, observer: service.PluginObserver | None) -> None:
        self.observer = observer
        self._running: dict[tuple[str, str], tuple[kubelet.ResourceServer, asyncio.Task[None]]]
        self._running = {}

    def states(self, config: plugin_config.PluginConfig) -> dict[str, plugin_state.PluginState]:
        """States of running servers that ``config`` serves again (by kind), to adopt."""
        result = {}
        for key, name in config.resource_names().items():
            path = os.path.join(config.plugin_dir, config.socket_for(key))
            running = self._running.get((path, name))
            if running is not None:
                result[key] = running[0].state
        return result

    async def apply(self, node: NodeResources) -> None:
        """Stop servers ``node`` no longer serves, reconfigure kept ones, start new ones."""
        wanted = node.server_keys()
        for gone in [k for k in self._running if k not in wanted.values()]:
            server, task = self._running.pop(gone)
            log.info("no longer serving %s on %s", gone[1], gone[0])
            await server.close()
            await task
        for key, ident in wanted.items():
            if ident in self._running:
                self._running[ident][0].reconfigure(node.config)
            else:
                server = node.server(key, self.observer)
                self._running[ident] = (server, asyncio.ensure_future(server.run()))

    def tasks(self) -> list[asyncio.Task[None]]:
        """The running servers' tasks."""
        return [task for _, task in self._running.values()]

    async def close(self) -> None:
        """Stop every server (ends the streams, removes sockets and locks)."""
        for server, _ in self._running.values():
            await server.close()
        await asyncio.gather(*self.tasks(), return_exceptions=True)
        self._running.clear()


def _on_health(node: NodeResources, watchers: NodeWatchers, update: health.HealthUpdate) -> None:
    node.on_health(update)
    watchers.observe(node)


def _health_listener(exported: metrics.Metrics) -> HealthListener:
    def listen(resource: str, snapshot: plugin_state.Snapshot) -> None:
        exported.set_devices(resource, ((d.id, d.healthy) for d in snapshot.devices()))

    return listen


def _reloaded(
    config: plugin_config.PluginConfig, reload: Reload | None, why: str = "SIGHUP"
) -> plugin_config.PluginConfig:
    if reload is None:
        return config
    try:
        new = reload()
    except ConfigError as exc:
        log.error("%s: new config refused, keeping the running one: %s", why, exc)
        return config
    if new != config:
        log.info("%s: config reloaded: %s", why, new.describe())
    if (new.metrics_port, new.metrics_bind_address, new.pod_resources_socket) != (
        config.metrics_port,
        config.metrics_bind_address,
        config.pod_resources_socket,
    ) or (new.pod_resources_interval, new.log_format) != (
        config.pod_resources_interval,
        config.log_format,
    ):
        log.warning(
            "%s: new metrics, PodResources or log format settings take effect only after a restart",
            why,
        )
    telemetry_settings = (
        "telemetry_interval", "telemetry_timeout", "efml_library", "telemetry_isolation"
    )  # fmt: skip
    if any(getattr(new, name) != getattr(config, name) for name in telemetry_settings):
        log.warning("%s: new card telemetry settings take effect only after a restart", why)
    return new


async def _until_signal(signals: kubelet.Signals, servers: Servers) -> str:
    """Wait for SIGTERM/SIGINT (``stop``) or SIGHUP (``restart``); a server ending is a bug."""
    waits = [
        asyncio.ensure_future(signals.stop.wait()),
        asyncio.ensure_future(signals.restart.wait()),
    ]
    try:
        await asyncio.wait([*waits, *servers.tasks()], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    for task in servers.tasks():
        if task.done() and not task.cancelled():
            failure = task.exception()
            if failure is not None:
                raise failure
    return "stop" if signals.stop.is_set() else "restart"


class NodeWatchers:
    """What follows the node as a whole: card metrics, the NFD feature file, the node state."""

    def __init__(
        self,
        exported: metrics.Metrics | None,
        annotator: node_annotation.NodeAnnotator | None = None,
    ) -> None:
        self.exported = exported
        self.annotator = annotator
        self.feature: Any = None  # feature_file.FeatureFile, imported when configured

    def configure(self, config: plugin_config.PluginConfig) -> None:
        """Follow a (new) config's feature file setting."""
        path = config.feature_file
        if path is None:
            self.feature = None
        elif self.feature is None or self.feature.path != path:
            from enflame_gcu.device_plugin import feature_file  # noqa: PLC0415 - when used

            counter = None if self.exported is None else self.exported.feature_file_writes.inc
            self.feature = feature_file.FeatureFile(path, counter)

    def observe(self, node: NodeResources) -> None:
        """The node's cards or health changed (or were just discovered)."""
        report = node.monitor.report
        if self.exported is not None:
            self.exported.set_node(node.inventory, report)
        if self.feature is not None:
            slices = resources.slice_counts(node.inventory, node.config, node.assignment)
            self.feature.update(
                node.inventory, report, slices=slices, node_mode=node.config.node_mode or None
            )
        if self.annotator is not None:
            self.annotator.set_node(node.inventory, report, node.assignment, node.config)


async def _heartbeat(exported: metrics.Metrics) -> None:
    while True:
        exported.beat()
        await asyncio.sleep(1.0)


def _telemetry(config: plugin_config.PluginConfig, exported: metrics.Metrics) -> Any:
    """Card telemetry on the metrics port: a collector thread and the families it feeds; its
    modules (ctypes, libefml's binding) are imported only here, so a plugin without the metrics
    port starts as fast as before."""
    if not config.telemetry_interval:
        return None
    from enflame_gcu.device_plugin import telemetry, telemetry_metrics  # noqa: PLC0415
    from enflame_gcu.efml import library as efml_library  # noqa: PLC0415

    settings = (
        config.host_root, config.telemetry_interval, config.telemetry_timeout, config.efml_library
    )  # fmt: skip
    collector: Any
    if config.telemetry_isolation == "process":
        from enflame_gcu.device_plugin import telemetry_child  # noqa: PLC0415

        collector = telemetry_child.ChildCollector(*settings)
    else:
        collector = telemetry.TelemetryCollector(*settings)
        efml_library.ignore_user_signals()  # before the library loads, as gcu-exporter does
    families = telemetry_metrics.TelemetryMetrics(collector, exported.cards.current)
    exported.add_cached(families, families.version)
    collector.start()
    return collector


def _background(
    config: plugin_config.PluginConfig,
    exported: metrics.Metrics | None,
    annotator: node_annotation.NodeAnnotator | None,
) -> list[Any]:
    """The heartbeat behind /healthz, the PodResources reader behind the per-card labels and
    the node state, and the node state's writer."""
    tasks = [] if exported is None else [asyncio.ensure_future(_heartbeat(exported))]
    sinks = [] if annotator is None else [annotator.set_holdings]
    if config.pod_resources_interval > 0 and (exported is not None or sinks):
        from enflame_gcu.device_plugin import holdings_feed  # noqa: PLC0415 - when used

        feed = holdings_feed.HoldingsFeed(
            exported, config.pod_resources_socket, config.pod_resources_interval, sinks
        )
        if exported is not None:
            exported.after_allocate = feed.poke
        tasks.append(asyncio.ensure_future(feed.run()))
    if annotator is not None:
        tasks.append(asyncio.ensure_future(annotator.run()))
    return tasks


def _watch_dra_holdings(
    node: NodeResources, config: plugin_config.PluginConfig
) -> asyncio.Future[Any]:
    """Keep cards DRA claims hold out of the advertised list (PodResources, every few s)."""
    if config.pod_resources_interval <= 0:
        return asyncio.ensure_future(asyncio.Event().wait())
    return asyncio.ensure_future(_dra_holdings_later(node, config))


async def _dra_holdings_later(node: NodeResources, config: plugin_config.PluginConfig) -> None:
    # One interval after the start: registration imports none of this, and the scheduler sees
    # the plugin's cards only after the kubelet's next node status, so none is allocated before.
    await asyncio.sleep(config.pod_resources_interval)
    from enflame_gcu.device_plugin import dra_holdings  # noqa: PLC0415 - after registration

    await dra_holdings.run(node, config.pod_resources_socket, config.pod_resources_interval)


async def _release_drs(
    instances: drs_instances.DrsInstances, config: plugin_config.PluginConfig
) -> None:
    """Destroy DRS instances whose slices no container holds (PodResources, every few s)."""
    from enflame_gcu.kubelet_api import podresources  # noqa: PLC0415 - DRS only

    client = podresources.Client(config.pod_resources_socket)
    trouble = ""
    interval = config.pod_resources_interval or 5.0
    try:
        while True:
            try:
                listing = await client.list_resources()
                held = {
                    device
                    for holding in listing.holdings
                    if holding.resource == config.drs_resource_name
                    for device in holding.device_ids
                }
                await asyncio.to_thread(instances.release_unheld, held)
                trouble = ""
            except (KubeletApiError, EfsmiError) as exc:
                if str(exc) != trouble:
                    log.warning("DRS instances are kept until this works again: %s", exc)
                    trouble = str(exc)
            await asyncio.sleep(interval)
    finally:
        await client.close()


async def run(
    config: plugin_config.PluginConfig,
    signals: kubelet.Signals,
    reload: Reload | None = None,
    named: named_configs.NamedConfigs | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0); 1 when init fails and that is fatal.

    With ``named`` (``--config-dir``) the node's label is read first and ``reload`` gives the
    config it chooses; a label change later reloads as SIGHUP does."""
    api = None
    if config.node_state or named is not None:
        from enflame_gcu.device_plugin import node_annotation  # noqa: PLC0415 - when used

        api = node_annotation.LightkubeNodeApi(config.kubeconfig)
    try:
        if named is not None and api is not None:
            if not await named.first(api, signals.stop):
                return 0
            try:
                config = reload() if reload is not None else config
            except ConfigError as exc:
                log.error("named config %r refused: %s", named.wanted, exc)
                return 1
            log.info("running named config %r: %s", config.config_name, config.describe())
        return await _serve(config, signals, reload, named, api)
    finally:
        if api is not None:
            await api.close()


async def _serve(
    config: plugin_config.PluginConfig,
    signals: kubelet.Signals,
    reload: Reload | None,
    named: named_configs.NamedConfigs | None,
    api: node_annotation.LightkubeNodeApi | None,
) -> int:
    exported: metrics.Metrics | None = None
    background: list[Any] = []
    collector: Any = None  # telemetry.TelemetryCollector, imported only when used
    if config.metrics_port:
        from enflame_gcu.device_plugin import http_server, metrics  # noqa: PLC0415 - when used

        exported = metrics.Metrics()
        try:
            http_server.start(exported, config.metrics_port, config.metrics_bind_address)
        except ConfigError as exc:
            log.error("%s", exc)  # the port in use: one line that says so, not a traceback
            return 1
        collector = _telemetry(config, exported)
    annotator = None
    if config.node_state and api is not None:
        from enflame_gcu.device_plugin import node_annotation  # noqa: PLC0415 - when used

        annotator = node_annotation.NodeAnnotator(api, config.node_name)
        log.info("keeping node %s's %s annotation current", config.node_name, "node-state")
    background = _background(config, exported, annotator)
    if named is not None and api is not None:
        if exported is not None:
            from enflame_gcu.device_plugin import named_configs  # noqa: PLC0415 - when used

            named_configs.export(exported.registry, named)
        named.applied_now(config.config_name)
        background.append(asyncio.ensure_future(named.run(api, signals.restart.set)))
    watchers = NodeWatchers(exported, annotator)
    servers = Servers(exported)
    frozen = False
    instances: drs_instances.DrsInstances | None = None
    dra_held: frozenset[str] = frozenset()  # cards DRA claims hold (kept across a SIGHUP)
    if plugin_config.DRS_GCU in config.resources:
        from enflame_gcu import efsmi  # noqa: PLC0415 - drs-gcu only
        from enflame_gcu.device_plugin import drs_instances  # noqa: PLC0415 - drs-gcu only

        instances = drs_instances.DrsInstances.for_node(
            config.host_root, config.plugin_dir, efsmi.Efsmi(config.efsmi), config.drs_release_grace
        )
        background.append(asyncio.ensure_future(_release_drs(instances, config)))
    try:
        while True:
            listener = None if exported is None else _health_listener(exported)
            if exported is not None:
                exported.retain(config.resource_names().values())
            watchers.configure(config)
            node = NodeResources(config, listener, servers.states(config), instances)
            node.withhold_dra(dra_held)  # what the last read said, across a SIGHUP
            if instances is not None and not frozen:
                try:
                    instances.reconcile()  # orphans of a previous run, before serving
                except (EnflameError, OSError) as exc:
                    log.error("cannot check the DRS instances at start: %s", exc)
                    return 1
            watchers.observe(node)
            log.info("discovered under %s: %s", config.host_root, _describe(node.inventory))
            log.info("%s", _describe_assignment(node.assignment, config))
            for problem in (*node.inventory.problems, *node.assignment.notes):
                log.warning("%s", problem)
            for name, reason in node.monitor.report.reasons().items():
                log.warning("%s is unhealthy: %s", name, reason)
            if not node.inventory.usable_cards():
                if config.fail_on_init_error:
                    log.error(
                        "no usable GCU found under %s and --fail-on-init-error is set",
                        config.host_root,
                    )
                    return 1
                log.warning("no usable GCU yet; serving an empty list until the driver appears")
            await servers.apply(node)
            if not frozen:
                # Start-up objects (grpc, protobuf, discovery) live for the whole process:
                # keeping them out of the collector's scans removes most GC pauses from the RPC
                # latency tail. Once only: a freeze per SIGHUP would pin every old discovery.
                gc.freeze()
                frozen = True
            monitor_task = asyncio.ensure_future(
                node.monitor.run(functools.partial(_on_health, node, watchers))
            )
            dra_task = _watch_dra_holdings(node, config)
            try:
                outcome = await _until_signal(signals, servers)
            finally:
                for task in (monitor_task, dra_task):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                dra_held = node.dra_held
            if outcome == "stop":
                if annotator is not None:
                    await annotator.clear()  # a clean stop: no state rather than a stale one
                log.info("stopped")
                return 0
            signals.restart.clear()
            why = "SIGHUP"
            if named is not None and named.take_pending():
                why = f"node label {named.label_key}"
            config = _reloaded(config, reload, why)
            if named is not None:
                named.applied_now(config.config_name)
            log.info("%s: rediscovering; running registrations and streams are kept", why)
    finally:
        await servers.close()
        if collector is not None:
            await asyncio.to_thread(collector.stop)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
