"""Simulated nodes: N Node objects kept alive as kubelets keep them, with no kubelet at all.

One asyncio agent plays the kubelet of every node it was given (Kubernetes' own scheduler,
controller manager and API server do everything else):

- **Registration and heartbeats.** Each Node is created with its status (capacity and
  allocatable of cpu, memory, pods and the node's ``enflame.com/*`` resources, the Ready
  condition, node info, an address), as a kubelet registers, so the API server's
  ``TaintNodesByCondition`` admission and the node lifecycle controller treat it as they treat a
  kubelet's node. Heartbeats are **node Leases** (``kube-node-lease``, renewed every ``renew``
  seconds, owned by the Node), the kubelet's own mechanism since 1.17; the Ready condition's
  heartbeat is refreshed every ``status_every`` seconds. A node whose heartbeats stop
  (:meth:`SimNodes.stop_heartbeats`) goes NotReady/Unknown through the real lifecycle controller;
  :meth:`SimNodes.set_ready` posts a NotReady condition as a kubelet with a broken runtime does.
- **Admission**, in the kubelet's order (pkg/kubelet: the device manager's admit handler first,
  then the predicate handler): a container asking for more devices of a resource the node
  serves than it has free is refused with ``UnexpectedAdmissionError`` and the kubelet's words
  (``Pod Allocate failed due to requested number of devices unavailable for R. Requested: n,
  Available: m, which is unexpected``); a pod that does not fit cpu, memory or pods is refused
  with ``OutOf<resource>``; a pod whose nodeSelector the node does not match with
  ``NodeAffinity``. The device IDs come from the device plugin's own code when the node has a
  :class:`PluginDevices` (GetPreferredAllocation, then Allocate, as the kubelet calls them).
- **Running.** An admitted pod becomes Running and Ready after ``start_seconds`` (its image in
  with a part in :attr:`SimNodes.never_ready_images`: Running, never Ready, its container in
  CrashLoopBackOff); a ``restartPolicy: Never`` pod Succeeds after ``run_seconds`` (annotation
  ``sim.enflame.com/run-seconds``), or Fails with the exit code of the annotation
  ``sim.enflame.com/exit-code`` or when its node is in :attr:`SimNodes.failing_nodes`.
- **Deletion** honours the grace period: a pod marked for deletion is removed (a final delete
  with grace 0, as the kubelet does once its containers stopped) after ``termination_seconds``
  (its containers stop that fast), never later than its ``deletionGracePeriodSeconds``.
- **Node state**, where a node has a :class:`PluginDevices`: the device plugin's own writer
  (``device_plugin.node_annotation.NodeAnnotator``) fed with the holdings the plugin would read
  from PodResources, on the plugin's cadence (every ``holdings_every`` seconds and
  ``holdings_feed.AFTER_ALLOCATE`` after each admission).

Control for tests is through methods of :class:`SimNodes`; counters of every write it made are
in :attr:`SimNodes.writes`. The agent talks to the API server with one set of credentials
(the harness's admin); the Node authorizer's per-node rules are the cluster tier's to test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx2

log = logging.getLogger(__name__)
Obj = dict[str, Any]
KUBELET_VERSION = "v1.20.2"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's default nodeLeaseDurationSeconds
RUN_SECONDS = "sim.enflame.com/run-seconds"
EXIT_CODE = "sim.enflame.com/exit-code"
GROUP_PREFIX = "enflame.com/"


def now_text(clock: Callable[[], float] = time.time) -> str:
    """An RFC 3339 time (seconds), as metav1.Time is written."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))


def micro_text(clock: Callable[[], float] = time.time) -> str:
    """An RFC 3339 time with microseconds (metav1.MicroTime, a Lease's renewTime)."""
    moment = clock()
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1e6):06d}Z"
    )


def quantity(text: str | int) -> int:
    """A Kubernetes quantity as an integer in its base unit (cpu: millicores, 'm' suffix)."""
    value = str(text)
    suffixes = {
        "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
        "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    }  # fmt: skip
    for suffix, factor in suffixes.items():
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * factor)
    return int(float(value))


