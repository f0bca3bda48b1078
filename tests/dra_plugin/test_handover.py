"""A node moved from the device plugin to DRA: cards device-plugin pods still hold (the kubelet's
PodResources, over real gRPC) are tainted or left out and refused by Prepare until released."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import grpc

from enflame_gcu import resourceslices
from enflame_gcu._proto import podresources_v1_pb2, podresources_v1_pb2_grpc
from enflame_gcu.dra_plugin import handover
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command, eventually

DRIVER = harness.DRIVER
HELD = resourceslices.DEVICE_PLUGIN_TAINT


class PodResources(podresources_v1_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources List: ``pods[(ns, pod)] = [(resource, ids)]``; DRA claims
    are listed in ``dynamic_resources`` as a 1.34 kubelet does."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], list[tuple[str, list[str]]]] = {}
        self.claims: dict[tuple[str, str], list[str]] = {}

    async def List(self, request: Any, context: Any) -> Any:
        answer = podresources_v1_pb2.ListPodResourcesResponse()
        for (namespace, pod), held in self.pods.items():
            container = answer.pod_resources.add(name=pod, namespace=namespace).containers.add(
                name="main"
            )
            for resource, ids in held:
                container.devices.add(resource_name=resource, device_ids=ids)
        for (namespace, pod), names in self.claims.items():
            container = answer.pod_resources.add(name=pod, namespace=namespace).containers.add(
                name="main"
            )
            dynamic = container.dynamic_resources.add(claim_name="c", claim_namespace=namespace)
            for name in names:
                dynamic.claim_resources.add(
                    driver_name=DRIVER, pool_name=harness.NODE, device_name=name
                )
        return answer

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return podresources_v1_pb2.AllocatableResourcesResponse()


@contextlib.asynccontextmanager
async def pod_resources(path: str) -> AsyncIterator[PodResources]:
    server = grpc.aio.server()
    servicer = PodResources()
    podresources_v1_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(None)


def taints(devices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {d["name"]: [t["key"] for t in d.get("taints", [])] for d in devices}


def test_cards_device_plugin_pods_hold_are_tainted_refused_and_offered_once_released() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            socket = os.path.join(where.work, "pr.sock")
            source = harness.FakeClaims()
            source.add(harness.claim_document("ml", "c", "uid-c", [("gcus", "gcu-3")]))
            async with pod_resources(socket) as kubelet_pods, harness.running(where, source) as env:
                kubelet_pods.pods[("ml", "old")] = [("enflame.com/gcu", ["gcu2", "gcu3"])]
                kubelet_pods.claims[("ml", "dra")] = ["gcu-5"]  # DRA's own: not withheld
                holdings = handover.PluginHoldings(env.devices, socket)
                assert await holdings.read_once()
                published = taints(env.devices.published())
                assert published["gcu-2"] == published["gcu-3"] == [HELD]
                assert all(published[f"gcu-{i}"] == [] for i in (0, 1, 4, 5, 6, 7))
                await env.kubelet.wait_registered(DRIVER)
                answer = await env.kubelet.prepare(DRIVER, [("ml", "c", "uid-c")])
                error = answer.claims["uid-c"].error
                assert "pod ml/old (enflame.com/gcu) holds through the device plugin" in error
                seen = env.devices.version
                del kubelet_pods.pods[("ml", "old")]  # the pod ended
                assert await holdings.read_once()
                assert env.devices.version > seen  # the publisher and health stream wake
                assert all(not t for t in taints(env.devices.published()).values())
                again = await env.kubelet.prepare(DRIVER, [("ml", "c", "uid-c")])
                assert again.claims["uid-c"].error == ""

    asyncio.run(asyncio.wait_for(main(), 60))


def test_with_omit_held_cards_are_left_out_and_a_silent_kubelet_keeps_the_last_answer() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            socket = os.path.join(where.work, "pr.sock")
            settings = where.settings(unhealthy="omit")
            async with harness.running(where, harness.FakeClaims(), settings=settings) as env:
                async with pod_resources(socket) as kubelet_pods:
                    kubelet_pods.pods[("ml", "old")] = [("enflame.com/gcu", ["gcu6"])]
                    holdings = handover.PluginHoldings(env.devices, socket)
                    assert await holdings.read_once()
                    names = [d["name"] for d in env.devices.published()]
                    assert "gcu-6" not in names and len(names) == 7
                # The kubelet's socket is gone: the last answer stays in force.
                assert not await holdings.read_once()
                assert "gcu-6" not in [d["name"] for d in env.devices.published()]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_driver_never_publishes_a_held_card_untainted() -> None:
    """The real process: its very first ResourceSlice already carries the taint."""

    async def main() -> None:
        with harness.simulated_node() as where, FakeApiServer() as fake:
            fake.add_node(harness.NODE)
            kubeconfig = fake.kubeconfig(os.path.join(where.work, "kubeconfig"))
            socket = os.path.join(where.work, "pr.sock")
            stub = DraKubeletStub(where.registry)
            async with pod_resources(socket) as kubelet_pods:
                kubelet_pods.pods[("ml", "old")] = [("enflame.com/gcu", ["gcu1"])]
                await stub.start()
                process = await asyncio.create_subprocess_exec(
                    *command(where, kubeconfig, "--pod-resources-socket", socket),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    await eventually(lambda: bool(fake.node_slices(harness.NODE)), "published")
                    first = next(e for e in fake.events if e[1] == "ADDED")[2]
                    assert taints(first["spec"]["devices"])["gcu-1"] == [HELD]
                    process.send_signal(signal.SIGTERM)
                    assert await asyncio.wait_for(process.wait(), 20) == 0
                finally:
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                    await stub.stop()

    asyncio.run(asyncio.wait_for(main(), 90))
