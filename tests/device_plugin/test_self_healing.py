"""Self-healing of the plugin process: kubelet restarts, lost sockets, signals, health, driver."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub
from enflame_gcu.support import unix_sockets

Scenario = Callable[[plugin_process.RunningNode], Awaitable[None]]
# A long rescan interval: anything seen within seconds was seen through inotify.
EVENTS_ONLY = ["--health-interval", "60"]
# A new connection of its own (gRPC shares connections between channels to one address by
# default): it reaches whatever listens at the path now.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def run_on_node(
    scenario: Scenario, args: Any = (), env: Any = None, topology: str = "vendor-8card"
) -> None:
    """Run a scenario against a registered plugin process on a fresh simulated node."""

    async def main() -> None:
        async with plugin_process.running_node(topology, args, env) as node:
            await scenario(node)

    asyncio.run(main())


def health_is(card: str, health: str) -> Callable[[KubeletStub], bool]:
    """Predicate: the kubelet's latest list shows ``card`` with ``health``."""
    return lambda k: k.devices().get(card) == health


def registered(times: int) -> Callable[[KubeletStub], bool]:
    """Predicate: registered ``times`` times and the newest stream has listed healthy cards."""

    def check(k: KubeletStub) -> bool:
        plugin = k.plugins.get("enflame.com/gcu")
        return (
            len(k.registrations) >= times
            and plugin is not None
            and plugin.lists_received > 0
            and bool(k.allocatable())
        )

    return check


def test_kubelet_restart_leads_to_reregistration_and_working_allocations() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        for restart in range(2):
            await node.kubelet.restart()
            await node.kubelet.wait_for(registered(restart + 2), 10, "re-registration")
        assert os.path.exists(node.socket_path)
        assert node.kubelet.devices() == {f"gcu{i}": "Healthy" for i in range(8)}
        pod = await node.kubelet.allocate_pod("after-restart", {"main": 2})
        assert pod["main"].device_ids == ("gcu0", "gcu1")
        assert "kubelet restart" in node.plugin.log_text() or "deleted" in node.plugin.log_text()

    run_on_node(scenario)


async def served_again(path: str, timeout: float = 10.0) -> None:
    """Wait until a plugin answers GetDevicePluginOptions on a new connection to ``path``."""
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(path):
            async with grpc.aio.insecure_channel(f"unix://{path}", OWN_CONNECTION) as channel:
                try:
                    await api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                        api_pb2.Empty(), timeout=1
                    )
                    return
                except grpc.aio.AioRpcError:
                    pass
        if time.monotonic() > deadline:
            raise AssertionError(f"nobody serves {path} after {timeout} s")
        await asyncio.sleep(0.02)


async def kept_registration_and_stream(node: plugin_process.RunningNode, since: float) -> None:
    """The kubelet's one registration and stream stayed, no card dipped, Allocate works."""
    kubelet = node.kubelet
    await asyncio.sleep(0.3)  # a late stream end or re-registration would show by now
    assert kubelet.stream_ends == []
    assert len(kubelet.registrations) == 1
    assert [a for a in kubelet.history if a.at >= since and a.healthy < 8] == []
    assert kubelet.plugins["enflame.com/gcu"].stream_open
    pod = await kubelet.allocate_pod("p", {"main": 1})
    assert pod["main"].device_ids == ("gcu2",)  # one card; the free pair gcu0+gcu1 stays whole


def test_deleted_plugin_socket_is_served_again_on_the_open_stream() -> None:
    """Only the file went: the kubelet is connected still, so the path is published again and
    nothing re-registers (ending the stream would mark every card Unhealthy)."""

    async def scenario(node: plugin_process.RunningNode) -> None:
        since = time.monotonic()
        for _ in range(3):
            os.unlink(node.socket_path)
            await served_again(node.socket_path)
        await kept_registration_and_stream(node, since)
        assert "registration and stream kept" in node.plugin.log_text()

    run_on_node(scenario)


