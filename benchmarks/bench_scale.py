"""Placement, the operator and node state at 1,000 and 5,000 simulated nodes, on Kubernetes' own
control plane (tests/controlplane: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager 1.20 from the cluster tier's build; simulated nodes, no kubelet); JSON.

Per node count, one control plane and N vendor 8-card nodes (``gcu0``-``gcu6`` whole through
the device plugin's own service code, ``gcu7`` as 6 shared slices), each publishing its node
state with the plugin's own writer on the plugin's cadence (tests/controlplane/agent.py):

- **idle node state**: for ``--idle`` seconds with nothing scheduled, the API writes a second
  the node-state writers make (to Nodes and to their Leases), and the bytes a minute one client
  watching all Nodes receives (every watch event's bytes, as a node-local agent such as flannel
  receives them); the agent's own Ready heartbeat on the Node (a kubelet's 5-minute status
  report) is held back for the whole run, so those bytes are the writers' alone;
- **prefill**: pods bound straight to nodes (a seeded pattern of 1/2/4-card pods) up to
  ``--load`` of the cards, so the measured pods meet a fragmented cluster;
- **scheduler arms**, alternating, ``--runs`` times each: ``default`` (kube-scheduler with no
  configuration: its adaptive percentageOfNodesToScore, no extender); ``chart`` (the chart's
  KubeSchedulerConfiguration as Helm renders it, with ``enflame-scheduler-extender`` as its own
  process, as the cluster's only scheduler, so every pod pays for it; the chart sets no
  percentageOfNodesToScore by default: the scheduler's adaptive sample, at 1,000 nodes about
  42 %, at 5,000 about 10 % of the nodes, never fewer than 100); ``score-all`` (``chart`` with
  ``percentageOfNodesToScore: 100``, what the chart shipped before issue 49: every feasible node
  scored and sent to the extender). Each arm creates ``--pods`` pods at once (1/2/4/8-card,
  shared-slice and non-GCU: 30/25/10/5/10/20 %), and reports pods bound a second (first create
  to last bind), p50/p99 create-to-bind per kind, pods left pending, and for multi-card pods the
  share whose cards the plugin's allocation put under one PCIe switch; then deletes them and
  waits for the nodes to publish the release;
- **operator** (``--operator``): the chart's operator as its ServiceAccount deploys the
  example resource on every node, then, converged, its API requests a minute (from the API
  server's audit log, every request of its user), its resident memory and the GcuResource's
  size.

    .venv/bin/python benchmarks/bench_scale.py [--nodes 1000,5000] [--pods 500] [--runs 3]
        [--load 0.5] [--idle 60] [--arms default,chart[,score-all]] [--operator]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_cluster
import yaml

from enflame_gcu import topology
from enflame_gcu.device_plugin import node_annotation
from enflame_gcu.device_plugin import service as plugin_service
from enflame_gcu.device_plugin import state as plugin_state
from enflame_gcu.gcu_operator import names as operator_names
from enflame_gcu.gcu_operator import resource as operator_resource
from tests.controlplane import agent, operator_env
from tests.controlplane.harness import Harness

GCU = "enflame.com/gcu"
SHARED = "enflame.com/shared-gcu"
EXTENDER_BIN = os.path.join(os.path.dirname(sys.executable), "enflame-scheduler-extender")
NODE_STATE_NAMESPACE = "kube-system"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_STATE_NAMESPACE}/leases"
QUIET = 20.0  # seconds without a binding that end an arm
MIX = ((1, 0.30), (2, 0.25), (4, 0.10), (8, 0.05), (-1, 0.10), (0, 0.20))  # cards; -1 shared


def progress(message: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p99": None, "count": 0}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": round(pick(0.5), 4), "p99": round(pick(0.99), 4), "count": len(ordered)}


class Board:
    """The vendor 8-card board, discovered once from a simulated node (all 8 cards whole, or
    with ``shared`` gcu7 as 6 shared slices); per node its own plugin state and service over
    that discovery, and its own node-state writer."""

    def __init__(self, directory: str, *, shared: bool) -> None:
        self.inventory, self.report, self.assignment, self.config = bench_cluster.vendor_node(
            directory, shared_slices=6 if shared else 0
        )
        self.whole = [card.name for card in self.assignment.whole]
        self.slices = [f"{bench_cluster.SHARED_CARD}-slice{i}" for i in range(6)] if shared else []
        self.topology = topology.Topology.from_inventory(self.inventory)

    def plugins(self, _name: str) -> dict[str, agent.PluginDevices]:
        from enflame_gcu.device_plugin import resources

        cards = [c for c in self.inventory.cards if c.name in self.whole]
        kind = resources.whole_cards(self.inventory, cards, "topology")
        health = {c.name: True for c in cards}
        state = plugin_state.PluginState(plugin_state.Snapshot(kind, health))
        service = plugin_service.DevicePluginService(state, self.config, GCU)
        return {GCU: agent.PluginDevices(GCU, service, state)}

    def writer(self, nodes: agent.SimNodes, name: str) -> node_annotation.NodeAnnotator:
        annotator = node_annotation.NodeAnnotator(_AgentNodeApi(nodes), name)
        annotator.set_node(self.inventory, self.report, self.assignment, self.config)
        return annotator

    def node(self, nodes: agent.SimNodes, name: str) -> agent.NodeSpec:
        return agent.NodeSpec(
            name=name,
            labels={"enflame.com/gcu.present": "true"},
            devices={GCU: self.whole, **({SHARED: self.slices} if self.slices else {})},
            plugins=self.plugins(name),
            node_state=self.writer(nodes, name),
        )

    def switch_local(self, ids: Sequence[str]) -> bool:
        switches = {self.topology.placement(i).switch for i in ids}
        return len(switches) == 1 and not next(iter(switches)).startswith("own:")


class _AgentNodeApi:
    """The plugin writer's NodeApi over the agent's client: its Node's annotations and its
    node-state Lease in ``namespace`` (counted as node-state writes to each)."""

    namespace = NODE_STATE_NAMESPACE

    def __init__(self, nodes: agent.SimNodes) -> None:
        self.nodes = nodes

    async def patch_annotations(self, node: str, annotations: Any) -> None:
        await self.nodes.call(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"annotations": dict(annotations)}},
            kind="node-state-node",
        )

    async def node_annotations(self, node: str) -> dict[str, str]:
        found = await self.nodes.call("GET", f"/api/v1/nodes/{node}")
        return dict(found["metadata"].get("annotations") or {})

    async def patch_lease(self, name: str, patch: Any) -> bool:
        try:
            await self.nodes.call("PATCH", f"{LEASES}/{name}", dict(patch), kind="node-state-lease")
        except agent.ApiFailure as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def create_lease(self, body: Any) -> None:
        await self.nodes.call("POST", LEASES, dict(body), kind="node-state-lease")

    async def delete_lease(self, name: str) -> None:
        await self.nodes.call("DELETE", f"{LEASES}/{name}", kind="node-state-lease")


def chart_scheduler_config(port: int, *, score_all: bool = False) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration (Helm renders it), for the cluster's own
    scheduler: its profile named default-scheduler, no leader election, the extender on
    ``port``; everything else as shipped (``score_all``: percentageOfNodesToScore 100)."""
    from tests.deploy import helm_render

    with tempfile.TemporaryDirectory(prefix="enflame-chart-") as work:
        # What the chart picks for this 1.20 control plane from .Capabilities.KubeVersion (helm
        # lint renders for another version, so the choice is given as the value it stands for).
        values = {
            "extender": {"enabled": True, "configApiVersion": "kubescheduler.config.k8s.io/v1beta1"}
        }
        rendered = helm_render.render(work, values)
    config_map = next(
        d
        for d in rendered["extender.yaml"]
        if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})
    )
    config = dict(yaml.safe_load(config_map["data"]["config.yaml"]))
    config.pop("leaderElection", None)
    if score_all:
        config["percentageOfNodesToScore"] = 100
    config["profiles"] = [{**config["profiles"][0], "schedulerName": "default-scheduler"}]
    for extender in config.get("extenders") or []:
        extender["urlPrefix"] = f"http://127.0.0.1:{port}"
    return config


