"""The plugin's life: discover, watch health, serve the resource; SIGHUP starts it all over."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging

from enflame_gcu import devices, health
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet
from enflame_gcu.device_plugin import state as plugin_state

log = logging.getLogger(__name__)


def _describe(inventory: devices.Inventory) -> str:
    usable = ", ".join(card.name for card in inventory.usable_cards()) or "none"
    version = inventory.driver_version or "not loaded"
    return f"driver {version}; {len(inventory.cards)} card(s), usable: {usable}"


class Resource:
    """Discovery, health and state of the whole-card resource; rediscovers on driver change."""

    def __init__(self, config: plugin_config.PluginConfig) -> None:
        self.config = config
        inventory = devices.discover(config.host_root)
        self.monitor = health.HealthMonitor(
            config.host_root,
            inventory.cards,
            driver_version=inventory.driver_version,
            interval=config.health_interval,
            disabled=config.disable_healthchecks,
        )
        self.state = plugin_state.PluginState(
            plugin_state.snapshot_for(
                inventory, config.allocation_policy, self.monitor.report.healthy()
            )
        )

    @property
    def inventory(self) -> devices.Inventory:
        """The current discovery."""
        return self.state.snapshot.inventory

    def on_health(self, update: health.HealthUpdate) -> None:
        """Apply a health update; a driver change means the cards may differ: rediscover."""
        if update.rediscover:
            inventory = devices.discover(self.config.host_root)
            report = self.monitor.reset(inventory.cards, inventory.driver_version)
            log.info("rediscovered after driver change: %s", _describe(inventory))
            self.state.replace(
                plugin_state.snapshot_for(
                    inventory, self.config.allocation_policy, report.healthy()
                )
            )
        else:
            self.state.set_health(update.report.healthy())


async def run(config: plugin_config.PluginConfig, signals: kubelet.Signals) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0); 1 when init fails and that is fatal."""
    while True:
        resource = Resource(config)
        log.info("discovered under %s: %s", config.host_root, _describe(resource.inventory))
        for problem in resource.inventory.problems:
            log.warning("%s", problem)
        if not resource.inventory.usable_cards():
            if config.fail_on_init_error:
                log.error(
                    "no usable GCU found under %s and --fail-on-init-error is set", config.host_root
                )
                return 1
            log.warning("no usable GCU yet; serving an empty list until the driver appears")
        # Start-up objects (grpc, protobuf, discovery) live for the whole process: keeping them
        # out of the collector's scans removes most GC pauses from the RPC latency tail.
        gc.freeze()
        monitor_task = asyncio.ensure_future(resource.monitor.run(resource.on_health))
        try:
            outcome = await kubelet.ResourceServer(config, resource.state).serve_until_signal(
                signals
            )
        finally:
            monitor_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor_task
        if outcome == "stop":
            log.info("stopped")
            return 0
        signals.restart.clear()
        log.info("SIGHUP: restarting with a fresh discovery")
