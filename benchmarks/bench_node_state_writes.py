"""Node-state annotation writes per minute at steady pod churn, on the tier's real API server; JSON.

The device plugin's real writer (enflame_gcu.device_plugin.node_annotation: NodeAnnotator.run
and LightkubeNodeApi, unchanged) keeps N Node objects annotated on the cluster tier's
kube-apiserver (tests/cluster/controlplane.py, etcd + kube-apiserver only), one annotator per
node, each for a simulated 8-card node (enflame_gcu.simulation). Pods come and go on each node
at ``CHURN`` pods per minute (Poisson arrivals, exponential lifetimes of ``LIFETIME`` seconds
on average, 1 or 2 cards each when free); the plugin's PodResources feed is played as
holdings_feed.HoldingsFeed behaves: a read every ``POLL`` s (the plugin's default
--pod-resources-interval) and one ``AFTER_ALLOCATE`` s after each Allocate.

Counted by the server: an audit policy logs the writers' user only, so PATCHes per minute are
the server's count. The API server's and etcd's CPU over the window is read from /proc, with a
quiet window of the same length (no writers) before it as the baseline.

``ENFLAME_BENCH_NODES`` (default ``200``), ``ENFLAME_BENCH_CHURN`` (pods per minute per node,
default ``1``; a comma list runs each), ``ENFLAME_BENCH_SECONDS`` (window, default 180). Needs
$ENFLAME_E2E_CLUSTER_DIR, else prints why it did not run.

``ENFLAME_BENCH_MODEL=1`` (or ``--model``) runs a model instead, no API server: the plugin's real
writer (``NodeAnnotator.write_once`` with whatever ``enflame_gcu`` is imported, so the same
script measures an older tree through ``PYTHONPATH``) against a recording API, on a simulated
clock, for ``ENFLAME_BENCH_MODEL_NODES`` (default 5000) idle nodes of 8 cards (PodResources read
every ``POLL`` s, nothing changing) over ``ENFLAME_BENCH_SECONDS`` simulated seconds after the
first writes. Writes are counted by kind (Node patches, Lease creates and patches); bytes are
what each write makes the API server send to one client watching all Nodes (the whole Node
object per Node write: a representative kubelet-registered Node, ``_model_node``, plus our
annotations) and to the one client watching the node-state Leases (the whole Lease). Every
idle node's writer is the same, so ``ENFLAME_BENCH_MODEL_SAMPLE`` (default 250) of them run,
each with its own phase, and the counts are scaled to the node count.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu import devices, health, holders, node_state
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import holdings_feed, node_annotation, resources
from enflame_gcu.simulation import simulate, topofile
from tests.cluster import controlplane

WRITER_USER = "enflame-bench-device-plugin"
LIFETIME = 240.0  # seconds a pod holds its cards, on average
POLL = plugin_config.PluginConfig(host_root="/").pod_resources_interval  # the default
AFTER_ALLOCATE = holdings_feed.AFTER_ALLOCATE


def audit_policy() -> dict[str, Any]:
    """Every request of the writers' user at Metadata level, nothing else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [WRITER_USER]}, {"level": "None"}],
    }


class ChurningNode:
    """One node's pods: arrivals at ``churn`` per minute, each holding 1-2 free cards."""

    def __init__(self, name: str, cards: list[str], churn: float, rng: random.Random) -> None:
        self.name = name
        self.cards = cards
        self.churn = churn
        self.rng = rng
        self.running: dict[str, tuple[float, tuple[str, ...]]] = {}
        self.started = 0
        self.ended = 0

    def holdings(self) -> list[holders.Holding]:
        return [
            holders.Holding("bench", pod, "main", "enflame.com/gcu", ids)
            for pod, (_, ids) in sorted(self.running.items())
        ]

    def free(self) -> list[str]:
        used = {card for _, ids in self.running.values() for card in ids}
        return [c for c in self.cards if c not in used]

    def arrive(self, now: float) -> bool:
        free = self.free()
        want = self.rng.choice((1, 2))
        if len(free) < want:
            return False
        self.started += 1
        pod = f"{self.name}-p{self.started}"
        self.running[pod] = (now + self.rng.expovariate(1 / LIFETIME), tuple(free[:want]))
        return True

    def expire(self, now: float) -> None:
        for pod, (end, _) in list(self.running.items()):
            if end <= now:
                del self.running[pod]
                self.ended += 1


