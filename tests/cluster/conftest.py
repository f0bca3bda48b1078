"""Fixtures of the real-cluster tier (``make e2e-cluster``; marker ``cluster``, deselected by
``make test``).

One cluster per session: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
(:mod:`tests.cluster.controlplane`), and two simulated GCU nodes (:mod:`tests.cluster.nodes`):
``gcu-node-1`` (the vendor's 8-card board) and ``gcu-node-2`` (a flat 4-card box). Every host
change goes through the kubelet tier's :class:`tests.kubelet.host.Ledger` first; the session's
finalizer undoes it and fails if the host differs from the snapshot taken before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import cluster as cluster_module
from tests.cluster.session import running_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[cluster_module.Cluster]:
    """The control plane and both nodes, Ready, with the images imported; undone after
    (tests/cluster/session.py)."""
    with running_cluster(pytest.fail, print) as ready:
        yield ready


@pytest.fixture
def clean_namespace(cluster: cluster_module.Cluster) -> Iterator[str]:
    """The guide's ``enflame`` namespace, without pods after the test. The pods are deleted and
    waited for (the kubelet frees their cards); the namespace itself stays for the next test:
    deleting it too added 6-9 s to every teardown (17-19 s against 8-11 s here)."""
    cluster.kubectl("apply", "-f", cluster.repo_file("deploy/yaml/examples/namespace.yaml"))
    try:
        yield "enflame"
    finally:
        cluster.kubectl("-n", "enflame", "delete", "pods", "--all", "--wait=true",
                        "--timeout=120s", check=False)  # fmt: skip