def test_a_stopping_predecessor_s_grpc_server_deleting_our_socket_by_name_ends_nothing() -> None:
    """The migration handover (issue 40): the vendor's socket was moved aside while its server
    still ran, ours serves the name now; when the vendor's server stops, gRPC unlinks the path
    it bound, by name, which is our socket by then. The kubelet must not see a stream end."""

    async def main() -> None:
        work, root, plugins = plugin_process.make_node("vendor-8card")
        path = os.path.join(plugins, "enflame.sock")
        vendor = grpc.aio.server()  # listens only: what matters is what its stop does
        vendor.add_insecure_port(f"unix://{path}")
        await vendor.start()
        os.rename(path, path + ".topscloud")  # as enflame-ctk migrate hands over
        plugin = plugin_process.PluginProcess(plugins, root, EVENTS_ONLY)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await kubelet.wait_for(registered(1), 15, "registration")
                since = time.monotonic()
                await vendor.stop(0)
                # gRPC took our file with it, and the plugin published it again (checked by its
                # log: the plugin may serve the path anew before a look at the path here).
                deadline = time.monotonic() + 10
                while "registration and stream kept" not in plugin.log_text():
                    assert time.monotonic() < deadline, plugin.log_text()[-2000:]
                    await asyncio.sleep(0.02)
                await served_again(path)
                node = plugin_process.RunningNode(work, root, plugins, kubelet, plugin)
                await kept_registration_and_stream(node, since)
        finally:
            await vendor.stop(None)
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_replaced_plugin_socket_is_served_anew_and_reregistered() -> None:
    """Another file at our path (here a dead socket) is not ours to keep: serve and register
    anew, the old server stopped first."""

    async def scenario(node: plugin_process.RunningNode) -> None:
        stale = socket.socket(socket.AF_UNIX)
        aside = node.socket_path + ".x"
        stale.bind(aside)
        stale.close()
        os.rename(aside, node.socket_path)
        await node.kubelet.wait_for(registered(2), 10, "re-registration after replacement")
        assert "was deleted or replaced" in node.plugin.log_text()
        pod = await node.kubelet.allocate_pod("p", {"main": 1})
        assert pod["main"].device_ids == ("gcu2",)

    run_on_node(scenario)


