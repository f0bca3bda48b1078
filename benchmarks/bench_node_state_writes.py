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


def main() -> None:
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
