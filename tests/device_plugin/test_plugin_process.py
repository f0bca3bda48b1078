"""The plugin as its own process against the stub kubelet over real unix sockets: every RPC."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub

Scenario = Callable[[plugin_process.RunningNode], Awaitable[None]]


def run_on_node(scenario: Scenario, topology: str = "vendor-8card", args: Any = ()) -> None:
    """Run a scenario against a registered plugin process on a fresh simulated node."""

    async def main() -> None:
        async with plugin_process.running_node(topology, args) as node:
            await scenario(node)

    asyncio.run(main())


def stub(node: plugin_process.RunningNode) -> Any:
    """The kubelet's client stub of the registered plugin."""
    return node.kubelet.plugins["enflame.com/gcu"].stub


def test_registration_carries_v1beta1_endpoint_resource_and_options() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        [registration] = node.kubelet.registrations
        assert registration.resource_name == "enflame.com/gcu"
        assert registration.endpoint == "enflame.sock"
        options = node.kubelet.plugins["enflame.com/gcu"].options
        assert options.get_preferred_allocation_available is True
        assert options.pre_start_required is False
        direct = await stub(node).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        assert direct == options

    run_on_node(scenario)


def test_list_and_watch_lists_every_card_healthy_with_its_numa_node() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        assert kubelet.devices() == {f"gcu{i}": "Healthy" for i in range(8)}
        numa = kubelet.plugins["enflame.com/gcu"].numa
        assert numa == {f"gcu{i}": (0,) if i < 4 else (1,) for i in range(8)}
        assert kubelet.capacity() == 8
        assert len(kubelet.allocatable()) == 8

    run_on_node(scenario)


def test_vendor_manual_scenario_two_pods_get_gcu0_gcu1_then_gcu4_gcu5() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        pod1 = await node.kubelet.allocate_pod("pod1", {"main": 2})
        assert pod1["main"].device_ids == ("gcu0", "gcu1")
        assert pod1["main"].asked_preference
        assert dict(pod1["main"].response.envs) == {"ENFLAME_VISIBLE_DEVICES": "0,1"}
        assert list(pod1["main"].response.devices) == []  # no --pass-device-specs
        pod2 = await node.kubelet.allocate_pod("pod2", {"main": 2})
        assert pod2["main"].device_ids == ("gcu4", "gcu5")
        assert dict(pod2["main"].response.envs) == {"ENFLAME_VISIBLE_DEVICES": "4,5"}
        node.kubelet.delete_pod("pod1")
        pod3 = await node.kubelet.allocate_pod("pod3", {"main": 2})
        assert pod3["main"].device_ids == ("gcu0", "gcu1")

    run_on_node(scenario)


def test_four_of_eight_stay_under_one_root_port_and_all_eight_need_no_preference() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        four = await node.kubelet.allocate_pod("four", {"main": 4})
        assert four["main"].device_ids == ("gcu0", "gcu1", "gcu2", "gcu3")
        rest = await node.kubelet.allocate_pod("rest", {"main": 4})
        assert rest["main"].device_ids == ("gcu4", "gcu5", "gcu6", "gcu7")
        # Exactly as many free as asked: the kubelet has no choice and does not ask.
        assert not rest["main"].asked_preference

    run_on_node(scenario)


def test_multi_container_pod_gets_disjoint_close_sets() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        pod = await node.kubelet.allocate_pod("pod", {"a": 2, "b": 2, "c": 1})
        assert pod["a"].device_ids == ("gcu0", "gcu1")
        assert pod["b"].device_ids == ("gcu4", "gcu5")
        assert pod["c"].device_ids == ("gcu2",)

    run_on_node(scenario)


def test_sixteen_card_box_keeps_requests_inside_one_switch_and_socket() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        assert node.kubelet.capacity() == 16
        first = await node.kubelet.allocate_pod("p1", {"main": 4})
        assert first["main"].device_ids == ("gcu0", "gcu1", "gcu2", "gcu3")
        second = await node.kubelet.allocate_pod("p2", {"main": 2})
        assert second["main"].device_ids == ("gcu4", "gcu5")
        big = await node.kubelet.allocate_pod("p3", {"main": 8})
        assert big["main"].device_ids == tuple(f"gcu{i}" for i in range(8, 16))

    run_on_node(scenario, "2socket-16card")