async def _feed(node: ChurningNode, annotator: node_annotation.NodeAnnotator, stop: float) -> None:
    """The node's pods and its PodResources feed until ``stop`` (monotonic)."""
    loop = asyncio.get_running_loop()
    next_arrival = loop.time() + node.rng.expovariate(node.churn / 60) if node.churn else stop
    next_poll = loop.time() + node.rng.uniform(0, POLL)
    poke: float | None = None
    while loop.time() < stop:
        now = loop.time()
        wake = min(next_arrival, next_poll, poke if poke is not None else stop, stop)
        await asyncio.sleep(max(0.0, wake - now))
        now = loop.time()
        node.expire(time.time())
        if now >= next_arrival:
            if node.arrive(time.time()):
                poke = now + AFTER_ALLOCATE  # HoldingsFeed.poke after an Allocate
            next_arrival = now + node.rng.expovariate(node.churn / 60)
        if now >= next_poll or (poke is not None and now >= poke):
            annotator.set_holdings(node.holdings())
            next_poll = now + POLL
            if poke is not None and now >= poke:
                poke = None


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu(cp: Any) -> float:
    return sum(_cpu(cp.processes[name].pid) for name in ("kube-apiserver", "etcd"))


def _writes(path: str, since: float, until: float) -> collections.Counter[str]:
    import datetime

    count: collections.Counter[str] = collections.Counter()
    seen = set()
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != WRITER_USER:
                continue
            at = datetime.datetime.fromisoformat(
                event["requestReceivedTimestamp"].replace("Z", "+00:00")
            ).timestamp()
            if since <= at < until and event["auditID"] not in seen:
                seen.add(event["auditID"])
                count[f"{event['verb']} {(event.get('objectRef') or {}).get('resource')}"] += 1
    return count


async def _run_writers(
    *, kubeconfig: str, root: str, nodes: int, churn: float, seconds: float, cpu: Any
) -> dict[str, Any]:
    config = plugin_config.PluginConfig(host_root=root)
    inventory = devices.discover(root)
    _, assignment = resources.build(inventory, config)
    monitor = health.HealthMonitor(root, inventory.cards, driver_version=inventory.driver_version)
    api = node_annotation.LightkubeNodeApi(kubeconfig)
    rng = random.Random(38)  # noqa: S311 - a workload model, not a secret
    annotators, churning = [], []
    cards = [card.name for card in inventory.cards]
    for i in range(nodes):
        annotator = node_annotation.NodeAnnotator(api, f"node-{i:04d}")
        annotator.set_node(inventory, monitor.report, assignment, config)
        annotators.append(annotator)
        node = ChurningNode(f"node-{i:04d}", cards, churn, random.Random(rng.random()))  # noqa: S311
        # Start at the steady state: about churn * LIFETIME / 60 pods already running.
        for _ in range(round(churn * LIFETIME / 60)):
            node.arrive(time.time())
        node.started = 0
        churning.append(node)
        annotator.set_holdings(node.holdings())
    writers = [asyncio.ensure_future(a.run()) for a in annotators]
    # First writes of every node (a plugin's start), then the measured window.
    await asyncio.sleep(10)
    loop = asyncio.get_running_loop()
    begin_writes = sum(a.writes for a in annotators)
    begin, cpu_begin = time.time(), cpu()
    feeds = [
        asyncio.ensure_future(_feed(n, a, loop.time() + seconds))
        for n, a in zip(churning, annotators, strict=True)
    ]
    await asyncio.gather(*feeds)
    end, cpu_end = time.time(), cpu()
    # Cancelled again until they end: asyncio.wait_for in Python 3.11 can swallow a
    # cancellation that lands as its inner wait completes (the writer's loop uses it).
    pending = set(writers)
    for _ in range(50):
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
        if not pending:
            break
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(api.close(), 10)
    return {
        "begin": begin,
        "end": end,
        "server_cpu_seconds": cpu_end - cpu_begin,
        "writers_still_running_after_50_cancels": len(pending),
        "writer_count": sum(a.writes for a in annotators) - begin_writes,
        "pods_started": sum(n.started for n in churning),
        "pods_ended": sum(n.ended for n in churning),
        "annotation_bytes": len((annotators[0].wanted() or {}).get(node_state.ANNOTATION) or ""),
    }