def pod_body(name: str, cards: int, *, node: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if cards > 0:
        container["resources"] = {"limits": {GCU: str(cards)}}
    elif cards < 0:
        container["resources"] = {"limits": {SHARED: str(-cards)}}
    else:
        container["resources"] = {"requests": {"cpu": "100m"}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def prefill(nodes: agent.SimNodes, names: list[str], load: float, seed: int) -> int:
    """Bind 1/2/4-card pods straight to nodes until ``load`` of the whole cards are held."""
    rng = random.Random(seed)  # noqa: S311 (a seeded pattern)
    free = {n: len(nodes.nodes[n].spec.devices[GCU]) for n in names}
    target = int(load * sum(free.values()))
    bodies: list[dict[str, Any]] = []
    held = 0
    while held < target:
        node = rng.choice(names)
        size = rng.choice((1, 1, 2, 2, 4))
        if free[node] < size:
            continue
        free[node] -= size
        held += size
        bodies.append(pod_body(f"fill-{len(bodies)}", size, node=node))
    for start in range(0, len(bodies), 64):
        await asyncio.gather(
            *(
                nodes.call("POST", "/api/v1/namespaces/fill/pods", b, kind="bench")
                for b in bodies[start : start + 64]
            )
        )
    return len(bodies)


async def one_arm(
    harness: Harness, board: Board, arm: str, *, pods: int, seed: int
) -> dict[str, Any]:
    nodes = harness.nodes
    namespace = "measured"
    rng = random.Random(seed)  # noqa: S311
    kinds = [c for c, _ in MIX]
    weights = [w for _, w in MIX]
    trace = [(f"p{i}", rng.choices(kinds, weights)[0]) for i in range(pods)]
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    client = nodes._http()  # the agent's pooled client (the bench watches and writes through it)
    listed = await nodes.call("GET", f"/api/v1/namespaces/{namespace}/pods")
    version = listed["metadata"]["resourceVersion"]

    async def follow() -> None:
        path = f"/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={version}"
        import httpx2

        async with client.stream("GET", path, timeout=httpx2.Timeout(30.0, read=600.0)) as stream:
            async for line in stream.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                name = (obj.get("metadata") or {}).get("name", "")
                if (obj.get("spec") or {}).get("nodeName") and name not in bound:
                    bound[name] = time.monotonic()
                    if len(bound) == pods:
                        return

    watcher = asyncio.ensure_future(follow())
    await asyncio.sleep(0.5)
    started = time.monotonic()

    async def create(name: str, cards: int) -> None:
        created[name] = time.monotonic()
        await nodes.call(
            "POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(name, cards), kind="bench"
        )

    for start in range(0, len(trace), 32):
        await asyncio.gather(*(create(n, c) for n, c in trace[start : start + 32]))
    # Until every pod is bound, or nothing was bound for QUIET seconds (what is left does not
    # fit: the scheduler's own retries come every few seconds), at most 300 s.
    deadline = time.monotonic() + 300
    while not watcher.done() and time.monotonic() < deadline:
        last = max(bound.values(), default=started)
        if time.monotonic() - last > QUIET:
            break
        await asyncio.sleep(0.5)
    watcher.cancel()
    ended = max(bound.values(), default=time.monotonic())
    latency: dict[str, list[float]] = {"gcu": [], "shared": [], "non_gcu": []}
    for name, cards in trace:
        if name in bound:
            kind = "gcu" if cards > 0 else "shared" if cards < 0 else "non_gcu"
            latency[kind].append(bound[name] - created[name])
    await asyncio.sleep(2)  # the agent admits what was bound last
    local = multi = 0
    for node in nodes.nodes.values():
        for admitted in node.admitted.values():
            if admitted.namespace != namespace:
                continue
            ids = admitted.devices.get(GCU, ())
            if len(ids) > 1:
                multi += 1
                local += board.switch_local(ids)
    result = {
        "arm": arm,
        "pods": pods,
        "bound": len(bound),
        "pending": pods - len(bound),
        "pods_per_second": round(len(bound) / max(1e-9, ended - started), 2),
        "bind_seconds": {k: quantiles(v) for k, v in latency.items()},
        "multi_card_switch_local": round(local / multi, 4) if multi else None,
        "multi_card_pods": multi,
    }
    progress(
        f"{arm}: {result['pods_per_second']} pods/s, {result['pending']} pending, "
        f"switch-local {result['multi_card_switch_local']}"
    )
    # The whole result before the clean-up (kept in the log if the run is stopped later).
    progress(f"arm result: {json.dumps({**result, 'load_average': round(os.getloadavg()[0], 2)})}")
    await nodes.call(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0}, kind="bench"
    )
    while (await nodes.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1"))["items"]:
        await asyncio.sleep(1)
    await asyncio.sleep(nodes.holdings_every + 2)  # the plugins publish the release
    return result


async def idle_node_state(harness: Harness, seconds: float) -> dict[str, Any]:
    """Writes a second by the node-state writers, and bytes a minute to one all-Nodes watcher."""
    nodes = harness.nodes
    import httpx2

    listed = await nodes.call("GET", "/api/v1/nodes?limit=1")
    received = 0
    events = 0

    async def watch() -> None:
        nonlocal received, events
        path = f"/api/v1/nodes?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"
        async with nodes._http().stream(
            "GET", path, timeout=httpx2.Timeout(30.0, read=seconds + 60)
        ) as stream:
            async for chunk in stream.aiter_bytes():
                received += len(chunk)
                events += chunk.count(b"\n")

    before = dict(nodes.writes)
    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(seconds)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    delta = {k: nodes.writes[k] - before.get(k, 0) for k in nodes.writes}
    return {
        "seconds": seconds,
        "node_state_node_writes_per_second": round(delta.get("node-state-node", 0) / seconds, 2),
        "node_state_lease_writes_per_second": round(delta.get("node-state-lease", 0) / seconds, 2),
        "lease_writes_per_second": round(delta.get("lease", 0) / seconds, 2),
        "all_writes_per_second": round(sum(delta.values()) / seconds, 2),
        "watcher_bytes_per_minute": int(received * 60 / seconds),
        "watcher_events_per_minute": int(events * 60 / seconds),
    }


def start_extender(harness: Harness, port: int) -> subprocess.Popen[bytes]:
    log = open(os.path.join(harness.plane.work, "extender.log"), "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [
            EXTENDER_BIN,
            f"--kubeconfig={harness.plane.kubeconfig}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--node-state-namespace={NODE_STATE_NAMESPACE}",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    bench_cluster.wait_ready(port, 120)
    return process


def run_nodes(count: int, options: argparse.Namespace) -> dict[str, Any]:
    # The kubelets' Lease renewal the machine can afford beside the node-state writers: on the
    # 2 shared cores, at 1,664 of 5,000 nodes renewed every 60 s the Leases were already 110 s
    # old at p90, on the way to the lifecycle controller's grace (4 renewals).
    renew = 10.0 if count <= 500 else 60.0 if count <= 1000 else 240.0
    result: dict[str, Any] = {"nodes": count, "lease_renew_seconds": renew}
    with tempfile.TemporaryDirectory(prefix="enflame-scale-") as work:
        board = Board(os.path.join(work, "board"), shared=False)
        shared_board = Board(os.path.join(work, "shared-board"), shared=True)
        os.makedirs(os.path.join(work, "plane"))
        with Harness.started(
            os.path.join(work, "plane"),
            renew=renew,
            status_every=3600.0,
            apiserver_args=audit_args(work),
        ) as harness:
            started = time.monotonic()
            # One node in five serves gcu7 as shared slices, the rest 8 whole cards.
            specs = [
                (shared_board if i % 5 == 0 else board).node(harness.nodes, f"gcu-{i:05d}")
                for i in range(count)
            ]
            # At 5,000 nodes on the 2 shared cores registration ran past the default 600 s.
            harness.add(specs, timeout=600 + 2.0 * count)
            result["nodes_ready_seconds"] = round(time.monotonic() - started, 1)
            progress(
                f"{count} nodes ready in {result['nodes_ready_seconds']} s "
                f"(load {os.getloadavg()[0]:.1f})"
            )
            time.sleep(10)  # every writer's first state is out
            result["idle"] = harness.run(
                idle_node_state(harness, options.idle), timeout=options.idle + 120
            )
            progress(f"idle: {result['idle']}")
            if options.idle_only:
                return result
            if options.operator:
                # Before the prefill: the validator needs a free card on every node.
                audit_log = os.path.join(work, "audit.log")
                result["operator"] = operator_section(harness, options, audit_log)
            for ns in ("fill", "measured"):
                harness.plane.api(
                    "POST",
                    "/api/v1/namespaces",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                )
            harness.wait(
                "default ServiceAccounts",
                lambda: all(
                    harness.plane.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                    for ns in ("fill", "measured")
                ),
                60,
            )
            result["prefill_pods"] = harness.run(
                prefill(harness.nodes, list(harness.nodes.nodes), options.load, options.seed),
                timeout=1800,
            )
            time.sleep(harness.nodes.holdings_every + 5)
            port = bench_cluster.free_port()
            extender = start_extender(harness, port)
            arms: list[dict[str, Any]] = []
            try:
                for run in range(options.runs):
                    for arm in options.arms:
                        config = (
                            None
                            if arm == "default"
                            else chart_scheduler_config(port, score_all=arm == "score-all")
                        )
                        harness.plane.restart_scheduler(config)
                        time.sleep(3)
                        outcome = harness.run(
                            one_arm(
                                harness, board, arm, pods=options.pods, seed=options.seed + run
                            ),
                            timeout=1200,
                        )
                        outcome["run"] = run
                        outcome["load_average"] = round(os.getloadavg()[0], 2)
                        arms.append(outcome)
            finally:
                extender.terminate()
                extender.wait(10)
            result["arms"] = arms
            result["summary"] = summarize(arms)
    return result


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "users": [f"system:serviceaccount:{operator_env.NAMESPACE}:"
                                        f"{operator_env.SERVICE_ACCOUNT}"]},
        {"level": "None"},
    ],
}  # fmt: skip


