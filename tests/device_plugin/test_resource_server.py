"""Several resources from one process: one ResourceServer and socket each, one kubelet."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from typing import Any

import grpc

from enflame_gcu.device_plugin import config, kubelet, runner
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub


def test_two_resources_register_on_their_own_sockets_and_stop_cleanly() -> None:
    work, root, plugins = plugin_process.make_node("flat-4card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)

    async def main() -> None:
        resource = runner.NodeResources(cfg)
        servers = [
            kubelet.ResourceServer(cfg, resource.state),
            kubelet.ResourceServer(
                cfg, resource.state, resource_name="example.com/gcu-b", socket_name="b.sock"
            ),
        ]
        async with KubeletStub(plugins) as stub:
            tasks = [asyncio.ensure_future(s.run()) for s in servers]
            await stub.wait_for(
                lambda k: (
                    k.capacity("enflame.com/gcu") == 4 and k.capacity("example.com/gcu-b") == 4
                ),
                10,
                "both resources",
            )
            assert sorted(r.endpoint for r in stub.registrations) == ["b.sock", "enflame.sock"]
            for server in servers:
                await server.close()
            await asyncio.gather(*tasks)
        assert os.listdir(plugins) == []  # both sockets and kubelet.sock are gone

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(work)


def test_socket_deleted_between_bind_and_registration_is_served_again() -> None:
    """The race behind a rare failure: the socket file exists as soon as the server binds, so a
    deletion can land before the server has noted which file is its own (or renamed it into
    place)."""
    work, root, plugins = plugin_process.make_node("flat-4card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)
    real_server = grpc.aio.server
    losses: list[str] = []

    def server_losing_its_first_socket(*args: Any, **kwargs: Any) -> Any:
        server = real_server(*args, **kwargs)
        real_start = server.start

        async def start() -> None:
            await real_start()
            if not losses:  # only the first server: a wipe deletes the file right after bind
                for name in os.listdir(plugins):
                    path = os.path.join(plugins, name)
                    if name != "kubelet.sock" and stat.S_ISSOCK(os.lstat(path).st_mode):
                        losses.append(name)
                        os.unlink(path)

        server.start = start  # type: ignore[method-assign]
        return server

    async def main() -> None:
        resource = runner.NodeResources(cfg)
        server = kubelet.ResourceServer(cfg, resource.state)
        task = asyncio.ensure_future(server.run())
        try:
            async with KubeletStub(plugins) as stub:
                await stub.wait_for(lambda k: k.capacity() == 4, 10, "registration")
        finally:
            await server.close()
            await task
        assert len(losses) == 1 and losses[0].startswith(".enflame.sock.")  # the name bound

    original = grpc.aio.server
    grpc.aio.server = server_losing_its_first_socket
    try:
        asyncio.run(main())
    finally:
        grpc.aio.server = original
        shutil.rmtree(work)
