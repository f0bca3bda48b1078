"""Allocate answers per device-list strategy, against the real gRPC service in this process."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

import grpc
import pytest

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.device_plugin import config, kubelet, runner
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process

VOLUME_DIR = "/var/run/enflame-container-devices"


def allocate(ids: list[str], node_change: Any = None, **settings: Any) -> Any:
    """Serve a vendor 8-card node in-process with ``settings`` and Allocate ``ids`` once."""
    work, root, plugins = plugin_process.make_node("vendor-8card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root, **settings)

    async def main() -> Any:
        if node_change is not None:
            node_change(root)
        resource = runner.NodeResources(cfg)
        server = kubelet.ResourceServer(cfg, resource.state)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{cfg.socket_path}") as channel:
                request = api_pb2.AllocateRequest()
                request.container_requests.add(devices_ids=ids)
                answer = await api_pb2_grpc.DevicePluginStub(channel).Allocate(request, timeout=5)
                return answer.container_responses[0]
        finally:
            await server.stop()

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(work)


def summary(response: Any) -> dict[str, Any]:
    """The parts of a ContainerAllocateResponse as plain data."""
    return {
        "envs": dict(response.envs),
        "mounts": [(m.host_path, m.container_path, m.read_only) for m in response.mounts],
        "annotations": dict(response.annotations),
        "cdi": [d.name for d in response.cdi_devices],
        "specs": [(d.container_path, d.permissions) for d in response.devices],
    }


STRATEGIES = [
    pytest.param(
        ("envvar",),
        {"envs": {"ENFLAME_VISIBLE_DEVICES": "2,3"}, "mounts": [], "annotations": {}, "cdi": []},
        id="envvar",
    ),
    pytest.param(
        ("volume-mounts",),
        {
            "envs": {"ENFLAME_VISIBLE_DEVICES": VOLUME_DIR},
            "mounts": [
                ("/dev/null", f"{VOLUME_DIR}/gcu2", True),
                ("/dev/null", f"{VOLUME_DIR}/gcu3", True),
            ],
            "annotations": {},
            "cdi": [],
        },
        id="volume-mounts",
    ),
    pytest.param(
        ("cdi-annotations",),
        {
            "envs": {},
            "mounts": [],
            "annotations": {"cdi.k8s.io/enflame-gcu": "enflame.com/gcu=2,enflame.com/gcu=3"},
            "cdi": [],
        },
        id="cdi-annotations",
    ),
    pytest.param(
        ("cdi-cri",),
        {
            "envs": {},
            "mounts": [],
            "annotations": {},
            "cdi": ["enflame.com/gcu=2", "enflame.com/gcu=3"],
        },
        id="cdi-cri",
    ),
    pytest.param(
        ("envvar", "cdi-cri"),
        {
            "envs": {"ENFLAME_VISIBLE_DEVICES": "2,3"},
            "mounts": [],
            "annotations": {},
            "cdi": ["enflame.com/gcu=2", "enflame.com/gcu=3"],
        },
        id="envvar+cdi-cri",
    ),
]


@pytest.mark.parametrize(("strategies", "expected"), STRATEGIES)
def test_each_strategy_names_the_devices_its_way(
    strategies: tuple[str, ...], expected: dict[str, Any]
) -> None:
    got = summary(allocate(["gcu2", "gcu3"], device_list_strategy=strategies))
    assert got == {**expected, "specs": []}


def test_device_specs_come_with_any_strategy() -> None:
    got = summary(allocate(["gcu7"], device_list_strategy=("cdi-cri",), pass_device_specs=True))
    assert got["specs"] == [("/dev/gcu7", "rw"), ("/dev/gcuctl", "rw")]
    assert got["cdi"] == ["enflame.com/gcu=7"]


def test_missing_control_node_is_failed_precondition_not_unknown() -> None:
    # With health checks off the cards stay allocatable, but the node cannot serve them.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        allocate(
            ["gcu0"],
            node_change=lambda root: os.unlink(os.path.join(root, "dev/gcuctl")),
            pass_device_specs=True,
            disable_healthchecks=True,
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "/dev/gcuctl is missing" in (caught.value.details() or "")


def test_unplugged_card_known_only_to_discovery_is_still_checked_by_health() -> None:
    # Health is established when the resource starts: a card gone before that is unhealthy.
    work, root, plugins = plugin_process.make_node("flat-4card")
    try:
        cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)
        os.unlink(os.path.join(root, "dev/gcu1"))
        resource = runner.NodeResources(cfg)
        assert resource.state.snapshot.healthy_ids() == ["gcu0", "gcu2", "gcu3"]
        simulate.unload_driver(root)
        assert runner.NodeResources(cfg).state.snapshot.devices() == ()
    finally:
        shutil.rmtree(work)
