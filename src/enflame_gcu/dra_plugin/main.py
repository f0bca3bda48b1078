"""``enflame-dra-plugin``: serve the kubelet, publish the node's ResourceSlices, stop cleanly.

``enflame-dra-plugin cleanup`` deletes the driver's ResourceSlices (one node, or every node
with ``--all-nodes``): the chart runs it when the driver is uninstalled.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from enflame_gcu import __version__, devices, fileio
from enflame_gcu.dra_plugin import (
    apiserver,
    driver,
    handover,
    kubelet,
    node,
    observability,
    publisher,
)
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import ConfigError, PathOutsideRootError
from enflame_gcu.support import aio, daemon_cli

log = logging.getLogger("enflame_gcu.dra_plugin")


async def run(settings: dra_config.DraConfig) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 without API server credentials, 1 when
    the driver cannot start or a part of it (serving the kubelet, publishing) ends or fails on
    its own."""
    devices = node.for_settings(settings, defer_drs=True)  # DRS on after the record is read
    for problem in devices.inventory.problems:
        log.warning("%s", problem)
    try:
        # Prepare reads every claim from the API server, so even --no-publish needs a client.
        client = apiserver.connect(settings.kubeconfig)
    except ConfigError as exc:
        log.error("%s; pass --kubeconfig or run in a pod with a service account token", exc)
        return 2
    api = apiserver.ApiServer(client, settings.node_name, settings.driver_name)
    exported = observability.DriverMetrics()
    exported.publishing = settings.publish
    prepare = driver.Driver(
        node_name=settings.node_name,
        devices=devices,
        source=api,
        cdi_dir=settings.cdi_dir,
        state_dir=settings.data_dir,
        # Test-only SIGKILL points (ENFLAME_TEST_KILL_AT=dra-<point>); a dict lookup otherwise.
        fault=lambda point: fileio.fault_point(f"dra-{point}"),
        metrics=exported,
    )
    try:
        prepare.recover()
    except ConfigError as exc:
        log.error("%s", exc)
        await client.close()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    plugin = kubelet.KubeletPlugin(settings, prepare, devices)
    exported.registered = plugin.registered.is_set
    http = None
    if settings.http_address:
        try:
            http = observability.start(exported, settings.http_address)
        except (ConfigError, OSError, ValueError) as exc:
            log.error("cannot serve --http-address %s: %s", settings.http_address, exc)
            await client.close()
            return 1
    holdings = None
    if settings.pod_resources_socket:
        # Before anything is published or prepared: a card a device-plugin pod holds is
        # never offered, not even for the first seconds.
        holdings = handover.PluginHoldings(devices, settings.pod_resources_socket)
        await holdings.read_once()
    tasks = [asyncio.ensure_future(plugin.serve_until(stop))]
    health = asyncio.ensure_future(devices.run())
    watch_holdings = asyncio.ensure_future(
        holdings.run() if holdings is not None else asyncio.Event().wait()
    )
    cards = asyncio.ensure_future(prepare.watch_cards())
    beat = asyncio.ensure_future(exported.heartbeat())
    if settings.publish:
        publish = publisher.Publisher(
            api,
            devices,
            settings.node_name,
            metrics=exported,
            order=settings.device_order,
            busy=prepare.held_devices,
        )
        prepare.on_change = publish.claims_changed
        tasks.append(asyncio.ensure_future(_publish_while_serving(plugin, publish, stop)))
    ended_alone = False
    try:
        # A part that ends before a stop was asked for (serving the kubelet, publishing) leaves
        # a process that looks alive but serves nothing: stop, and let the DaemonSet restart us.
        await aio.first(stop.wait(), asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED))
        ended_alone = not stop.is_set()
        if ended_alone:
            log.error("a part of the driver ended without a stop being asked for; stopping")
    finally:
        stop.set()
        health.cancel()
        cards.cancel()
        beat.cancel()
        watch_holdings.cancel()
        results = await asyncio.gather(*tasks, health, return_exceptions=True)
        await asyncio.gather(beat, cards, watch_holdings, return_exceptions=True)
        await prepare.drain()  # a call the kubelet gave up on still ends on record
        if http is not None:
            http.stop()
        await client.close()
    failures = [r for r in results if isinstance(r, Exception)]
    for failure in failures:
        log.error("stopped with an error: %r", failure)
    log.info("stopped")
    return 1 if failures or ended_alone else 0


