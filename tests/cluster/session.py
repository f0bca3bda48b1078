"""The real-cluster tier's session as a context manager: the control plane and both simulated
nodes, Ready, with the images imported; every host change undone after, and the host compared
with the snapshot taken before. The ``cluster`` fixture (conftest.py) and the cluster tour
(tests/cluster/demo.py, ``make demo-cluster``) both use it; ``fail`` is how either reports a
problem (``pytest.fail`` for the fixture), ``say`` where the teardown line goes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

from tests.cluster import cluster as cluster_module
from tests.cluster.controlplane import ControlPlane
from tests.cluster.nodes import Binaries, ClusterNode
from tests.kubelet import host

HOW = "run `make e2e-cluster` (scripts/e2e-cluster.sh builds everything and sets the variables)"
# name, simulated board, pod subnet, node IP (on lo of the tier's private network namespace)
NODES = (
    ("gcu-node-1", "vendor-8card", "10.88.1.0/24", "10.99.0.1"),
    ("gcu-node-2", "flat-4card", "10.88.2.0/24", "10.99.0.2"),
)
Fail = Callable[[str], NoReturn]


def env(name: str, fail: Fail, how: str = HOW) -> str:
    value = os.environ.get(name)
    if not value:
        fail(f"{name} is not set: {how}")
    return value


def preflight(fail: Fail) -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("the real-cluster tier must run as root")
    if os.path.exists(host.KUBELET_ROOT):
        problems.append(f"{host.KUBELET_ROOT} exists: this looks like a Kubernetes node")
    if host.gcu_dev_nodes():
        problems.append(f"this host has GCU device nodes {host.gcu_dev_nodes()}")
    if os.environ.get("ENFLAME_E2E_NETNS") != "private":
        problems.append("not in a private network namespace (scripts/e2e-cluster.sh makes one)")
    if problems:
        fail("refusing to run the real-cluster tier here: " + "; ".join(problems))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_cluster(
    fail: Fail, say: Callable[[str], None] = print, how: str = HOW
) -> Iterator[cluster_module.Cluster]:
    """The control plane and both nodes, Ready, with the images imported; undone after."""
    cluster_dir = env(cluster_module.CLUSTER_DIR_ENV, fail, how)
    kubelet_dir = env("ENFLAME_E2E_KUBELET_DIR", fail, how)
    images = env(cluster_module.IMAGES_ENV, fail, how)
    binaries = Binaries(
        kubelet=os.path.join(kubelet_dir, "bin", "kubelet"),
        pause=os.path.join(kubelet_dir, "bin", "pause"),
        cni_dir=os.path.join(cluster_dir, "cni"),
        containerd=shutil.which("containerd") or "/usr/bin/containerd",
        ctr=shutil.which("ctr") or "/usr/bin/ctr",
        runc=shutil.which("runc") or "/usr/sbin/runc",
        busybox=shutil.which("busybox") or "/bin/busybox",
    )
    archives = sorted(
        os.path.join(images, name) for name in os.listdir(images) if name.endswith(".tar")
    )
    for line in host.recover():
        say(f"recovered from a previous run: {line}")
    preflight(fail)
    before = host.snapshot()
    os.makedirs(host.cache_dir(), exist_ok=True)
    with open(host.snapshot_path(), "w", encoding="utf-8") as handle:
        json.dump(before, handle, indent=1)
    ledger = host.Ledger(host.ledger_path())
    ledger.begin()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    plane: ControlPlane | None = None
    nodes: list[ClusterNode] = []
    try:
        work = ledger.private_dir(tempfile.mkdtemp(prefix="enf-cl-", dir="/tmp"))
        ledger.cgroup_name = f"enflame-e2e-{os.getpid()}"
        ledger.save()
        plane = ControlPlane(cluster_dir, os.path.join(work, "cp"), on_start=ledger.started)
        plane.start()
        ready_plane = plane

        def add_node(
            name: str, topology: str, subnet: str, node_ip: str, layout: str = "stock"
        ) -> ClusterNode:
            node = ClusterNode(
                ready_plane,
                ledger,
                binaries,
                os.path.join(work, name),
                name,
                topology=topology,
                subnet=subnet,
                node_ip=node_ip,
                layout=layout,
                cgroup_root=f"/{ledger.cgroup_name}/{name}",
            )
            os.makedirs(node.work)
            nodes.append(node)
            node.up(archives)
            return node

        for name, topology, subnet, node_ip in NODES:
            add_node(name, topology, subnet, node_ip)
        yield cluster_module.Cluster(plane, nodes, work, add_node)
    finally:
        for node in reversed(nodes):
            node.stop()
        if plane is not None:
            plane.stop()
        done = ledger.restore()
        signal.signal(signal.SIGTERM, previous)
        left = host.differences(before, host.snapshot())
        say(f"\nreal-cluster tier teardown: {len(done)} undo steps; host differences: {left}")
        if left:
            fail(f"the host is not as it was before the run: {left}")
