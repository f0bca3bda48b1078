"""migrate hands ``enflame.sock`` from a stand-in topscloud plugin to ours with no moment in
which the kubelet (its stub, over real unix sockets) has no healthy GCU (issue 40 item 1)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import grpc

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.container_toolkit import migrate, migrate_plugin
from enflame_gcu.errors import InstallError
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub

RESOURCE = "enflame.com/gcu"
CARDS = [f"gcu{i}" for i in range(8)]


class VendorPlugin(api_pb2_grpc.DevicePluginServicer):
    """A stand-in for topscloud's plugin: binds enflame.sock itself and never watches it."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.stop = asyncio.Event()

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=i, health="Healthy") for i in self.ids]
        )
        await self.stop.wait()

    # What these tests never call: the kubelet stub's view is enough.
    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the stand-in")

    async def Allocate(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the stand-in")

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the stand-in")


async def _serve_vendor(plugin_dir: str, ids: list[str]) -> tuple[Any, VendorPlugin]:
    servicer = VendorPlugin(ids)
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{os.path.join(plugin_dir, 'enflame.sock')}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{os.path.join(plugin_dir, 'kubelet.sock')}") as c:
        await api_pb2_grpc.RegistrationStub(c).Register(
            api_pb2.RegisterRequest(
                version="v1beta1", endpoint="enflame.sock", resource_name=RESOURCE
            )
        )
    return server, servicer


def _checkpoint(plugin_dir: str, held: list[str], registered: list[str]) -> None:
    """The kubelet 1.20 checkpoint: a pod holding ``held`` (IDs keyed by NUMA node)."""
    data = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": "7c1f",
                    "ContainerName": "main",
                    "ResourceName": RESOURCE,
                    "DeviceIDs": {"0": held},
                    "AllocResp": "",
                }
            ],
            "RegisteredDevices": {RESOURCE: registered},
        },
        "Checksum": 0,
    }
    with open(os.path.join(plugin_dir, "kubelet_internal_checkpoint"), "w") as handle:
        json.dump(data, handle)


Seen = dict[str, Any]


def _scenario(vendor_ids: list[str], *, ours: bool) -> tuple[KubeletStub, Seen, str | None]:
    """Run the handover on a fresh node; (kubelet, what it saw right after, migrate's error)."""
    work, root, _ = plugin_process.make_node("vendor-8card")
    plugin_dir = os.path.join(root, "var/lib/kubelet/device-plugins")
    os.makedirs(plugin_dir)
    kubelet = KubeletStub(plugin_dir)
    seen: Seen = {}

    async def main() -> str | None:
        await kubelet.start()
        server, servicer = await _serve_vendor(plugin_dir, vendor_ids)
        _checkpoint(plugin_dir, vendor_ids[:2], vendor_ids)
        await kubelet.wait_for(lambda k: len(k.allocatable()) == 8, timeout=10)
        process = plugin_process.PluginProcess(plugin_dir, root)
        try:
            if ours:
                await process.start()
                for _ in range(200):  # until it stands by behind the vendor's socket
                    if migrate_plugin.inspect(root).state == "vendor-ours-waiting":
                        break
                    await asyncio.sleep(0.05)
            try:
                done = await asyncio.to_thread(migrate.run, root, handover_timeout=20)
            except InstallError as exc:
                return str(exc)
            if not ours:
                return "; ".join(done)
            await kubelet.wait_for(lambda k: len(k.registrations) == 2, timeout=10)
            await kubelet.wait_for(lambda k: k.plugins[RESOURCE].lists_received > 0, timeout=10)
            await asyncio.sleep(0.5)  # anything the switch would set off has happened by now
            seen["devices"] = kubelet.devices()
            seen["counts"] = [a.healthy for a in kubelet.history if a.resource_name == RESOURCE]
            seen["stream_ends"] = list(kubelet.stream_ends)
            seen["aside"] = os.path.exists(os.path.join(plugin_dir, "enflame.sock.topscloud"))
            return None
        finally:
            await process.stop()
            servicer.stop.set()
            await server.stop(0)
            await kubelet.stop()

    try:
        return kubelet, seen, asyncio.run(main())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_kubelet_switches_to_our_plugin_with_the_same_ids_and_never_sees_zero() -> None:
    kubelet, seen, error = _scenario(CARDS, ours=True)
    assert error is None
    assert [r.endpoint for r in kubelet.registrations] == ["enflame.sock", "enflame.sock"]
    assert seen["devices"] == dict.fromkeys(CARDS, "Healthy")
    # Never marked unhealthy: the vendor's stream was replaced, not ended. (The stub counts 0
    # between a registration and its first list; the real kubelet keeps the previous list
    # until the new endpoint sends one, and ignores a replaced endpoint's end: kubelet 1.20
    # devicemanager runEndpoint, `old.e == e`.)
    assert seen["stream_ends"] == []
    assert 8 in seen["counts"] and seen["counts"][-1] == 8, seen["counts"]
    assert seen["aside"]


def test_ids_the_vendor_used_that_ours_lack_stop_the_handover() -> None:
    kubelet, _, error = _scenario([str(i) for i in range(8)], ours=True)
    assert error is not None and "devices 0, 1" in error and "not handed over" in error
    assert len(kubelet.registrations) == 1


def test_without_our_plugin_standing_by_nothing_is_moved() -> None:
    kubelet, _, error = _scenario(CARDS, ours=False)
    assert error is not None and "left for later" in error and "ours is not running" in error
    assert len(kubelet.registrations) == 1


def test_ours_standing_by_is_seen_at_any_moment_not_only_while_it_looks() -> None:
    """Ours, behind a server that takes no lock, holds the lock only a moment twice a second:
    every look migrate takes (survey, then again before the move) must still find it."""
    work, root, _ = plugin_process.make_node("vendor-8card")
    plugin_dir = os.path.join(root, "var/lib/kubelet/device-plugins")
    os.makedirs(plugin_dir)
    kubelet = KubeletStub(plugin_dir)

    async def main() -> list[str]:
        await kubelet.start()
        server, servicer = await _serve_vendor(plugin_dir, CARDS)
        process = plugin_process.PluginProcess(plugin_dir, root)
        try:
            await process.start()
            for _ in range(200):
                if "does not take" in process.log_text():
                    break
                await asyncio.sleep(0.05)
            states = []
            for _ in range(6):
                states.append(migrate_plugin.inspect(root).state)
                await asyncio.sleep(0.13)  # looks at other phases of its cycle
            return states
        finally:
            await process.stop()
            servicer.stop.set()
            await server.stop(0)
            await kubelet.stop()

    try:
        states = asyncio.run(main())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert states == ["vendor-ours-waiting"] * 6, states