async def _publish_while_serving(
    plugin: kubelet.KubeletPlugin, publish: publisher.Publisher, stop: asyncio.Event
) -> None:
    """Publish while this instance serves; a standby instance leaves the slices alone (the one
    serving keeps them current), neither writing nor deleting any."""
    while not stop.is_set():
        await aio.first(plugin.serving.wait(), stop.wait())
        if stop.is_set():
            return
        leave = asyncio.Event()

        async def until_standby(leave: asyncio.Event = leave) -> None:
            await aio.first(plugin.standing_by.wait(), stop.wait())
            leave.set()

        watch = asyncio.ensure_future(until_standby())
        try:
            await publish.run(leave)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if not stop.is_set():
            log.info("standing by: no longer publishing ResourceSlices")


async def _cleanup(settings: dra_config.DraConfig, every_node: bool) -> int:
    try:
        client = apiserver.connect(settings.kubeconfig)
    except ConfigError as exc:
        log.error("%s; pass --kubeconfig or run in a pod with a service account token", exc)
        return 2
    try:
        api = apiserver.ApiServer(client, settings.node_name, settings.driver_name)
        count = await api.delete_driver_slices(every_node)
    finally:
        await client.close()
    scope = "every node" if every_node else f"node {settings.node_name}"
    log.info("deleted %d ResourceSlice(s) of %s on %s", count, settings.driver_name, scope)
    return 0


def cleanup_parser() -> argparse.ArgumentParser:
    """``enflame-dra-plugin cleanup``: the driver's options and ``--all-nodes``."""
    parser = dra_config.build_parser(
        prog=f"{dra_config.PROG} cleanup",
        description="Delete the driver's ResourceSlices of this node (--node-name) or of every "
        "node (--all-nodes); the chart runs it when the driver is uninstalled.",
    )
    parser.add_argument(
        "--all-nodes", action="store_true", help="delete every node's slices of this driver"
    )
    return parser


def cleanup(argv: Sequence[str]) -> int:
    """``enflame-dra-plugin cleanup [--all-nodes] [--node-name N] [--kubeconfig F]``."""
    try:
        args = dra_config.parse_args(cleanup_parser(), argv)
        if args.all_nodes:
            args.node_name = "all-nodes"
        settings = dra_config.from_args(args)
    except ConfigError as exc:
        print(f"enflame-dra-plugin cleanup: {exc}", file=sys.stderr)
        return 2
    daemon_cli.configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(_cleanup(settings, args.all_nodes))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``enflame-dra-plugin``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["cleanup"]:
        return cleanup(args[1:])
    try:
        settings = dra_config.parse(args)
        # As cdi watch: a host root whose /sys or /dev leads out of it is refused, not read.
        fileio.require_confined(settings.root, devices.DISCOVERY_PATHS)
    except (ConfigError, PathOutsideRootError) as exc:
        print(f"enflame-dra-plugin: {exc}", file=sys.stderr)
        return 2
    daemon_cli.configure_logging(settings.log_level, settings.log_format)
    for warning in settings.deprecated_env:
        log.warning("%s", warning)
    log.info(
        "enflame-dra-plugin %s starting on node %s: root %s, registry %s, service %s, CDI %s, "
        "shared slices %d, DRS %s, unhealthy devices: %s, publish %s",
        __version__,
        settings.node_name,
        settings.root,
        settings.registration_socket,
        settings.endpoint,
        settings.cdi_dir,
        settings.shared_slices,
        settings.drs or "off",
        settings.unhealthy,
        settings.publish,
    )
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
