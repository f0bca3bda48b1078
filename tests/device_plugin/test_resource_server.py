"""Several resources from one process: one ResourceServer and socket each, one kubelet."""

from __future__ import annotations

import asyncio
import os
import shutil

from enflame_gcu.device_plugin import config, kubelet, runner
from enflame_gcu.testing import plugin_process
from enflame_gcu.testing.kubelet_stub import KubeletStub


def test_two_resources_register_on_their_own_sockets_and_stop_cleanly() -> None:
    work, root, plugins = plugin_process.make_node("flat-4card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)

    async def main() -> None:
        signals = kubelet.Signals()
        resource = runner.NodeResources(cfg)
        servers = [
            kubelet.ResourceServer(cfg, resource.state),
            kubelet.ResourceServer(
                cfg, resource.state, resource_name="example.com/gcu-b", socket_name="b.sock"
            ),
        ]
        async with KubeletStub(plugins) as stub:
            tasks = [asyncio.ensure_future(s.serve_until_signal(signals)) for s in servers]
            await stub.wait_for(
                lambda k: (
                    k.capacity("enflame.com/gcu") == 4 and k.capacity("example.com/gcu-b") == 4
                ),
                10,
                "both resources",
            )
            assert sorted(r.endpoint for r in stub.registrations) == ["b.sock", "enflame.sock"]
            signals.stop.set()
            assert await asyncio.gather(*tasks) == ["stop", "stop"]
        assert os.listdir(plugins) == []  # both sockets and kubelet.sock are gone

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(work)
