"""A real runc container started from a shared-gcu Allocate answer sees exactly its card.

The plugin's shared resource is served in this process over a real unix socket; its
GetPreferredAllocation and Allocate answers go through the emulated kubelet + containerd
(tests/e2e/kubelet_emulation.py) into our runtime in front of the real runc.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from typing import Any

import grpc
import pytest

from enflame_gcu import devices, naming, sharing
from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import runner
from tests.e2e import kubelet_emulation
from tests.e2e.conftest import Node, gcu_nodes

pytestmark = pytest.mark.runc


def shared_allocation(root: str, strategies: tuple[str, ...], size: int) -> tuple[list[str], Any]:
    """Serve gcu4+gcu5 as 4 slices each; ask the preferred ``size`` slices, then Allocate them."""
    plugins = tempfile.mkdtemp(prefix="gcu-", dir="/tmp")  # short: unix socket path limit
    config = plugin_config.PluginConfig(
        plugin_dir=plugins,
        host_root=root,
        resources=("gcu", "shared-gcu"),
        device_list_strategy=strategies,
        sharing=sharing.SharingSettings(slices=4),
        shared_cards=("gcu4", "gcu5"),
    )

    async def main() -> tuple[list[str], Any]:
        node = runner.NodeResources(config)
        [server] = [s for s in node.servers() if s.resource_name == "enflame.com/shared-gcu"]
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                ask = api_pb2.PreferredAllocationRequest()
                ask.container_requests.add(
                    available_deviceIDs=node.states["shared-gcu"].snapshot.healthy_ids(),
                    allocation_size=size,
                )
                preferred = await stub.GetPreferredAllocation(ask, timeout=5)
                ids = list(preferred.container_responses[0].deviceIDs)
                request = api_pb2.AllocateRequest()
                request.container_requests.add(devices_ids=ids)
                answer = await stub.Allocate(request, timeout=5)
                return ids, answer.container_responses[0]
        finally:
            await server.stop()

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(plugins)


def run_container(node: Node, response: Any, strict: bool = False) -> tuple[list[str], str]:
    """Start a container from the response; return the GCU nodes it sees and its ENFLAME env."""
    if strict:  # only the plugin's mounts count; the image's ENFLAME_VISIBLE_DEVICES=all not
        node.ignore_envvar_when_unprivileged()
    specs = [named.spec for named in cdi.build_specs(devices.discover(node.root))]

    def edit(spec: dict[str, Any]) -> None:
        kubelet_emulation.apply_response(spec, response, node.root, specs)

    bundle = node.bundle(
        ["sh", "-c", "ls /dev; echo ---; env | grep ^ENFLAME_CONTAINER | sort"],
        env=[f"{naming.VISIBLE_DEVICES_ENV}=all"] if strict else None,
        edit=edit,
    )
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    listing, _, env = result.stdout.partition(b"---")
    return gcu_nodes(listing), env.decode().strip()


def test_two_slices_of_one_card_give_that_card_once(node: Node) -> None:
    ids, response = shared_allocation(node.root, ("envvar",), 2)
    assert ids == ["gcu4-slice0", "gcu4-slice1"]  # packed: one card
    assert dict(response.envs)[naming.VISIBLE_DEVICES_ENV] == "4"
    seen, env = run_container(node, response)
    assert seen == ["gcu4", "gcuctl"]
    assert env.splitlines() == [
        f"{sharing.SUB_CARD_ENV}=true",
        f"{sharing.USABLE_PROCESSOR_ENV}=2/4",
    ]


def test_slices_over_two_cards_by_volume_mounts_beat_an_image_asking_for_all(node: Node) -> None:
    ids, response = shared_allocation(node.root, ("volume-mounts",), 5)
    assert ids == [*(f"gcu4-slice{i}" for i in range(4)), "gcu5-slice0"]
    seen, env = run_container(node, response, strict=True)
    assert seen == ["gcu4", "gcu5", "gcuctl"]
    assert f"{sharing.USABLE_PROCESSOR_ENV}=4/4,1/4" in env.splitlines()
