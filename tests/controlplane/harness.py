"""Kubernetes' own control plane with simulated nodes: the layer cluster behaviour is tested on.

etcd, kube-apiserver (authorization ``Node,RBAC``, the cluster tier's admission plugins),
kube-scheduler and kube-controller-manager from the cluster tier's cached build
(``scripts/e2e-build-cluster.sh``, :mod:`tests.cluster.controlplane`), no kubelet, no
containerd; the kubelets' part is played by :class:`tests.controlplane.agent.SimNodes` on its
own event loop in a background thread, so a test (or the operator it runs) uses the cluster as
it would a real one::

    with Harness.started("/tmp/work") as harness:
        harness.add([agent.gcu_node("gcu-0")])
        harness.plane.kubectl("get", "nodes")

The node lifecycle controller is tuned to the heartbeat the agent can afford: the agent renews
each node's Lease every ``renew`` seconds (the kubelet's 10 s up to a few hundred nodes; the scale
benchmark renews every 60 s at 1,000 nodes and every 240 s at 5,000, which is 21 Lease writes a
second instead of 500 on a 2-core machine) and the controller's ``--node-monitor-grace-period``
is four renewals (the kubelet's 40 s for 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from tests.cluster import controlplane
from tests.controlplane import agent

T = TypeVar("T")


class Harness:
    """A started control plane and the agent of its simulated nodes."""

    def __init__(self, plane: controlplane.ControlPlane, nodes: agent.SimNodes) -> None:
        self.plane = plane
        self.nodes = nodes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="simnodes")

    @classmethod
    @contextlib.contextmanager
    def started(
        cls,
        work: str,
        *,
        renew: float = 10.0,
        scheduler_config: dict[str, Any] | None = None,
        apiserver_args: Sequence[str] = (),
        **agent_options: Any,
    ) -> Iterator[Harness]:
        """Start everything in ``work`` (an empty directory); stop it all on exit."""
        grace = max(40, int(4 * renew))
        plane = controlplane.ControlPlane(
            controlplane.build(),
            work,
            scheduler_config=scheduler_config,
            apiserver_args=apiserver_args,
            controller_manager_args=(
                f"--node-monitor-grace-period={grace}s",
                # The DaemonSet, ReplicaSet and garbage collector controllers at a pace that
                # keeps up with thousands of objects on two cores.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ),
        )
        with plane:
            assert plane.certs is not None
            cert, key = plane.certs.path("admin.crt"), plane.certs.path("admin.key")
            nodes = agent.SimNodes(
                plane.server, ca=plane.certs.ca, cert=cert, key=key, renew=renew, **agent_options
            )
            harness = cls(plane, nodes)
            harness._thread.start()
            try:
                harness.run(nodes.start())
                yield harness
            finally:
                harness.close()

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        """Run a coroutine on the agent's loop; its result."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    def call_soon(self, action: Callable[[], Any]) -> None:
        """Run a plain callable on the agent's loop (to change its settings safely)."""
        self._loop.call_soon_threadsafe(action)

    def add(
        self, specs: Iterable[agent.NodeSpec], *, ready: bool = True, timeout: float = 600
    ) -> list[str]:
        """Register nodes (within ``timeout`` seconds: thousands take longer than the default
        on a busy machine); with ``ready``, wait until the lifecycle controller has lifted the
        not-ready taint the API server put on each (they are then schedulable)."""
        specs = list(specs)
        self.run(self.nodes.add(specs), timeout=timeout)
        names = [s.name for s in specs]
        if ready:
            self.wait(
                f"{len(names)} nodes without the not-ready taint",
                lambda: self._untainted(names),
                max(180, timeout / 4),
            )
        return names

    def _untainted(self, names: Sequence[str]) -> bool:
        wanted = set(names)
        found = self.plane.api("GET", "/api/v1/nodes")["items"]
        ready = {
            n["metadata"]["name"]
            for n in found
            if not any(
                t.get("key") == "node.kubernetes.io/not-ready"
                for t in n["spec"].get("taints") or []
            )
        }
        return wanted <= ready

    def remove(self, names: Iterable[str]) -> None:
        """Forget nodes and delete their Node objects (their Leases go with them, owned)."""
        self.run(self.nodes.remove(list(names)))

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
        """Poll ``probe`` until truthy (the control plane's pieces must stay up)."""
        return self.plane.wait(what, probe, timeout)

    def close(self) -> None:
        """Stop the agent and its loop (the control plane is stopped by :meth:`started`)."""
        with contextlib.suppress(Exception):
            self.run(self.nodes.close(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()  # its self-pipe too: nothing left for the garbage collector


def until(probe: Callable[[], Any], what: str, timeout: float = 60, every: float = 0.3) -> Any:
    """Poll ``probe`` until truthy; AssertionError naming ``what`` (and the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {value!r}"
            )
        time.sleep(every)