def cpu_milli(text: str | int) -> int:
    """cpu as millicores ('500m' -> 500, '2' -> 2000)."""
    value = str(text)
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)


class PluginDevices:
    """One node's device-plugin resource served by the plugin's own service code.

    The kubelet's device manager calls GetPreferredAllocation with the free healthy IDs and
    then Allocate with the IDs it settled on; both go to a real ``DevicePluginService`` over a
    :class:`~enflame_gcu.device_plugin.state.PluginState` of the node's board (no gRPC
    transport: the servicer's methods are awaited directly with the kubelet's messages)."""

    def __init__(self, resource: str, service: Any, state: Any) -> None:
        self.resource = resource
        self.service = service
        self.state = state

    def healthy(self) -> list[str]:
        """The IDs the plugin advertises as Healthy."""
        return list(self.state.snapshot.healthy_ids())

    async def allocate(self, free: Sequence[str], size: int) -> tuple[str, ...]:
        """The kubelet's two calls for one container; the IDs allocated."""
        from enflame_gcu._proto import api_pb2

        preferred = await self.service.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=list(free), allocation_size=size
                    )
                ]
            ),
            _Context(),
        )
        chosen = list(preferred.container_responses[0].deviceIDs)
        if len(chosen) != size or not set(chosen) <= set(free):
            chosen = list(free[:size])  # the kubelet falls back to its own pick
        await self.service.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            ),
            _Context(),
        )
        return tuple(chosen)


class _Context:
    """What a servicer needs of a gRPC context when called in-process: abort raises."""

    async def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


