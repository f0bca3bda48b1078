"""A stand-in for topscloud's device plugin, for the migration scenario of the kubelet tier.

What matters of the vendor's plugin for a handover (its manual, seeds 000/001): it binds
``enflame.sock`` itself (no lock of ours), registers ``enflame.com/gcu``, answers Allocate with
``ENFLAME_VISIBLE_DEVICES`` for the wrapper runtime, and does not watch its own socket. Device
IDs are ``gcu<minor>``: the assumption migrate checks against the kubelet's checkpoint.

    python -m tests.kubelet.vendor_plugin PLUGIN_DIR HOST_ROOT
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc

from enflame_gcu import devices
from enflame_gcu._proto import api_pb2, api_pb2_grpc

RESOURCE = "enflame.com/gcu"


class VendorPlugin(api_pb2_grpc.DevicePluginServicer):
    """Lists every card healthy and hands out what the kubelet picked, as env."""

    def __init__(self, ids: list[str], stop: asyncio.Event) -> None:
        self.ids = ids
        self.stop = stop

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=i, health="Healthy") for i in self.ids]
        )
        await self.stop.wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return api_pb2.PreferredAllocationResponse()

    async def Allocate(self, request: Any, context: Any) -> Any:
        answers = []
        for container in request.container_requests:
            minors = ",".join(i.removeprefix("gcu") for i in container.devices_ids)
            answers.append(
                api_pb2.ContainerAllocateResponse(envs={"ENFLAME_VISIBLE_DEVICES": minors})
            )
        return api_pb2.AllocateResponse(container_responses=answers)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


async def main(plugin_dir: str, host_root: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    ids = [card.name for card in devices.discover(host_root).cards]
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(VendorPlugin(ids, stop), server)
    server.add_insecure_port(f"unix://{os.path.join(plugin_dir, 'enflame.sock')}")
    await server.start()
    kubelet = f"unix://{os.path.join(plugin_dir, 'kubelet.sock')}"
    async with grpc.aio.insecure_channel(kubelet) as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version="v1beta1", endpoint="enflame.sock", resource_name=RESOURCE
            )
        )
    print(f"registered {len(ids)} devices", flush=True)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