async def _log_says(node: plugin_process.RunningNode, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in node.plugin.log_text():
        assert time.monotonic() < deadline, node.plugin.log_text()[-2000:]
        await asyncio.sleep(0.05)


def test_a_directory_put_at_the_socket_path_is_named_kept_and_served_over_once_gone() -> None:
    """Hostile input on re-publication: a directory (with a file in it) put at our socket path.
    The plugin neither removes nor enters it: it says why it cannot serve and serves and
    registers again once the directory is gone."""

    async def scenario(node: plugin_process.RunningNode) -> None:
        aside = node.socket_path + ".d"
        os.mkdir(aside)
        with open(os.path.join(aside, "keep"), "w", encoding="utf-8") as handle:
            handle.write("not the plugin's")
        os.replace(node.socket_path, node.socket_path + ".gone")  # free the name
        os.rename(aside, node.socket_path)
        await _log_says(node, f"cannot remove stale {node.socket_path}: Is a directory")
        with open(os.path.join(node.socket_path, "keep"), encoding="utf-8") as handle:
            assert handle.read() == "not the plugin's"
        assert os.listdir(node.socket_path) == ["keep"]
        shutil.rmtree(node.socket_path)
        await node.kubelet.wait_for(registered(2), 20, "re-registration once the dir is gone")
        assert unix_sockets.listening(node.socket_path)
        pod = await node.kubelet.allocate_pod("p", {"main": 1})
        assert len(pod["main"].device_ids) == 1

    run_on_node(scenario)


def test_a_symlink_put_at_the_socket_path_is_replaced_never_followed() -> None:
    """Hostile input on re-publication: a symlink at our socket path to a file outside the
    plugin dir. The plugin removes the link, not what it names, and serves its own socket."""

    async def scenario(node: plugin_process.RunningNode) -> None:
        victim = os.path.join(node.work, "victim")
        with open(victim, "w", encoding="utf-8") as handle:
            handle.write("host file")
        link = node.socket_path + ".l"
        os.symlink(victim, link)
        os.rename(link, node.socket_path)
        await node.kubelet.wait_for(registered(2), 10, "re-registration after the symlink")
        with open(victim, encoding="utf-8") as handle:
            assert handle.read() == "host file"
        assert not os.path.islink(node.socket_path)
        assert unix_sockets.listening(node.socket_path)

    run_on_node(scenario)


def test_stale_socket_file_from_a_dead_instance_is_replaced() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(os.path.join(plugins, "enflame.sock"))
        stale.close()  # the file stays behind, as after a crash: bind would fail with EADDRINUSE
        plugin = plugin_process.PluginProcess(plugins, root)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await kubelet.wait_for(lambda k: k.capacity() == 4, 10, "registration")
            assert "removing stale socket" in plugin.log_text()
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_sighup_rediscovers_on_the_open_stream_without_a_gap() -> None:
    """Make-before-break: the new discovery reaches the kubelet on the stream it already has.

    Ending that stream (even after a new registration) would make a kubelet log "ListAndWatch
    ended unexpectedly" and mark every card Unhealthy and the endpoint stopped.
    """

    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        simulate.unplug(node.root, 7)
        await kubelet.wait_for(health_is("gcu7", "Unhealthy"), 5, "gcu7 unhealthy")
        since = time.monotonic()
        node.plugin.send(signal.SIGHUP)
        await kubelet.wait_for(lambda k: k.capacity() == 7, 10, "7 cards after rediscovery")
        assert "gcu7" not in kubelet.devices()
        for count in (2, 3):
            node.plugin.send(signal.SIGHUP)
            for _ in range(400):
                if node.plugin.log_text().count("SIGHUP: ") >= count:
                    break
                await asyncio.sleep(0.025)
        await asyncio.sleep(0.3)  # a late stream end or re-registration would show by now
        assert node.plugin.log_text().count("SIGHUP: ") >= 3
        assert kubelet.stream_ends == []
        assert len(kubelet.registrations) == 1
        dips = [a for a in kubelet.history if a.at >= since and a.healthy < 7]
        assert dips == [], dips
        pod = await kubelet.allocate_pod("after-sighup", {"main": 2})
        assert len(set(pod["main"].device_ids) & {f"gcu{i}" for i in range(7)}) == 2

    run_on_node(scenario)


def test_sigterm_ends_the_stream_removes_the_socket_and_exits_0_within_2s() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        plugin = node.kubelet.plugins["enflame.com/gcu"]
        assert plugin.stream_open
        started = time.monotonic()
        node.plugin.send(signal.SIGTERM)
        assert await node.plugin.wait(2.0) == 0
        assert time.monotonic() - started < 2.0
        assert not os.path.exists(node.socket_path)
        await node.kubelet.wait_for(lambda k: not plugin.stream_open, 2, "stream end")
        assert set(node.kubelet.devices().values()) == {"Unhealthy"}

    run_on_node(scenario)


def test_sigint_stops_cleanly_too() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        node.plugin.send(signal.SIGINT)
        assert await node.plugin.wait(2.0) == 0
        assert not os.path.exists(node.socket_path)

    run_on_node(scenario)


def test_unplugged_card_turns_unhealthy_at_once_and_healthy_after_replug() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        simulate.unplug(node.root, 3)
        await kubelet.wait_for(health_is("gcu3", "Unhealthy"), 3, "gcu3 unhealthy")
        assert kubelet.capacity() == 8 and len(kubelet.allocatable()) == 7
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu3"])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await kubelet.plugins["enflame.com/gcu"].stub.Allocate(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unhealthy device(s) gcu3" in (caught.value.details() or "")
        simulate.replug(node.root, 3)
        await kubelet.wait_for(health_is("gcu3", "Healthy"), 3, "gcu3 healthy again")
        pod = await kubelet.allocate_pod("p", {"main": 4})
        assert pod["main"].device_ids == ("gcu0", "gcu1", "gcu2", "gcu3")

    run_on_node(scenario, EVENTS_ONLY)


def test_driver_unload_makes_every_card_unhealthy_and_reload_heals_them() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        simulate.unload_driver(node.root)
        await node.kubelet.wait_for(
            lambda k: set(k.devices().values()) == {"Unhealthy"}, 3, "all unhealthy"
        )
        assert node.kubelet.capacity() == 8
        simulate.load_driver(node.root)
        await node.kubelet.wait_for(
            lambda k: len(k.allocatable()) == 8, 3, "all healthy after reload"
        )

    run_on_node(scenario, EVENTS_ONLY)


def test_driver_version_change_rediscovers_and_sends_the_new_list() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        simulate.unplug(node.root, 6)
        await node.kubelet.wait_for(health_is("gcu6", "Unhealthy"), 3, "gcu6 unhealthy")
        assert node.kubelet.capacity() == 8
        simulate.set_driver_version(node.root, "1.1.20240101")
        # Rediscovery under the new driver no longer lists the card that is gone.
        await node.kubelet.wait_for(lambda k: k.capacity() == 7, 3, "7 cards after upgrade")
        assert len(node.kubelet.registrations) == 1  # same registration, new list
        log = node.plugin.log_text()
        assert "driver version changed: 1.0.20230110 -> 1.1.20240101" in log

    run_on_node(scenario, EVENTS_ONLY)


def test_driver_loaded_after_start_is_discovered_without_restart() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        simulate.unload_driver(root)
        plugin = plugin_process.PluginProcess(plugins, root, EVENTS_ONLY)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await kubelet.wait_for(lambda k: bool(k.registrations), 10, "registration")
                assert kubelet.capacity() == 0
                simulate.load_driver(root)
                await kubelet.wait_for(lambda k: len(k.allocatable()) == 4, 5, "4 cards")
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_card_plugged_in_after_start_is_served_without_restart() -> None:
    """Found by the chaos run (issue 37): a plugin that (re)started while a card was unplugged
    never offered that card after it was plugged back (allocatable 7 of 8 for good)."""

    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        simulate.unplug(root, 2)
        plugin = plugin_process.PluginProcess(plugins, root, EVENTS_ONLY)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await kubelet.wait_for(lambda k: len(k.allocatable()) == 3, 10, "3 cards")
                simulate.replug(root, 2)
                await kubelet.wait_for(lambda k: len(k.allocatable()) == 4, 5, "4 cards")
                pod = await kubelet.allocate_pod("p", {"main": 4})
                assert pod["main"].device_ids == ("gcu0", "gcu1", "gcu2", "gcu3")
            assert "rediscovered after new device node(s) gcu2" in plugin.log_text()
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_fail_on_init_error_exits_1_when_no_card_is_usable() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        simulate.unload_driver(root)
        plugin = plugin_process.PluginProcess(plugins, root, ["--fail-on-init-error"])
        try:
            await plugin.start()
            assert await plugin.wait(10) == 1
            assert "no usable GCU found" in plugin.log_text()
        finally:
            await plugin.stop()
            shutil.rmtree(work)

    asyncio.run(main())


def test_disabled_healthchecks_keep_cards_healthy_as_discovered() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        simulate.unplug(node.root, 2)
        await asyncio.sleep(0.5)  # give a (wrong) health flip the chance to happen
        assert node.kubelet.devices()["gcu2"] == "Healthy"
        assert "disable_healthchecks=True" in node.plugin.log_text()

    run_on_node(
        scenario, ["--health-interval", "0.1"], {"DP_DISABLE_HEALTHCHECKS": "all"}, "flat-4card"
    )


def test_socket_deleted_while_waiting_for_the_kubelet_is_served_again() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        plugin = plugin_process.PluginProcess(plugins, root)
        path = os.path.join(plugins, "enflame.sock")
        try:
            await plugin.start()
            for _ in range(400):
                if os.path.exists(path):
                    break
                await asyncio.sleep(0.025)
            os.unlink(path)  # no kubelet yet: registration is still being retried
            # The kubelet comes up only once the plugin has noticed; started earlier, it could
            # race the plugin into the after-registration path (a different, also healing, log).
            for _ in range(400):
                if "our socket vanished before registration" in plugin.log_text():
                    break
                await asyncio.sleep(0.025)
            assert "our socket vanished before registration" in plugin.log_text()
            async with KubeletStub(plugins) as kubelet:
                await kubelet.wait_for(lambda k: k.capacity() == 4, 10, "registration")
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_card_the_runtime_would_refuse_is_advertised_unhealthy_and_not_allocated() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        numa = os.path.join(root, "sys/bus/pci/devices/0000:04:00.0/numa_node")
        with open(numa, "w") as handle:
            handle.write("garbage\n")  # discovery (and so the runtime) refuses gcu1
        plugin = plugin_process.PluginProcess(plugins, root, EVENTS_ONLY)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await kubelet.wait_for(lambda k: k.capacity() == 4, 10, "registration")
                assert kubelet.devices()["gcu1"] == "Unhealthy"
                assert kubelet.allocatable() == ["gcu0", "gcu2", "gcu3"]
                request = api_pb2.AllocateRequest()
                request.container_requests.add(devices_ids=["gcu1"])
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await kubelet.plugins["enflame.com/gcu"].stub.Allocate(request, timeout=5)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "unhealthy device(s) gcu1" in (caught.value.details() or "")
                assert (
                    "gcu1 is unhealthy: /sys/bus/pci/devices/0000:04:00.0/numa_node has "
                    "unexpected content 'garbage'" in plugin.log_text()
                )
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line]