@dataclasses.dataclass
class NodeSpec:
    """One simulated node: its name, labels, taints and what it serves."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    unschedulable: bool = False
    # Device-plugin resources: resource name -> device IDs (``enflame.com/gcu`` -> gcu0..7).
    devices: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # Other extended resources counted, not allocated by ID.
    extended: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    plugins: Mapping[str, PluginDevices] = dataclasses.field(default_factory=dict)
    node_state: Any = None  # a NodeAnnotator-like writer: set_holdings(), run()


@dataclasses.dataclass
class _Admitted:
    namespace: str
    name: str
    uid: str
    devices: dict[str, tuple[str, ...]]  # resource -> ids
    containers: dict[str, dict[str, tuple[str, ...]]]  # container -> resource -> ids
    cpu: int
    memory: int
    extended: dict[str, int]
    ended: bool = False


@dataclasses.dataclass
class _Node:
    spec: NodeSpec
    index: int = 0
    uid: str = ""
    beating: bool = True
    ready: tuple[bool, str, str] = (True, "KubeletReady", "kubelet is posting ready status")
    admitted: dict[str, _Admitted] = dataclasses.field(default_factory=dict)
    # The kubelet admits one pod at a time: two pods bound together must not both be given the
    # same free cards across the plugin's awaits.
    admitting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    unhealthy: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        spec = self.spec
        found = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
        for resource, ids in spec.devices.items():
            found[resource] = str(len(ids))
        for resource, count in spec.extended.items():
            found[resource] = str(count)
        return found

    def allocatable(self) -> dict[str, str]:
        found = self.capacity()
        for resource, ids in self.spec.devices.items():
            bad = self.unhealthy.get(resource, set())
            found[resource] = str(len([i for i in ids if i not in bad]))
        return found

    def active(self) -> list[_Admitted]:
        return [a for a in self.admitted.values() if not a.ended]


def _requests(container: Mapping[str, Any]) -> dict[str, str]:
    resources = container.get("resources") or {}
    found = dict(resources.get("limits") or {})
    found.update(resources.get("requests") or {})
    return found


def _selector_matches(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


class SimNodes:
    """The kubelet of every simulated node (see the module docstring)."""

    def __init__(
        self,
        server: str,
        *,
        ca: str,
        cert: str,
        key: str,
        renew: float = 10.0,
        status_every: float = 60.0,
        start_seconds: float = 0.3,
        run_seconds: float = 1.0,
        termination_seconds: float = 0.5,
        holdings_every: float = 5.0,
        concurrency: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.server = server
        self.tls = (ca, cert, key)
        self.renew = renew
        self.status_every = status_every
        self.start_seconds = start_seconds
        self.run_seconds = run_seconds
        self.termination_seconds = termination_seconds
        self.holdings_every = holdings_every
        self.clock = clock
        self.nodes: dict[str, _Node] = {}
        self.never_ready_images: set[str] = set()
        self.failing_nodes: set[str] = set()
        self.writes: Counter[str] = Counter()
        self.refusals: list[tuple[str, str, str]] = []  # (pod, reason, message)
        self._limit = asyncio.Semaphore(concurrency)
        self._lease_limit = asyncio.Semaphore(8)  # heartbeats never wait behind pod updates
        self._client: httpx2.AsyncClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registered = 0
        self._pod_ips = 0
        self._rng = random.Random(0)  # noqa: S311 (the phases of the plugins' reads, seeded)
        self._seen: dict[str, str] = {}  # pod uid -> "admitted" | "refused" | "done"
        self._deleting: set[str] = set()
        self._stopping = asyncio.Event()
        self.watching = asyncio.Event()

    # -- the API ----------------------------------------------------------------------------

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            import ssl

            ca, cert, key = self.tls
            context = ssl.create_default_context(cafile=ca)
            context.load_cert_chain(cert, key)
            self._client = httpx2.AsyncClient(
                base_url=self.server,
                verify=context,
                timeout=httpx2.Timeout(30.0),
                limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64),
            )
        return self._client

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        kind: str = "",
        patch: str = "merge",
        limit: asyncio.Semaphore | None = None,
    ) -> Any:
        """One request; the decoded answer (None for 404 on DELETE). Counted in writes."""
        headers = {"Content-Type": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = f"application/{patch}-patch+json"
        content = None if body is None else json.dumps(body)
        async with limit or self._limit:
            answer = await self._http().request(method, path, content=content, headers=headers)
        if method != "GET":
            self.writes[kind or f"{method} {path.rsplit('/', maxsplit=1)[-1]}"] += 1
        if answer.status_code == 404 and method == "DELETE":
            return None
        if answer.status_code >= 400:
            raise ApiFailure(method, path, answer.status_code, answer.text[:500])
        return answer.json() if answer.content else None

    # -- nodes ------------------------------------------------------------------------------

    async def add(self, specs: Iterable[NodeSpec], batch: int = 32) -> None:
        """Register the nodes (Node with status, then its Lease), ``batch`` at a time."""
        pending = list(specs)
        for start in range(0, len(pending), batch):
            await asyncio.gather(*(self._register(s) for s in pending[start : start + batch]))

    async def _register(self, spec: NodeSpec) -> None:
        self._registered += 1
        node = self.nodes[spec.name] = _Node(spec, self._registered)
        created = await self.call("POST", "/api/v1/nodes", self._node_body(node), kind="node")
        node.uid = created["metadata"]["uid"]
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": spec.name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node.uid}
                ],
            },
            "spec": {
                "holderIdentity": spec.name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": micro_text(self.clock),
            },
        }
        await self.call(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", lease,
            kind="lease",
        )  # fmt: skip
        if spec.node_state is not None:
            spec.node_state.set_holdings([])
            self._spawn(spec.node_state.run())
            self._spawn(self._holdings_loop(node))

    async def remove(self, names: Sequence[str]) -> None:
        """Forget nodes and delete their Node objects (the garbage collector takes the Leases
        they own, and the pod GC the pods bound to them)."""
        for name in names:
            node = self.nodes.pop(name, None)
            if node is not None:
                node.beating = False
        await asyncio.gather(
            *(self.call("DELETE", f"/api/v1/nodes/{name}", kind="node") for name in names)
        )

    def _node_body(self, node: _Node) -> Obj:
        spec = node.spec
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": spec.name,
                "labels": {
                    "kubernetes.io/hostname": spec.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **dict(spec.labels),
                },
            },
            "spec": {"taints": [dict(t) for t in spec.taints], "unschedulable": spec.unschedulable},
            "status": self._status(node),
        }
        return body

    def _conditions(self, node: _Node) -> list[Obj]:
        stamp = now_text(self.clock)
        ready, reason, message = node.ready
        conditions = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHasSufficient{what}",
                "message": f"kubelet has sufficient {what.lower()}",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind, what in (
                ("MemoryPressure", "Memory"), ("DiskPressure", "Disk"), ("PIDPressure", "PID"),
            )
        ]  # fmt: skip
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
        )
        return conditions

    def _status(self, node: _Node) -> Obj:
        index = node.index
        return {
            "capacity": node.capacity(),
            "allocatable": node.allocatable(),
            "conditions": self._conditions(node),
            "addresses": [
                {
                    "type": "InternalIP",
                    "address": f"10.{64 + index // 65536}.{index // 256 % 256}.{index % 256}",
                },
                {"type": "Hostname", "address": node.spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.6.20",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "kernelVersion": "6.1.0",
                "machineID": node.spec.name,
                "systemUUID": node.spec.name,
                "bootID": node.spec.name,
            },
        }

    async def post_status(self, name: str) -> None:
        """Send the node's whole status now (capacity, allocatable, conditions)."""
        node = self.nodes[name]
        await self.call(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": self._status(node)},
            kind="node-status",
        )  # fmt: skip

    async def set_ready(self, name: str, ready: bool, reason: str = "", message: str = "") -> None:
        """Post the Ready condition as a kubelet does (False: e.g. its runtime is down)."""
        self.nodes[name].ready = (
            ready,
            reason or ("KubeletReady" if ready else "KubeletNotReady"),
            message
            or ("kubelet is posting ready status" if ready else "container runtime is down"),
        )
        await self.post_status(name)

    def stop_heartbeats(self, name: str) -> None:
        """The node's kubelet is gone: no Lease renewal, no status (the lifecycle controller
        decides what happens)."""
        self.nodes[name].beating = False

    async def resume_heartbeats(self, name: str) -> None:
        """The kubelet is back: status at once, Leases again."""
        self.nodes[name].beating = True
        await self.post_status(name)
        await self._renew(self.nodes[name])

    async def set_unhealthy(self, name: str, resource: str, ids: Iterable[str]) -> None:
        """Cards the plugin reports Unhealthy (allocatable drops; held ones stay held)."""
        self.nodes[name].unhealthy[resource] = set(ids)
        await self.post_status(name)

    async def _renew(self, node: _Node) -> None:
        await self.call(
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node.spec.name}",
            {"spec": {"renewTime": micro_text(self.clock), "holderIdentity": node.spec.name}},
            kind="lease",
            limit=self._lease_limit,
        )

    async def _heartbeats(self) -> None:
        """Every node's Lease once per ``renew`` seconds (each at a phase of its own, by the
        clock, so a busy loop catches up instead of falling behind), through a semaphore of
        their own (never queued behind pod updates); the Ready heartbeat once per
        ``status_every``."""
        due: dict[str, float] = {}
        last_status = self.clock()
        while not self._stopping.is_set():
            now = time.monotonic()
            for name, node in list(self.nodes.items()):
                if not (node.beating and node.uid):
                    continue
                when = due.setdefault(name, now + self._rng.uniform(0, self.renew))
                if when <= now:
                    due[name] = now + self.renew
                    self._spawn(self._quiet(self._renew(node)))
            for name in [n for n in due if n not in self.nodes]:
                del due[name]
            if self.clock() - last_status >= self.status_every:
                last_status = self.clock()
                for name, node in list(self.nodes.items()):
                    if node.beating and node.uid:
                        self._spawn(self._quiet(self.post_status(name)))
            await asyncio.sleep(min(0.5, self.renew / 10))

    # -- pods -------------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        """Every pod bound to some node: list, then watch from the list's version; a 410 or a
        dropped stream lists again."""
        while not self._stopping.is_set():
            try:
                listed = await self.call("GET", "/api/v1/pods?fieldSelector=spec.nodeName%21%3D")
                for pod in listed.get("items") or []:
                    await self._pod_event("ADDED", pod)
                version = listed["metadata"]["resourceVersion"]
                self.watching.set()
                path = (
                    "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=300"
                    f"&fieldSelector=spec.nodeName%21%3D&resourceVersion={version}"
                )
                async with self._http().stream(
                    "GET", path, timeout=httpx2.Timeout(30.0, read=330.0)
                ) as stream:
                    if stream.status_code != 200:
                        raise ApiFailure("WATCH", path, stream.status_code, "")
                    async for line in stream.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            break  # 410 Gone and the like: list again
                        if event.get("type") != "BOOKMARK":
                            await self._pod_event(event["type"], event["object"])
            except Exception as exc:  # the watch never dies: list again
                if self._stopping.is_set():
                    return
                log.info("pod watch ended (%r); listing again", exc)
                await asyncio.sleep(0.5)

    async def _pod_event(self, kind: str, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        node = self.nodes.get(spec.get("nodeName") or "")
        if node is None:
            return
        uid = meta.get("uid", "")
        if kind == "DELETED":
            self._release(node, uid)
            self._seen.pop(uid, None)
            return
        if meta.get("deletionTimestamp"):
            if uid not in self._deleting:
                self._deleting.add(uid)
                self._spawn(self._finish_deletion(node, pod))
            return
        if uid in self._seen:
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            self._seen[uid] = "done"
            return
        self._seen[uid] = "admitting"
        self._spawn(self._admit(node, pod))

    def _release(self, node: _Node, uid: str) -> None:
        admitted = node.admitted.pop(uid, None)
        if admitted is not None and not admitted.ended:
            admitted.ended = True

    async def _admit(self, node: _Node, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
        async with node.admitting:
            refusal = await self._refusal(node, pod)
        if refusal is not None:
            reason, message = refusal
            self._seen[uid] = "refused"
            self.refusals.append((f"{namespace}/{name}", reason, message))
            await self._quiet(
                self._pod_status(namespace, name, {"phase": "Failed", "reason": reason,
                                                   "message": "Pod " + message})
            )  # fmt: skip
            return
        self._seen[uid] = "admitted"
        await asyncio.sleep(self.start_seconds)
        if uid not in node.admitted or node.admitted[uid].ended:
            return
        images = [c.get("image", "") for c in spec.get("containers") or []]
        broken = any(mark in image for image in images for mark in self.never_ready_images)
        await self._quiet(self._pod_status(namespace, name, self._running(pod, not broken)))
        if spec.get("restartPolicy") == "Never" and not broken:
            annotations = meta.get("annotations") or {}
            await asyncio.sleep(float(annotations.get(RUN_SECONDS, self.run_seconds)))
            if uid not in node.admitted or node.admitted[uid].ended:
                return
            code = int(annotations.get(EXIT_CODE, "0"))
            if node.spec.name in self.failing_nodes:
                code = code or 1
            self._release(node, uid)
            self._seen[uid] = "done"
            await self._quiet(self._pod_status(namespace, name, self._ended(pod, code)))

    async def _refusal(self, node: _Node, pod: Obj) -> tuple[str, str] | None:
        """The kubelet's admission: devices first, then resources and the node selector;
        None when the pod is admitted (its devices are then recorded as held)."""
        spec = pod["spec"]
        containers = spec.get("containers") or []
        init = spec.get("initContainers") or []
        held: dict[str, set[str]] = {}
        for other in node.active():
            for resource, ids in other.devices.items():
                held.setdefault(resource, set()).update(ids)
        granted: dict[str, dict[str, tuple[str, ...]]] = {}
        taken: dict[str, list[str]] = {}
        for container in [*init, *containers]:
            is_init = container in init
            wants = _requests(container)
            for resource, served in node.spec.devices.items():
                size = quantity(wants.get(resource, 0))
                if not size:
                    continue
                bad = node.unhealthy.get(resource, set())
                mine = [] if is_init else taken.get(resource, [])
                free = [i for i in served if i not in bad and i not in held.get(resource, set())
                        and i not in mine]  # fmt: skip
                if size > len(free):
                    return "UnexpectedAdmissionError", (
                        f"Allocate failed due to requested number of devices unavailable for "
                        f"{resource}. Requested: {size}, Available: {len(free)}, which is "
                        "unexpected"
                    )
                plugin = node.spec.plugins.get(resource)
                chosen = (
                    await plugin.allocate(free, size) if plugin is not None else tuple(free[:size])
                )
                granted.setdefault(container.get("name", ""), {})[resource] = chosen
                if not is_init:
                    taken.setdefault(resource, []).extend(chosen)
        cpu = sum(cpu_milli(_requests(c).get("cpu", 0)) for c in containers)
        memory = sum(quantity(_requests(c).get("memory", 0)) for c in containers)
        extended: Counter[str] = Counter()
        for container in containers:
            for resource, value in _requests(container).items():
                if resource in node.spec.extended:
                    extended[resource] += quantity(value)
        active = node.active()
        allocatable = node.allocatable()
        checks = [
            ("pods", 1, len(active), int(allocatable["pods"])),
            ("cpu", cpu, sum(a.cpu for a in active), cpu_milli(allocatable["cpu"])),
            ("memory", memory, sum(a.memory for a in active), quantity(allocatable["memory"])),
        ]
        for resource, count in extended.items():
            used = sum(a.extended.get(resource, 0) for a in active)
            checks.append((resource, count, used, quantity(allocatable[resource])))
        for resource, requested, used, capacity in checks:
            if requested and used + requested > capacity:
                return f"OutOf{resource}", (
                    f"Node didn't have enough resource: {resource}, requested: {requested}, "
                    f"used: {used}, capacity: {capacity}"
                )
        if spec.get("nodeSelector"):
            # The Node's labels as they are now (others label nodes too: the operator, admins).
            live = await self.call("GET", f"/api/v1/nodes/{node.spec.name}")
            labels = dict((live.get("metadata") or {}).get("labels") or {})
        else:
            labels = {}
        if not _selector_matches(spec.get("nodeSelector"), labels):
            return "NodeAffinity", "Predicate NodeAffinity failed"
        devices: dict[str, tuple[str, ...]] = {}
        for by_resource in granted.values():
            for resource, ids in by_resource.items():
                devices[resource] = tuple(dict.fromkeys([*devices.get(resource, ()), *ids]))
        node.admitted[pod["metadata"]["uid"]] = _Admitted(
            pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"],
            devices, granted, cpu, memory, dict(extended),
        )  # fmt: skip
        if node.spec.node_state is not None and devices:
            self._spawn(self._poke_holdings(node))
        return None

    def _container_statuses(
        self, pod: Obj, state: Obj, ready: bool, restarts: int = 0
    ) -> list[Obj]:
        return [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": f"sim://{c.get('image', '')}",
                "containerID": f"sim://{pod['metadata']['uid']}-{c['name']}",
                "ready": ready,
                "started": ready,
                "restartCount": restarts,
                "state": state,
            }
            for c in pod["spec"].get("containers") or []
        ]

    def _running(self, pod: Obj, ready: bool) -> Obj:
        stamp = now_text(self.clock)
        node = self.nodes[pod["spec"]["nodeName"]]
        host_ip = self._status(node)["addresses"][0]["address"]
        self._pod_ips += 1
        serial = self._pod_ips
        pod_ip = (
            host_ip
            if pod["spec"].get("hostNetwork")
            else f"10.{128 + serial // 65536 % 64}.{serial // 256 % 256}.{serial % 256}"
        )
        flag = "True" if ready else "False"
        state = (
            {"running": {"startedAt": stamp}}
            if ready
            else {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}}
        )
        return {
            "phase": "Running",
            "hostIP": host_ip,
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": stamp,
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": stamp}
                for t, s in (
                    ("Initialized", "True"),
                    ("Ready", flag),
                    ("ContainersReady", flag),
                    ("PodScheduled", "True"),
                )
            ],
            "containerStatuses": self._container_statuses(pod, state, ready, 0 if ready else 3),
        }

    def _ended(self, pod: Obj, code: int) -> Obj:
        stamp = now_text(self.clock)
        reason = "Completed" if code == 0 else "Error"
        state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": stamp,
                                "finishedAt": stamp}}  # fmt: skip
        return {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "lastTransitionTime": stamp,
                    **({"reason": "PodCompleted"} if t != "PodScheduled" else {}),
                }
                for t, s in (
                    ("Initialized", "True"),
                    ("Ready", "False"),
                    ("ContainersReady", "False"),
                    ("PodScheduled", "True"),
                )
            ],
            "containerStatuses": self._container_statuses(pod, state, False),
        }

    async def _pod_status(self, namespace: str, name: str, status: Obj) -> None:
        await self.call(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status},
            kind="pod-status",
        )  # fmt: skip

    async def _finish_deletion(self, node: _Node, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        grace = meta.get("deletionGracePeriodSeconds")
        wait = self.termination_seconds
        if grace is not None:
            wait = min(wait, float(grace))
        admitted = node.admitted.get(uid)
        if admitted is None:
            wait = 0.0  # nothing ran: the kubelet removes it at once
        await asyncio.sleep(wait)
        self._release(node, uid)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}  # fmt: skip
        with contextlib.suppress(ApiFailure):  # 409: already replaced by a new pod
            await self.call("DELETE", path, body, kind="pod-delete")
        self._deleting.discard(uid)

    # -- node state through the plugin's writer ---------------------------------------------

    def holdings(self, name: str) -> list[Any]:
        """What the kubelet's PodResources would list for the node now."""
        from enflame_gcu import holders

        node = self.nodes[name]
        found = []
        for admitted in node.active():
            for container, by_resource in admitted.containers.items():
                for resource, ids in by_resource.items():
                    found.append(
                        holders.Holding(admitted.namespace, admitted.name, container, resource, ids)
                    )
        return found

    async def _holdings_loop(self, node: _Node) -> None:
        await asyncio.sleep(self._rng.uniform(0, self.holdings_every))
        while not self._stopping.is_set():
            if node.beating:
                node.spec.node_state.set_holdings(self.holdings(node.spec.name))
            await asyncio.sleep(self.holdings_every)

    async def _poke_holdings(self, node: _Node) -> None:
        from enflame_gcu.device_plugin import holdings_feed

        await asyncio.sleep(holdings_feed.AFTER_ALLOCATE)
        node.spec.node_state.set_holdings(self.holdings(node.spec.name))

    # -- running ----------------------------------------------------------------------------

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("simulated kubelet task failed: %r", task.exception())

    async def _quiet(self, work: Any) -> None:
        try:
            await work
        except (httpx2.HTTPError, ApiFailure, OSError) as exc:
            log.info("simulated kubelet request failed: %s", exc)

    async def start(self) -> None:
        """Start the heartbeats and the pod watch (after or before :meth:`add`)."""
        self._spawn(self._heartbeats())
        self._spawn(self._watch_pods())
        await asyncio.wait_for(self.watching.wait(), 60)

    async def close(self) -> None:
        """Stop everything and close the client."""
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()


class ApiFailure(Exception):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: {status} {text}")
        self.status = status


def gcu_node(
    name: str,
    *,
    cards: int = 8,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    plugin: Callable[[str], Mapping[str, PluginDevices]] | None = None,
    node_state: Any = None,
) -> NodeSpec:
    """A GCU node of ``cards`` whole cards (``enflame.com/gcu``), labelled as the project's
    node labels do (``enflame.com/gcu.present=true``)."""
    return NodeSpec(
        name=name,
        labels={"enflame.com/gcu.present": "true", **dict(labels or {})},
        taints=taints,
        unschedulable=unschedulable,
        devices={f"{GROUP_PREFIX}gcu": [f"gcu{i}" for i in range(cards)]},
        plugins=plugin(name) if plugin is not None else {},
        node_state=node_state,
    )