def audit_args(work: str) -> list[str]:
    """kube-apiserver flags that log every request of the operator's ServiceAccount."""
    policy = os.path.join(work, "audit-policy.json")
    with open(policy, "w", encoding="utf-8") as handle:
        json.dump(AUDIT_POLICY, handle)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={os.path.join(work, 'audit.log')}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
    ]


def audited(log_path: str) -> int:
    """Requests of the operator's account so far (ResponseComplete events)."""
    try:
        with open(log_path, encoding="utf-8") as handle:
            return sum(1 for line in handle if '"stage":"ResponseComplete"' in line)
    except FileNotFoundError:
        return 0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def operator_section(
    harness: Harness, options: argparse.Namespace, audit_log: str
) -> dict[str, Any]:
    """Deploy the example on every node as the chart's operator, then measure it converged,
    then (``--rollout``) a plugin version change under ``maxUnavailable: 10%``."""
    kubeconfig = operator_env.install(harness)
    names = list(harness.nodes.nodes)
    result: dict[str, Any] = {}
    with operator_env.operator_process(
        harness, kubeconfig, "--interval=5", "--max-interval=300"
    ) as process:
        started = time.monotonic()
        body = operator_env.resource_body("scale", upgradePolicy={"maxUnavailable": "10%"})
        harness.plane.api("POST", operator_env.GR_PATH, body)
        # Polled every 5 s (the resource grows with the nodes), progress every minute; past
        # the timeout the nodes deployed so far are the figure, and the rest is not measured.
        deadline = started + options.operator_timeout
        told = started
        while operator_env.phase(harness, "scale") != "Running":
            if time.monotonic() > deadline or time.monotonic() - told >= 60:
                told = time.monotonic()
                done = len(deployed_nodes(harness, names))
                progress(
                    f"operator: components Ready on {done} of {len(names)} nodes after "
                    f"{told - started:.0f} s (load {os.getloadavg()[0]:.1f})"
                )
                if time.monotonic() > deadline:
                    result["deploy_seconds"] = None
                    result["deployed_nodes_at_timeout"] = done
                    result["error"] = f"not Running within {options.operator_timeout:g} s"
                    return result
            time.sleep(5)
        result["deploy_seconds"] = round(time.monotonic() - started, 1)
        time.sleep(30)  # settle: the last status write, the idle wait begins
        before = audited(audit_log)
        time.sleep(options.operator_idle)
        after = audited(audit_log)
        if after == 0:
            result["error"] = f"no request of the operator in the audit log {audit_log}"
        result["converged_requests_per_minute"] = round(
            (after - before) * 60 / options.operator_idle, 1
        )
        result["rss_mib"] = rss_mib(process.pid)
        found = operator_env.get_resource(harness, "scale") or {}
        result["gcuresource_bytes"] = len(json.dumps(found, separators=(",", ":")))
        progress(f"operator: {result}")
        if options.rollout:
            limit = max(1, len(names) // 10)
            worst = 0
            started = time.monotonic()
            harness.plane.api(
                "PATCH",
                f"{operator_env.GR_PATH}/scale",
                {"spec": {"devicePlugin": {"version": "0.1.1-scale"}}},
            )
            deadline = started + options.operator_timeout
            rolled = False
            while time.monotonic() < deadline:
                pods = component_pods(harness)
                ready: dict[str, int] = {}
                new: set[str] = set()
                for pod in pods:
                    node = pod["spec"].get("nodeName", "")
                    ok = any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in pod.get("status", {}).get("conditions") or []
                    )
                    if ok and not pod["metadata"].get("deletionTimestamp"):
                        ready[node] = ready.get(node, 0) + 1
                    if any("0.1.1-scale" in c["image"] for c in pod["spec"]["containers"]):
                        new.add(node)
                down = sum(1 for n in names if ready.get(n, 0) < 2)
                worst = max(worst, down)
                if len(new) == len(names) and operator_env.phase(harness, "scale") == "Running":
                    rolled = True
                    break
                time.sleep(2)
            result["rollout"] = {
                "seconds": round(time.monotonic() - started, 1),
                "completed": rolled,
                "budget": limit,
                "worst_down": worst,
            }
            progress(f"rollout: {result['rollout']}")
    return result