def run(nodes: int, churn: float, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="enflame-node-state-bench-") as work:
        root = os.path.join(work, "node")
        simulate.create(root, topofile.load("vendor-8card"))
        policy = os.path.join(work, "audit-policy.json")
        with open(policy, "w", encoding="utf-8") as handle:
            json.dump(audit_policy(), handle)
        audit = os.path.join(work, "audit.log")
        args = [f"--audit-policy-file={policy}", f"--audit-log-path={audit}"]
        with controlplane.ControlPlane(
            controlplane.build(),
            work,
            scheduler=False,
            controller_manager=False,
            apiserver_args=args,
        ) as cp:
            for i in range(nodes):
                cp.api("POST", "/api/v1/nodes", {"metadata": {"name": f"node-{i:04d}"}})
            assert cp.certs is not None
            cert, key = cp.certs.issue("bench-plugin", f"/O=system:masters/CN={WRITER_USER}")
            kubeconfig = os.path.join(work, "plugin.kubeconfig")
            with open(kubeconfig, "w", encoding="utf-8") as handle:
                handle.write(
                    controlplane.kubeconfig_text(cp.server, cp.certs.ca, cert, key, "plugin")
                )
            quiet = min(60.0, seconds)
            cpu = _server_cpu(cp)
            time.sleep(quiet)
            baseline = (_server_cpu(cp) - cpu) / quiet
            ours = asyncio.run(
                _run_writers(
                    kubeconfig=kubeconfig,
                    root=root,
                    nodes=nodes,
                    churn=churn,
                    seconds=seconds,
                    cpu=lambda: _server_cpu(cp),
                )
            )
            window = ours["end"] - ours["begin"]
            busy = ours["server_cpu_seconds"] / window
            counted = _writes(audit, ours["begin"], ours["end"])
            node = cp.api("GET", "/api/v1/nodes/node-0000")
    patches = sum(n for key, n in counted.items() if key.startswith("patch "))
    per_node_minute = patches * 60 / window / nodes
    return {
        "nodes": nodes,
        "churn_pods_per_minute_per_node": churn,
        "window_seconds": round(window, 1),
        "pods_started": ours["pods_started"],
        "pods_ended": ours["pods_ended"],
        "server_counted_requests": dict(counted),
        "writer_counted_writes": ours["writer_count"],
        "patches_per_minute": round(patches * 60 / window, 1),
        "patches_per_minute_per_node": round(per_node_minute, 3),
        "annotation_bytes": ours["annotation_bytes"],
        "node_object_bytes": len(json.dumps(node)),
        "apiserver_plus_etcd_cpu_percent": round(100 * busy, 1),
        "apiserver_plus_etcd_cpu_percent_quiet": round(100 * baseline, 1),
        "extrapolated_patches_per_second": {
            str(n): round(per_node_minute * n / 60, 1) for n in (200, 1000, 5000)
        },
    }


def _model_node(name: str) -> dict[str, Any]:
    """A Node as a kubelet registers it on a GCU host: NFD labels, five conditions, the image
    list (the kubelet reports up to 50), addresses and node info; about 12 KB of JSON."""
    labels = {f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in range(20)}
    labels |= {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    conditions = [
        {
            "type": kind,
            "status": "False" if kind != "Ready" else "True",
            "lastHeartbeatTime": "2026-12-01T22:00:00Z",
            "lastTransitionTime": "2026-12-01T20:00:00Z",
            "reason": f"Kubelet{kind}",
            "message": f"kubelet reports {kind}",
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "Ready")
    ]
    images = [
        {
            "names": [
                f"registry.example.com/team/image-{i}@sha256:{'0' * 64}",
                f"registry.example.com/team/image-{i}:v1.{i}",
            ],
            "sizeBytes": 100_000_000 + i,
        }
        for i in range(50)
    ]
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "enflame.com/gcu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "0" * 36,
            "resourceVersion": "123456789",
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "v1.28.0",
                "containerRuntimeVersion": "containerd://1.7",
            },
            "images": images,
        },
    }


class ModelApi:
    """A NodeApi (either generation of the writer) that keeps each object and counts what a
    watcher of all Nodes and the watcher of the node-state Leases would be sent."""

    namespace = "kube-system"

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.watch_bytes: collections.Counter[str] = collections.Counter()

    def _node(self, name: str) -> dict[str, Any]:
        return self.nodes.setdefault(name, _model_node(name))

    async def patch_annotations(self, node: str, annotations: Mapping[str, str | None]) -> None:
        found = self._node(node)
        notes = found["metadata"]["annotations"]
        for key, value in annotations.items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        self.counts["patch nodes"] += 1
        self.watch_bytes["all-Nodes watcher"] += len(json.dumps(found))

    async def node_annotations(self, node: str) -> Mapping[str, str]:
        self.counts["get nodes"] += 1
        return dict(self._node(node)["metadata"]["annotations"])

    async def patch_lease(self, name: str, patch: Mapping[str, Any]) -> bool:
        found = self.leases.get(name)
        if found is None:
            return False
        found["metadata"]["annotations"].update(patch.get("metadata", {}).get("annotations", {}))
        found["spec"].update(patch.get("spec", {}))
        self.counts["patch leases"] += 1
        self.watch_bytes["node-state Lease watcher"] += len(json.dumps(found))
        return True

    async def create_lease(self, body: Mapping[str, Any]) -> None:
        self.leases[body["metadata"]["name"]] = json.loads(json.dumps(body))
        self.counts["create leases"] += 1
        self.watch_bytes["node-state Lease watcher"] += len(json.dumps(body))

    async def delete_lease(self, name: str) -> None:
        self.leases.pop(name, None)


