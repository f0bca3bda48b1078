"""A DRA driver in-process on a simulated node, talked to by the stub kubelet over unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import claims, driver, kubelet, node
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import ClaimError
from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub

DRIVER = resourceslices.DRIVER
NODE = "node-a"


def claim_document(
    namespace: str,
    name: str,
    uid: str,
    results: Iterable[tuple[str, str]] | Iterable[Mapping[str, Any]],
    *,
    pool: str = NODE,
    driver_name: str = DRIVER,
) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it, allocated to ``(request, device)`` pairs."""
    entries = []
    for item in results:
        if isinstance(item, Mapping):
            entries.append({"driver": driver_name, "pool": pool, **item})
        else:
            request, device = item
            entries.append(
                {"driver": driver_name, "pool": pool, "request": request, "device": device}
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": entries}}},
    }


@dataclass
class FakeClaims:
    """A :class:`claims.ClaimSource` over claim documents kept in a dict."""

    documents: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0

    def add(self, document: dict[str, Any]) -> claims.ClaimRef:
        meta = document["metadata"]
        self.documents[(meta["namespace"], meta["name"])] = document
        return claims.ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    async def allocated_devices(self, claim: claims.ClaimRef) -> list[claims.AllocatedDevice]:
        self.reads += 1
        document = self.documents.get((claim.namespace, claim.name))
        if document is None:
            raise ClaimError(f"claim {claim.namespace}/{claim.name} not found")
        return claims.allocated_devices(claim, document)


class Crash(BaseException):
    """Stands in for the process dying at a fault point (not caught by the driver)."""


@dataclass
class Node:
    """Paths of one simulated node and its kubelet dirs (short, under /tmp)."""

    work: str
    root: str

    @property
    def registry(self) -> str:
        return os.path.join(self.work, "reg")

    @property
    def plugins(self) -> str:
        return os.path.join(self.work, "plug")

    @property
    def cdi(self) -> str:
        return os.path.join(self.work, "cdi")

    def settings(self, **overrides: Any) -> dra_config.DraConfig:
        values: dict[str, Any] = {
            "node_name": NODE,
            "root": self.root,
            "registry_dir": self.registry,
            "plugin_dir": self.plugins,
            "cdi_dir": self.cdi,
            "health_interval": 0.2,
            "publish": False,
        }
        values.update(overrides)
        return dra_config.DraConfig(**values)


@contextlib.contextmanager
def simulated_node(topology: str = "vendor-8card") -> Any:
    """A simulated node under a fresh short temporary dir, removed afterwards."""
    work = tempfile.mkdtemp(prefix="dra-", dir="/tmp")
    try:
        root = os.path.join(work, "n")
        simulate.create(root, topofile.load(topology))
        yield Node(work, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def make_driver(
    where: Node,
    source: claims.ClaimSource,
    settings: dra_config.DraConfig | None = None,
    fault: Callable[[str], None] | None = None,
) -> tuple[driver.Driver, node.NodeDevices]:
    """A driver on the node, recovered from its checkpoint as at a start."""
    settings = settings or where.settings()
    devices = node.for_settings(settings, defer_drs=True)  # as the driver's main does
    prepare = driver.Driver(
        node_name=settings.node_name,
        devices=devices,
        source=source,
        cdi_dir=settings.cdi_dir,
        state_dir=settings.data_dir,
        fault=fault,
    )
    prepare.recover()
    return prepare, devices


@dataclass
class Running:
    """A running driver, its kubelet plugin and the stub kubelet."""

    driver: driver.Driver
    devices: node.NodeDevices
    plugin: kubelet.KubeletPlugin
    kubelet: DraKubeletStub


@contextlib.asynccontextmanager
async def running(
    where: Node,
    source: claims.ClaimSource,
    *,
    settings: dra_config.DraConfig | None = None,
    known_services: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    watch_health: bool = False,
) -> AsyncIterator[Running]:
    """Start the driver's servers and the stub kubelet; stop both afterwards."""
    settings = settings or where.settings()
    prepare, devices = make_driver(where, source, settings)
    plugin = kubelet.KubeletPlugin(settings, prepare, devices)
    stub = DraKubeletStub(where.registry, known_services=known_services)
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(plugin.serve_until(stop))]
    if watch_health:
        tasks.append(asyncio.ensure_future(devices.run()))
    await stub.start()
    try:
        yield Running(prepare, devices, plugin, stub)
    finally:
        await stub.stop()
        stop.set()
        for task in tasks[1:]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failures = [r for r in results if isinstance(r, Exception)]
        assert not failures, failures
