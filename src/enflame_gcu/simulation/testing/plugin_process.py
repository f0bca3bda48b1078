"""Run ``enflame-device-plugin`` as its own process on a simulated node, for tests and demos."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from enflame_gcu.simulation import efmlsim, simulate, topofile
from enflame_gcu.simulation.testing import kubelet_stub


def make_node(topology_name: str = "vendor-8card") -> tuple[str, str, str]:
    """A fresh simulated node under a short /tmp dir: ``(work dir, host root, plugin dir)``.

    Short paths keep the socket path under the 108-byte unix socket limit.
    """
    work = tempfile.mkdtemp(prefix="gcu-", dir="/tmp")
    root = os.path.join(work, "n")
    plugins = os.path.join(work, "p")
    simulate.create(root, topofile.load(topology_name))
    os.makedirs(plugins)
    return work, root, plugins


class PluginProcess:
    """One plugin process; its log goes to a file next to the plugin dir."""

    def __init__(
        self,
        plugin_dir: str,
        host_root: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.host_root = host_root
        self.args = list(args)
        self.env = dict(env or {})
        self.log_path = os.path.join(os.path.dirname(plugin_dir), "plugin.log")
        # Runs the plugin through another command (e.g. unshare for a private read-only mount).
        self.wrapper: list[str] = []
        self.process: asyncio.subprocess.Process | None = None

    @property
    def command(self) -> list[str]:
        """The command line used."""
        return [
            *self.wrapper,
            sys.executable,
            "-m",
            "enflame_gcu.device_plugin.main",
            "--plugin-dir",
            self.plugin_dir,
            "--host-root",
            self.host_root,
            *self.args,
        ]

    async def start(self) -> None:
        """Start the process (it does not wait for registration)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log_file:
            self.process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
            )

    def _running(self) -> asyncio.subprocess.Process:
        if self.process is None:
            raise RuntimeError("the plugin process was not started")
        return self.process

    def send(self, signum: int) -> None:
        """Send a signal."""
        self._running().send_signal(signum)

    async def wait(self, timeout: float) -> int:
        """Wait for the exit status; TimeoutError if it keeps running."""
        return await asyncio.wait_for(self._running().wait(), timeout)

    async def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in ``timeout`` seconds."""
        if self.process is None:
            return 0
        if self.process.returncode is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return await self.wait(timeout)
        except asyncio.TimeoutError:
            self.process.kill()
            return await self.process.wait()

    def log_text(self) -> str:
        """Everything the plugin logged so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""


@dataclass(slots=True)
class RunningNode:
    """A simulated node with a stub kubelet and a registered plugin process."""

    work: str
    root: str
    plugin_dir: str
    kubelet: kubelet_stub.KubeletStub
    plugin: PluginProcess
    pod_resources_socket: str | None = None

    @property
    def socket_path(self) -> str:
        """The plugin's socket."""
        return os.path.join(self.plugin_dir, "enflame.sock")


@contextlib.asynccontextmanager
async def running_node(
    topology_name: str = "vendor-8card",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    wait_registered: bool = True,
    timeout: float = 15.0,
    pod_resources: bool = False,
    allocatable_api: bool = True,
    efml: bool = False,
    setup: Callable[[str], Sequence[str]] | None = None,
) -> AsyncIterator[RunningNode]:
    """Simulated node + stub kubelet + plugin process; everything is torn down on exit.

    With ``pod_resources`` the stub also serves PodResources (``allocatable_api=False``: as a
    1.20 kubelet) and the plugin is pointed at it with ``--pod-resources-socket``. With
    ``efml`` the simulated libefml is built into the node (``<root>/usr/lib/libefml.so``).
    """
    work, root, plugins = make_node(topology_name)
    if efml:
        efmlsim.install(root)
    if setup is not None:  # e.g. install the simulated efsmi; its result: more arguments
        args = [*args, *setup(root)]
    socket = os.path.join(work, "pr", "kubelet.sock") if pod_resources else None
    if socket is not None:
        args = [*args, "--pod-resources-socket", socket]
    try:
        stub = kubelet_stub.KubeletStub(
            plugins, pod_resources_socket=socket, allocatable_api=allocatable_api
        )
        async with stub as kubelet:
            plugin = PluginProcess(plugins, root, args, env)
            await plugin.start()
            try:
                if wait_registered:
                    await kubelet.wait_for(
                        lambda k: (
                            bool(k.registrations)
                            and any(p.lists_received for p in k.plugins.values())
                        ),
                        timeout,
                        "the plugin to register and list its devices",
                    )
                yield RunningNode(work, root, plugins, kubelet, plugin, socket)
            except BaseException:
                sys.stderr.write(f"--- plugin log ---\n{plugin.log_text()}\n")
                raise
            finally:
                await plugin.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