def model(nodes: int, sample: int, seconds: float) -> dict[str, Any]:
    """The writer's writes and watch bytes at ``nodes`` idle nodes (see the module)."""
    with tempfile.TemporaryDirectory(prefix="enflame-node-state-model-") as work:
        root = os.path.join(work, "node")
        simulate.create(root, topofile.load("vendor-8card"))
        config = plugin_config.PluginConfig(host_root=root)
        inventory = devices.discover(root)
        _, assignment = resources.build(inventory, config)
        report = health.HealthMonitor(
            root, inventory.cards, driver_version=inventory.driver_version
        ).report
    api = ModelApi()
    now = [1_800_000_000.0]
    rng = random.Random(49)  # noqa: S311 - phases of a model
    writers = []
    for i in range(sample):
        writer = node_annotation.NodeAnnotator(api, f"node-{i:04d}", clock=lambda: now[0])
        writer.set_node(inventory, report, assignment, config)
        writers.append((writer, rng.uniform(0, POLL)))

    async def play() -> tuple[collections.Counter[str], collections.Counter[str]]:
        # The first minute (every plugin's start) is not measured.
        step, start = 0.5, now[0]
        due = [start + phase for _, phase in writers]
        counted: tuple[collections.Counter[str], collections.Counter[str]] | None = None
        while now[0] < start + 60 + seconds:
            if counted is None and now[0] >= start + 60:
                counted = (collections.Counter(api.counts), collections.Counter(api.watch_bytes))
            for index, (writer, _) in enumerate(writers):
                if now[0] >= due[index]:  # the plugin's periodic read, then its write loop
                    writer.set_holdings([])
                    await writer.write_once()
                    due[index] += POLL
            now[0] += step
        assert counted is not None
        return api.counts - counted[0], api.watch_bytes - counted[1]

    writes, sent = asyncio.run(play())
    scale = nodes / sample
    per_second = {kind: round(n * scale / seconds, 2) for kind, n in sorted(writes.items())}
    per_minute = {who: round(b * scale * 60 / seconds) for who, b in sorted(sent.items())}
    lease = next(iter(api.leases.values()), None)
    node = api.nodes.get("node-0000") or _model_node("node-0000")
    return {
        "nodes": nodes,
        "simulated_writers": sample,
        "window_simulated_seconds": seconds,
        "writer_has_leases": hasattr(node_annotation.NodeApi, "patch_lease"),
        "api_writes_per_second": per_second,
        "api_writes_per_second_total": round(sum(per_second.values()), 2),
        "bytes_per_minute_to_one_watcher": per_minute,
        "node_object_bytes": len(json.dumps(node)),
        "lease_object_bytes": len(json.dumps(lease)) if lease else 0,
    }


def main() -> None:
    if os.environ.get("ENFLAME_BENCH_MODEL") or "--model" in sys.argv[1:]:
        seconds = float(os.environ.get("ENFLAME_BENCH_SECONDS", "600"))
        nodes = int(os.environ.get("ENFLAME_BENCH_MODEL_NODES", "5000"))
        sample = int(os.environ.get("ENFLAME_BENCH_MODEL_SAMPLE", "250"))
        load = os.getloadavg()[0]
        result = model(nodes, sample, seconds)
        result["load_average_before_after"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        json.dump(
            {"benchmark": "node-state-writes (model: no API server)", "runs": [result]},
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return
    if not os.environ.get(controlplane.BIN_DIR_ENV):
        reason = f"${controlplane.BIN_DIR_ENV} is not set (scripts/e2e-build-cluster.sh prints it)"
        json.dump({"benchmark": "node-state-writes", "not_run": reason}, sys.stdout)
        sys.stdout.write("\n")
        return
    nodes = int(os.environ.get("ENFLAME_BENCH_NODES", "200"))
    churns = [float(c) for c in os.environ.get("ENFLAME_BENCH_CHURN", "1").split(",") if c]
    seconds = float(os.environ.get("ENFLAME_BENCH_SECONDS", "180"))
    runs = []
    for churn in churns:
        load = os.getloadavg()[0]
        result = run(nodes, churn, seconds)
        result["load_average_before_after"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        runs.append(result)
    json.dump(
        {
            "benchmark": "node-state-writes",
            "kubernetes": "1.20 (Debian's source package)",
            "writer": "enflame_gcu.device_plugin.node_annotation (refresh 60 s, settle 0.2 s)",
            "feed": f"PodResources read every {POLL} s and {AFTER_ALLOCATE} s after an Allocate",
            "mean_pod_lifetime_seconds": LIFETIME,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "runs": runs,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
