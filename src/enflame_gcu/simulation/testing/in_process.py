"""The plugin's gRPC service inside the test process, on a real unix socket, on its own thread.

For tests that call the plugin many times (property-based tests, input limits): no process
start-up per case, yet the same discovery, servicer, gRPC server and socket as production.
Calls go through a ``grpc.aio`` channel on the server's loop, so nothing mixes gRPC stacks.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import grpc

from enflame_gcu._proto import api_pb2_grpc
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import kubelet, runner

T = TypeVar("T")


class ThreadedPlugin:
    """One served resource of a :class:`~.runner.NodeResources`, on a background event loop."""

    def __init__(self, config: plugin_config.PluginConfig, kind: str = plugin_config.GCU) -> None:
        self.config = config
        self.kind = kind
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.server: kubelet.ResourceServer | None = None
        self._channel: Any = None
        self.stub: Any = None

    def run(self, make: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run a coroutine (made on the server's loop) and return its result."""

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    def __enter__(self) -> ThreadedPlugin:
        self._thread.start()

        async def start() -> None:
            node = runner.NodeResources(self.config)
            self.server = node.server(self.kind)
            await self.server.start()
            self._channel = grpc.aio.insecure_channel(f"unix://{self.server.socket_path}")
            self.stub = api_pb2_grpc.DevicePluginStub(self._channel)

        self.run(start)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def stop() -> None:
            if self._channel is not None:
                await self._channel.close()
            if self.server is not None:
                await self.server.stop()

        try:
            self.run(stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()


def short_plugin_dir() -> str:
    """A fresh plugin dir with a short path (unix socket paths are limited to 108 bytes)."""
    return tempfile.mkdtemp(prefix="gcu-", dir="/tmp")