def test_missing_plugin_dir_is_one_error_line_then_back_off_until_it_appears() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        os.rmdir(plugins)  # a wrong hostPath: nothing there
        plugin = plugin_process.PluginProcess(plugins, root, ["--log-level", "debug"])
        try:
            await plugin.start()
            await asyncio.sleep(2.5)
            text = plugin.log_text()
            assert _error_lines(text) == [line for line in text.splitlines() if " ERROR " in line]
            [error] = _error_lines(text)
            assert f"plugin dir {plugins} does not exist" in error
            assert "retrying with back-off" in error
            assert text.count("still failing") >= 2  # it did retry, quietly
            assert plugin.process is not None and plugin.process.returncode is None
            os.mkdir(plugins)  # the kubelet comes up
            async with KubeletStub(plugins) as kubelet:
                await kubelet.wait_for(lambda k: k.capacity() == 4, 10, "registration")
            assert "works again" in plugin.log_text()
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_read_only_plugin_dir_is_one_error_line_and_a_clean_exit() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        plugin = plugin_process.PluginProcess(plugins, root, ["--log-level", "debug"])
        # A read-only mount of the dir, private to the plugin (as a readOnly hostPath would be).
        remount = f"mount --bind {plugins} {plugins} && mount -o remount,bind,ro {plugins}"
        plugin.wrapper = ["unshare", "-m", "sh", "-c", f'{remount} && exec "$@"', "sh"]
        try:
            await plugin.start()
            await asyncio.sleep(2.5)
            text = plugin.log_text()
            [error] = _error_lines(text)
            assert "Read-only file system" in error and plugins in error
            assert text.count("still failing") >= 2
            assert plugin.process is not None and plugin.process.returncode is None
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_plugin_dir_that_is_a_file_is_one_error_line() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        os.rmdir(plugins)
        with open(plugins, "w") as handle:
            handle.write("not a directory\n")
        plugin = plugin_process.PluginProcess(plugins, root)
        try:
            await plugin.start()
            await asyncio.sleep(1.5)
            [error] = _error_lines(plugin.log_text())
            assert f"plugin dir {plugins} is not a directory" in error
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work, ignore_errors=True)

    asyncio.run(main())