def component_pods(harness: Harness) -> list[dict[str, Any]]:
    """The operator's component pods (in its own namespace, where the chart puts them)."""
    label = operator_names.COMPONENT_LABEL
    path = f"/api/v1/namespaces/{operator_env.NAMESPACE}/pods?labelSelector={label}"
    found: list[dict[str, Any]] = harness.plane.request("GET", path, timeout=120)["items"]
    return found


def deployed_nodes(harness: Harness, names: Sequence[str]) -> set[str]:
    """The nodes on which the example's two daemon components (toolkit, device plugin) are
    Ready."""
    ready: dict[str, int] = {}
    for pod in component_pods(harness):
        labels = pod["metadata"].get("labels") or {}
        if labels.get(operator_names.COMPONENT_LABEL) == operator_resource.VALIDATOR:
            continue
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions") or []
        ):
            node = pod["spec"].get("nodeName", "")
            ready[node] = ready.get(node, 0) + 1
    return {n for n in names if ready.get(n, 0) >= 2}


def summarize(arms: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for arm in {a["arm"] for a in arms}:
        mine = [a for a in arms if a["arm"] == arm]
        rates = [a["pods_per_second"] for a in mine]
        summary[arm] = {
            "pods_per_second_mean": round(statistics.mean(rates), 2),
            "pods_per_second_min": min(rates),
            "pods_per_second_max": max(rates),
            "non_gcu_p99_seconds_mean": _mean([a["bind_seconds"]["non_gcu"]["p99"] for a in mine]),
            "gcu_p99_seconds_mean": _mean([a["bind_seconds"]["gcu"]["p99"] for a in mine]),
            "multi_card_switch_local_mean": _mean([a["multi_card_switch_local"] for a in mine]),
            "pending_max": max(a["pending"] for a in mine),
        }
    if "default" in summary:
        for arm in ("chart", "score-all"):
            if arm in summary:
                summary[f"{arm}_over_default"] = round(
                    summary[arm]["pods_per_second_mean"]
                    / summary["default"]["pods_per_second_mean"],
                    3,
                )
    return summary


def _mean(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(statistics.mean(found), 4) if found else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--arms", default="default,chart")
    parser.add_argument("--operator", action="store_true", help="measure the operator too")
    parser.add_argument("--operator-idle", type=float, default=120.0)
    parser.add_argument("--operator-timeout", type=float, default=1800.0)
    parser.add_argument("--rollout", action="store_true", help="and a full plugin rollout")
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="the idle node-state figures only (e.g. for an older tree on PYTHONPATH)",
    )
    options = parser.parse_args(argv)
    options.arms = [a for a in options.arms.split(",") if a]
    if not options.arms or not set(options.arms) <= {"default", "chart", "score-all"}:
        parser.error("--arms takes default, chart and score-all")
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "options": {k: v for k, v in vars(options).items()},
        "runs": [],
    }
    for count in (int(n) for n in options.nodes.split(",") if n):
        report["runs"].append(run_nodes(count, options))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