def test_preferred_allocation_honours_must_include_and_answers_each_container() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        request = api_pb2.PreferredAllocationRequest()
        everything = [f"gcu{i}" for i in range(8)]
        request.container_requests.add(
            available_deviceIDs=everything, must_include_deviceIDs=["gcu5"], allocation_size=2
        )
        request.container_requests.add(
            available_deviceIDs=["gcu2", "gcu3", "gcu6", "gcu7"], allocation_size=2
        )
        request.container_requests.add(available_deviceIDs=everything, allocation_size=4)
        answer = await stub(node).GetPreferredAllocation(request, timeout=5)
        got = [list(r.deviceIDs) for r in answer.container_responses]
        assert got == [["gcu4", "gcu5"], ["gcu2", "gcu3"], ["gcu0", "gcu1", "gcu2", "gcu3"]]

    run_on_node(scenario)


def test_allocate_answers_several_containers_and_pre_start_is_empty() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu3"])
        request.container_requests.add(devices_ids=["gcu6", "gcu7"])
        answer = await stub(node).Allocate(request, timeout=5)
        envs = [dict(r.envs) for r in answer.container_responses]
        assert envs == [{"ENFLAME_VISIBLE_DEVICES": "3"}, {"ENFLAME_VISIBLE_DEVICES": "6,7"}]
        pre = api_pb2.PreStartContainerRequest(devices_ids=["gcu3"])
        assert await stub(node).PreStartContainer(pre, timeout=5) == (
            api_pb2.PreStartContainerResponse()
        )

    run_on_node(scenario)


def test_pass_device_specs_returns_each_gcu_node_and_gcuctl_rw() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        pod = await node.kubelet.allocate_pod("pod", {"main": 2})
        specs = [
            (d.container_path, d.host_path, d.permissions) for d in pod["main"].response.devices
        ]
        assert specs == [
            ("/dev/gcu0", "/dev/gcu0", "rw"),
            ("/dev/gcu1", "/dev/gcu1", "rw"),
            ("/dev/gcuctl", "/dev/gcuctl", "rw"),
        ]

    run_on_node(scenario, args=["--pass-device-specs"])


BAD_ALLOCATIONS = [
    pytest.param(["gcu9"], ["unknown device(s) gcu9", "healthy devices: gcu0, gcu1"], id="unknown"),
    pytest.param(["gcu1", "gcu1"], ["repeated device(s) gcu1", "gcu7"], id="duplicate"),
    pytest.param([], ["no device IDs requested", "healthy devices: gcu0"], id="empty"),
    pytest.param(["gcu0", "vgcu1", "x"], ["unknown device(s) vgcu1, x"], id="several-unknown"),
]


@pytest.mark.parametrize(("ids", "phrases"), BAD_ALLOCATIONS)
def test_bad_allocate_is_invalid_argument_naming_bad_and_valid_ids(
    ids: list[str], phrases: list[str]
) -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu2"])  # fine, but all or nothing
        request.container_requests.add(devices_ids=ids)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub(node).Allocate(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert "container request 1" in details
        for phrase in phrases:
            assert phrase in details

    run_on_node(scenario)


BAD_PREFERENCES = [
    pytest.param(["gcu0", "gcu12"], [], 1, "unknown device(s) gcu12", id="unknown-available"),
    pytest.param(["gcu0", "gcu1"], ["gcu5"], 2, "gcu5 are not in the available", id="must-out"),
    pytest.param(["gcu0", "gcu1"], [], 3, "only 2 are available", id="too-many"),
    pytest.param(["gcu0", "gcu1"], [], 0, "at least 1", id="zero"),
    pytest.param(["gcu0", "gcu0"], [], 1, "repeats gcu0", id="duplicate"),
]


@pytest.mark.parametrize(("available", "must", "size", "phrase"), BAD_PREFERENCES)
def test_bad_preferred_allocation_is_invalid_argument(
    available: list[str], must: list[str], size: int, phrase: str
) -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        request = api_pb2.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub(node).GetPreferredAllocation(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert phrase in (caught.value.details() or "")

    run_on_node(scenario)


def test_plugin_started_before_the_kubelet_waits_logs_once_and_registers() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        plugin = plugin_process.PluginProcess(plugins, root)
        await plugin.start()
        try:
            # Our socket appearing proves the plugin serves before any kubelet exists.
            for _ in range(200):
                if os.path.exists(os.path.join(plugins, "enflame.sock")):
                    break
                await asyncio.sleep(0.025)
            await asyncio.sleep(0.5)  # let it retry a few times against nothing
            async with KubeletStub(plugins) as kubelet:
                await kubelet.wait_for(lambda k: k.capacity() == 4, 10, "registration")
            assert plugin.log_text().count("cannot register with the kubelet yet") == 1
        finally:
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())
