"""Switch-local placement across 200 nodes with Kubernetes' own scheduler, with and without the
extender; JSON.

Each run starts a real control plane (etcd, kube-apiserver 1.20 and kube-scheduler 1.20 built
from Debian's source package by scripts/e2e-build-cluster.sh; no controller manager, so Nodes
without kubelets stay schedulable) with 200 Node objects of the vendor 8-card machine
(``enflame.com/gcu: 8``). An in-process stand-in per node plays the kubelet and the device
plugin: it sees the pods bound to its node, picks their cards with the plugin's own policy
(``allocation.TopologyPolicy``: what the kubelet's GetPreferredAllocation gets from the plugin),
and tells the plugin's own writer (``device_plugin.node_annotation``) who holds what on the
plugin's cadence: a PodResources read every ``--interval`` seconds (5, the plugin's default, at
a random phase per node) and one read ``holdings_feed.AFTER_ALLOCATE`` after each admission
(``--admission-delay`` after the binding); an ended pod is seen at the next periodic read, as by
the plugin. It deletes each pod when its lifetime ends. The extender runs as its own process
(``enflame-scheduler-extender``). Both arms run kube-scheduler with the same shipped
configuration (``percentageOfNodesToScore: 100`` included); only the "with" arm has
``extenders``.

A seeded trace per load and seed: a burst that fills the cluster to the load, then Poisson
arrivals of 1/2/4/8-card pods (40/35/20/5%) and, with ``--shared-slices`` (default 6: gcu7 of
each node as slices), of 1-3-slice shared-GCU pods, with exponential lifetimes, sized to hold the
load,
for ``--warmup`` seconds (default three lifetimes, so fragmentation reaches its steady state)
and then ``--measure`` seconds. Reported per run for the pods that arrive while measuring: for
each multi-card size, how local the cards were (switch, root port, NUMA, wider), overall and
when some node had a free set of that locality at the time; pods pending (sampled each second
while measuring, and at the end); create->bound latency; and the extender's own
filter/prioritize latency. Both arms run every seed; the summary gives each arm's mean, min and
max over the seeds. A separate section times prioritize for 200 nodes over real HTTP with no
cluster at all.

    .venv/bin/python benchmarks/bench_cluster.py [--nodes 200] [--loads 0.8] [--lifetime 60]
        [--warmup 180] [--measure 120] [--seeds 25,26,27,28,29] [--shared-slices 6]
        [--modes without,with]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import http.client
import importlib
import json
import multiprocessing
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from enflame_gcu import (  # noqa: E402
    allocation,
    devices,
    health,
    holders,
    node_state,
    sharing,
    topology,
)
from enflame_gcu.device_plugin import config as plugin_config  # noqa: E402
from enflame_gcu.device_plugin import holdings_feed, node_annotation, resources  # noqa: E402
from enflame_gcu.scheduler_extender import cache as extender_cache  # noqa: E402
from enflame_gcu.scheduler_extender import decisions, server  # noqa: E402
from enflame_gcu.simulation import simulate, topofile  # noqa: E402

GCU = "enflame.com/gcu"
SHARED = "enflame.com/shared-gcu"
NAMESPACE = "bench"
CARDS_PER_NODE = 8
# With --shared-slices K > 0 (the default, 6) each node serves gcu7 (a lone card on its switch,
# so pairs are unaffected) as K shared-GCU slices, and a second Poisson stream of shared-GCU pods
# (1-3 slices, one container) holds the same load of the slices. A shared pod is written in a
# trace as a negative size: -k asks for k slices.
SHARED_CARD = "gcu7"
SHARED_SIZES = (1, 2, 3)
SIZES = (1, 2, 4, 8)
WEIGHTS = (0.40, 0.35, 0.20, 0.05)
MEAN_CARDS = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True))
RANK = {"single": 0, "switch": 0, "root_port": 1, "numa": 2, "spread": 3}
NAMES = ("switch", "root_port", "numa", "spread")
TARGET_P99_MS = 10.0
TARGET_SWITCH_LOCAL = 0.97
EXTENDER_BIN = os.path.join(os.path.dirname(sys.executable), "enflame-scheduler-extender")


def scheduler_config(extender_port: int | None) -> dict[str, Any]:
    """The shipped scheduler configuration in both arms; ``extenders`` only with a port."""
    path = os.path.join(REPO, "deploy", "extender", "kube-scheduler-config-v1beta1.yaml")
    with open(path, encoding="utf-8") as handle:
        shipped = dict(yaml.safe_load(handle))
    shipped.pop("leaderElection", None)
    shipped.pop("clientConnection", None)
    shipped["profiles"] = [{"schedulerName": "default-scheduler"}]
    if extender_port is None:
        shipped.pop("extenders", None)
        return dict(shipped)
    for extender in shipped["extenders"]:
        extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    return dict(shipped)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclasses.dataclass
class Trace:
    """The pods of one run: (name, cards, lifetime) for the fill burst and the arrivals."""

    burst: list[tuple[str, int, float]]
    arrivals: list[tuple[float, str, int, float]]  # (time offset, name, cards, lifetime)
    warmup: float = 0.0  # arrivals before this offset warm the cluster up, the rest are measured


def make_trace(
    seed: int,
    load: float,
    nodes: int,
    lifetime: float,
    duration: float,
    *,
    warmup: float = 0.0,
    shared_slices: int = 0,
) -> Trace:
    """A seeded trace holding ``load`` of the whole cards (and of the slices) on average."""
    rng = random.Random(f"{seed}-{load}")  # noqa: S311 (a seeded trace, not a secret)
    whole = CARDS_PER_NODE - (1 if shared_slices else 0)

    def cards() -> int:
        return rng.choices(SIZES, WEIGHTS)[0]

    def slices() -> int:
        return -rng.choice(SHARED_SIZES)

    streams: list[tuple[float, Callable[[], int], float]] = [
        (load * nodes * whole, cards, MEAN_CARDS)
    ]
    if shared_slices:
        streams.append(
            (load * nodes * shared_slices, slices, statistics.fmean(SHARED_SIZES))
        )  # fmt: skip
    burst: list[tuple[str, int, float]] = []
    arrivals: list[tuple[float, str, int, float]] = []
    for target, draw, mean in streams:
        held = 0
        while held < target:
            size = draw()
            burst.append((f"fill-{len(burst)}", size, rng.expovariate(1 / lifetime)))
            held += abs(size)
        rate = target / (mean * lifetime)  # Little's law: arrivals that hold the load
        moment = 0.0
        while True:
            moment += rng.expovariate(rate)
            if moment >= duration:
                break
            arrivals.append((moment, "", draw(), rng.expovariate(1 / lifetime)))
    arrivals.sort(key=lambda item: item[0])
    arrivals = [(t, f"pod-{i}", size, life) for i, (t, _, size, life) in enumerate(arrivals)]
    return Trace(burst, arrivals, warmup)


class StandIn:
    """One node's kubelet and device plugin: cards per bound pod, the node-state annotation
    written on the plugin's cadence (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        *,
        inventory: devices.Inventory,
        report: health.HealthReport,
        assignment: resources.Assignment,
        config: plugin_config.PluginConfig,
        api: node_annotation.NodeApi,
    ) -> None:
        self.name = name
        self.topology = topology.Topology.from_inventory(inventory)
        self.policy = allocation.policy_by_name("topology", self.topology)
        self.cards = [card.name for card in assignment.whole]
        slices_of = {
            card.name: config.sharing.slices_for(card.name, card.model)
            for card in assignment.shared
        }
        self.slice_policy = sharing.policy_by_name(config.sharing.policy, slices_of)
        self.slices = sharing.slice_ids(
            [(c.name, c.model) for c in assignment.shared], config.sharing
        )
        self.held: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.annotator = node_annotation.NodeAnnotator(api, name)
        self.annotator.set_node(inventory, report, assignment, config)
        self.annotator.set_holdings([])
        self.interval = 5.0
        self.admission_delay = 1.0

    def free(self, devices: Sequence[str] | None = None) -> list[str]:
        taken = {card for _, cards in self.held.values() for card in cards}
        return [d for d in (self.cards if devices is None else devices) if d not in taken]

    def bind(self, uid: str, pod: str, size: int) -> tuple[str, ...] | None:
        """The plugin's choice for a pod bound here (``size`` < 0: that many slices; None:
        more than free, which the kubelet would refuse)."""
        free = self.free(self.slices if size < 0 else None)
        if abs(size) > len(free):
            return None
        policy = self.slice_policy if size < 0 else self.policy
        chosen = tuple(policy.choose(free, [], abs(size)))
        self.held[uid] = (pod, chosen)
        # The kubelet admits the pod and calls Allocate; the plugin reads PodResources again
        # AFTER_ALLOCATE later (HoldingsFeed.poke).
        asyncio.get_running_loop().call_later(
            self.admission_delay + holdings_feed.AFTER_ALLOCATE, self._publish
        )
        return chosen

    def release(self, uid: str) -> None:
        """The pod ended: the plugin sees it at its next periodic read."""
        self.held.pop(uid, None)

    async def feed(self, phase: float) -> None:
        """The plugin's periodic PodResources read."""
        await asyncio.sleep(phase)
        while True:
            self._publish()
            await asyncio.sleep(self.interval)

    def _publish(self) -> None:
        self.annotator.set_holdings(
            [
                holders.Holding(NAMESPACE, pod, "c", SHARED if "-slice" in cards[0] else GCU, cards)
                for pod, cards in self.held.values()
            ]
        )


@functools.lru_cache(maxsize=65536)
def best_locality(
    places: tuple[topology.Placement, ...], free: frozenset[str], size: int
) -> int | None:
    """The closest locality a node could give ``size`` cards from ``free`` (rank), or None."""
    if size > len(free):
        return None
    topo = topology.Topology.from_placements(places)
    chosen = allocation.TopologyPolicy(topo).choose(sorted(free), [], size)
    return RANK[holders.locality(topo, chosen)]


class Run:
    """One load, with or without the extender."""

    def __init__(self, client: Any, standins: dict[str, StandIn], trace: Trace) -> None:
        self.client = client
        self.standins = standins
        self.trace = trace
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.records: list[dict[str, Any]] = []
        self.sizes: dict[str, int] = {}
        self.lifetimes: dict[str, float] = {}
        self.uid_node: dict[str, str] = {}
        self.phase: dict[str, str] = {}
        self.pending_samples: list[int] = []
        self.errors: list[str] = []
        self.delete_errors = 0
        self.places = next(iter(standins.values())).topology
        self._places = tuple(self.places.placement(name) for name in self.places.names)

    def best_anywhere(self, size: int) -> int | None:
        ranks = [
            best_locality(self._places, frozenset(s.free()), size) for s in self.standins.values()
        ]
        known = [rank for rank in ranks if rank is not None]
        return min(known) if known else None

    async def create(self, name: str, size: int, lifetime: float, phase: str) -> None:
        from lightkube.resources.core_v1 import Pod

        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "c",
                        "image": "bench.invalid/none",
                        "resources": {
                            "limits": {SHARED if size < 0 else GCU: str(abs(size))},
                            "requests": {
                                SHARED if size < 0 else GCU: str(abs(size)),
                                "cpu": "10m",
                            },
                        },
                    }
                ],
            },
        }
        self.sizes[name] = size
        self.lifetimes[name] = lifetime
        self.phase[name] = phase
        self.created[name] = time.monotonic()
        try:
            await self.client.create(Pod.from_dict(body))
        except Exception as exc:  # counted, not fatal: the run reports it
            self.errors.append(f"create {name}: {exc!r}")

    async def expire(self, name: str, lifetime: float) -> None:
        from lightkube.resources.core_v1 import Pod

        await asyncio.sleep(lifetime)
        try:
            await self.client.delete(Pod, name, namespace=NAMESPACE, grace_period=0)
        except Exception as exc:  # counted: a pod not deleted keeps its cards to the end
            self.delete_errors += 1
            self.errors.append(f"delete {name}: {exc!r}")

    async def follow(self, tasks: set[asyncio.Task[None]]) -> None:
        from lightkube.resources.core_v1 import Pod

        async for kind, pod in self.client.watch(Pod, namespace=NAMESPACE):
            name, uid = pod.metadata.name, pod.metadata.uid
            node = pod.spec.nodeName if pod.spec else None
            if kind == "DELETED":
                owner = self.uid_node.pop(uid, None)
                if owner is not None:
                    self.standins[owner].release(uid)
                continue
            if not node or uid in self.uid_node or name not in self.sizes:
                continue
            self.uid_node[uid] = node
            self.bound[name] = time.monotonic()
            size = self.sizes[name]
            best = self.best_anywhere(size) if size > 1 else 0
            chosen = self.standins[node].bind(uid, name, size)
            if chosen is None:
                self.errors.append(f"{name}: {size} devices bound to {node} without them free")
                continue
            task = asyncio.ensure_future(self.expire(name, self.lifetimes[name]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if size < 0:
                continue  # shared slices: placed or pending, no locality
            topo = self.standins[node].topology
            self.records.append(
                {
                    "size": size,
                    "phase": self.phase[name],
                    "best": best,
                    "got": RANK[holders.locality(topo, chosen)],
                }
            )

    async def play(self, sample_every: float = 1.0) -> dict[str, Any]:
        tasks: set[asyncio.Task[None]] = set()
        watcher = asyncio.ensure_future(self.follow(tasks))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.gather(*(self.create(n, s, life, "fill") for n, s, life in self.trace.burst))
        burst_names = [n for n, _, _ in self.trace.burst]
        # Until 98 % are bound, or nothing more bound for 10 s (the rest wait for cards), or
        # 120 s.
        deadline, seen, last_change = started + 120, -1, time.monotonic()
        while time.monotonic() < deadline:
            count = sum(n in self.bound for n in burst_names)
            if count >= len(burst_names) * 0.98 or time.monotonic() - last_change > 10:
                break
            if count != seen:
                seen, last_change = count, time.monotonic()
            await asyncio.sleep(0.2)
        burst_bound = [self.bound[n] for n in burst_names if n in self.bound]
        burst_seconds = (max(burst_bound) - started) if burst_bound else 0.0
        begin = time.monotonic()
        pending_end = 0

        async def sample() -> None:
            while True:
                await asyncio.sleep(sample_every)
                self.pending_samples.append(sum(n not in self.bound for n in self.created))

        sampler: asyncio.Future[None] | None = None
        for offset, name, size, life in self.trace.arrivals:
            delay = begin + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            phase = "steady" if offset >= self.trace.warmup else "warmup"
            if phase == "steady" and sampler is None:
                sampler = asyncio.ensure_future(sample())
            task = asyncio.ensure_future(self.create(name, size, life, phase))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.sleep(3)
        waiting = [n for n in self.created if n not in self.bound]
        pending_end = len(waiting)
        most_free = max(len(s.free()) for s in self.standins.values())
        pending_sizes = {
            str(size): sum(self.sizes[n] == size for n in waiting) for size in SIZES
        } | {f"{k}_slices": sum(self.sizes[n] == -k for n in waiting) for k in SHARED_SIZES}
        await cancel_all([*([sampler] if sampler else []), watcher, *tasks])
        steady = [n for n in self.bound if self.phase[n] == "steady"]
        latencies = sorted(self.bound[n] - self.created[n] for n in steady)
        unbound_steady = sum(
            self.phase[n] == "steady" and n not in self.bound for n in self.created
        )  # fmt: skip
        return {
            "pods_created": len(self.created),
            "pods_bound": len(self.bound),
            "pending_at_end": pending_end,
            # By size, and whether some node had that many free cards then (else the cards
            # were too scattered: fragmentation, not the scheduler's queue).
            "pending_at_end_by_size": pending_sizes,
            "most_free_cards_on_a_node_at_end": most_free,
            "pending_mean": round(statistics.fmean(self.pending_samples), 1)
            if self.pending_samples
            else 0,
            "fill_burst": {
                "pods": len(burst_names),
                "bound": len(burst_bound),
                "seconds": round(burst_seconds, 2),
                "pods_per_s": round(len(burst_bound) / burst_seconds, 1) if burst_seconds else 0,
            },
            # Pods that arrived while measuring: create->bound, and how many never bound.
            "create_to_bound_ms": {
                "pods": len(latencies),
                "p50": round(_quantile(latencies, 0.5) * 1000, 1),
                "p99": round(_quantile(latencies, 0.99) * 1000, 1),
            },
            "steady_pods_never_bound": unbound_steady,
            "locality": locality_summary(self.records),
            "create_errors": sum(e.startswith("create ") for e in self.errors),
            "delete_errors": self.delete_errors,
            "errors": self.errors[:10],
        }


async def cancel_all(tasks: Sequence[asyncio.Future[Any]], timeout: float = 10.0) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again the ones that swallowed it (a
    ``wait_for`` racing its own timeout can), for ``timeout`` seconds at most."""
    pending = set(tasks)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)
    if pending:
        progress(f"{len(pending)} task(s) did not stop when cancelled; left behind")


def progress(message: str) -> None:
    """One line on stderr (a run takes minutes)."""
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def locality_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per multi-card size and phase: how local the cards were; how often as local as the best
    node could have given at that moment; switch-local when some node had a free switch set."""
    result: dict[str, Any] = {}
    for size in SIZES[1:]:
        for phase in ("steady", "all"):
            chosen = [r for r in records if r["size"] == size and phase in (r["phase"], "all")]
            if not chosen:
                continue
            counts = {
                name: sum(r["got"] == rank for r in chosen) for rank, name in enumerate(NAMES)
            }
            could = [r for r in chosen if r["best"] == 0]
            result[f"{size}_cards_{phase}"] = {
                "pods": len(chosen),
                "by_locality": counts,
                "switch_local_share": round(counts["switch"] / len(chosen), 4),
                "switch_local_when_some_node_had_a_free_set": {
                    "pods": len(could),
                    "share": round(sum(r["got"] == 0 for r in could) / len(could), 4)
                    if could
                    else None,
                },
                "as_local_as_the_best_node_then": round(
                    sum(r["best"] is not None and r["got"] <= r["best"] for r in chosen)
                    / len(chosen),
                    4,
                ),
            }
    return result


def vendor_node(directory: str, shared_slices: int = 0) -> tuple[Any, ...]:
    root = os.path.join(directory, "vendor")
    os.makedirs(root)
    simulate.create(root, topofile.load("vendor-8card"))
    config = plugin_config.PluginConfig(host_root=root)
    if shared_slices:
        config = plugin_config.PluginConfig(
            host_root=root,
            resources=("gcu", "shared-gcu"),
            shared_cards=(SHARED_CARD,),
            sharing=sharing.SharingSettings(slices=shared_slices),
        )
    inventory = devices.discover(root)
    monitor = health.HealthMonitor(root, inventory.cards, driver_version=inventory.driver_version)
    _, assignment = resources.build(inventory, config)
    return inventory, monitor.report, assignment, config


async def add_nodes(client: Any, count: int, shared_slices: int = 0) -> list[str]:
    from lightkube.resources.core_v1 import Namespace, Node, NodeStatus, ServiceAccount

    await client.create(Namespace.from_dict({"metadata": {"name": NAMESPACE}}))
    await client.create(
        ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": NAMESPACE}})
    )
    names = [f"gcu-node-{i:03d}" for i in range(count)]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GCU: str(CARDS_PER_NODE)}
    if shared_slices:
        capacity = {**capacity, GCU: str(CARDS_PER_NODE - 1), SHARED: str(shared_slices)}

    async def one(name: str) -> None:
        await client.create(
            Node.from_dict({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        )
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        await client.patch(NodeStatus, name, status, patch_type=_merge())
        # The API server's TaintNodesByCondition admission taints a new Node not-ready; with no
        # kubelet and no controller manager nothing would lift it.
        await client.patch(Node, name, {"spec": {"taints": []}}, patch_type=_merge())

    for start in range(0, count, 20):
        await asyncio.gather(*(one(name) for name in names[start : start + 20]))
    return names


def _merge() -> Any:
    from lightkube.types import PatchType

    return PatchType.MERGE


async def one_run(
    bin_dir: str, work: str, load: float, with_extender: bool, options: argparse.Namespace
) -> dict[str, Any]:
    from lightkube import AsyncClient, KubeConfig

    # The cluster tier's control-plane harness (tests/cluster), shared with the e2e tests.
    controlplane: Any = importlib.import_module("tests.cluster.controlplane")

    port = free_port() if with_extender else None
    plane = controlplane.ControlPlane(
        bin_dir, work, controller_manager=False, scheduler=False, verbosity=0
    )
    extender: subprocess.Popen[bytes] | None = None
    with plane:
        config = KubeConfig.from_file(plane.kubeconfig)
        client = AsyncClient(config=config, field_manager="bench-cluster")
        api = node_annotation.LightkubeNodeApi(plane.kubeconfig)
        try:
            progress(
                f"load {load} seed {options.seed} extender {with_extender}: adding nodes "
                f"(load average {os.getloadavg()[0]:.2f})"
            )
            names = await add_nodes(client, options.nodes, options.shared_slices)
            inventory, report, assignment, plugin = vendor_node(work, options.shared_slices)
            standins = {
                n: StandIn(
                    n,
                    inventory=inventory,
                    report=report,
                    assignment=assignment,
                    config=plugin,
                    api=api,
                )
                for n in names
            }
            rng = random.Random(options.seed)  # noqa: S311 (seeded read phases)
            for standin in standins.values():
                standin.interval = options.interval
                standin.admission_delay = options.admission_delay
            writers = [asyncio.ensure_future(s.annotator.run()) for s in standins.values()]
            writers += [
                asyncio.ensure_future(s.feed(rng.uniform(0, options.interval)))
                for s in standins.values()
            ]
            while sum(s.annotator.writes for s in standins.values()) < len(standins):
                await asyncio.sleep(0.2)
            if port is not None:
                with open(os.path.join(work, "extender.log"), "ab") as log:
                    extender = subprocess.Popen(
                        [
                            EXTENDER_BIN,
                            f"--kubeconfig={plane.kubeconfig}",
                            f"--port={port}",
                            "--bind-address=127.0.0.1",
                        ],
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                    )
                wait_ready(port)
            plane.scheduler_config = scheduler_config(port)
            plane.with_scheduler = True
            start_scheduler(plane)
            trace = make_trace(
                options.seed,
                load,
                options.nodes,
                options.lifetime,
                options.warmup + options.measure,
                warmup=options.warmup,
                shared_slices=options.shared_slices,
            )
            progress(f"playing {len(trace.burst)} burst pods, {len(trace.arrivals)} arrivals")
            result = await Run(client, standins, trace).play()
            progress("played")
            if port is not None:
                result["extender_ms"] = stats(port)["verbs"]
            await cancel_all(writers)
            result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
            return {"load": load, "seed": options.seed, "extender": with_extender, **result}
        finally:
            if extender is not None:
                extender.terminate()
                extender.wait(10)
            await client.close()
            await api.close()


def start_scheduler(plane: Any) -> None:
    """Start kube-scheduler on a running control plane the way the harness does."""
    command = [
        os.path.join(plane.bin, "kube-scheduler"),
        f"--authentication-kubeconfig={plane.kubeconfig}",
        f"--authorization-kubeconfig={plane.kubeconfig}",
        "--bind-address=127.0.0.1",
        "--port=0",
        f"--secure-port={free_port()}",
        f"--cert-dir={os.path.join(plane.work, 'scheduler-certs')}",
        "--v=0",
    ]
    config = dict(plane.scheduler_config)
    config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1beta1")
    config.setdefault("kind", "KubeSchedulerConfiguration")
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": plane.kubeconfig}
    # With --config, kube-scheduler 1.20 ignores --port=0 and serves healthz and metrics on
    # 0.0.0.0:10251 by default: a concurrent cluster tier's scheduler would collide with it.
    config["healthzBindAddress"] = f"127.0.0.1:{free_port()}"
    config["metricsBindAddress"] = f"127.0.0.1:{free_port()}"
    path = os.path.join(plane.work, "scheduler.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)
    command.append(f"--config={path}")
    plane._spawn("kube-scheduler", command)


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        with contextlib.suppress(OSError):
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                connection.close()
                return
        connection.close()
        time.sleep(0.2)
    raise RuntimeError(f"the extender on port {port} did not become ready")


def stats(port: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/stats")
        return dict(json.loads(connection.getresponse().read()))
    finally:
        connection.close()


def serve_states(nodes: int, directory: str, port: int) -> None:
    """In a child process: an extender whose cache holds ``nodes`` vendor nodes in mixed states."""
    inventory, _, _, _ = vendor_node(directory)
    base = node_state.build(inventory, [], whole=[c.name for c in inventory.cards], shared={})
    rng = random.Random(25)  # noqa: S311 (seeded node states)
    cache = extender_cache.ClusterCache()
    for index in range(nodes):
        busy = set(rng.sample(range(8), rng.randint(0, 8)))
        cards = tuple(dataclasses.replace(c, free=c.minor not in busy) for c in base.cards)
        text = dataclasses.replace(base, cards=cards, observed=time.time()).to_json()
        cache.set_lease(f"n{index}", node_state.lease(f"n{index}", "default", text, time.time()))
    http_server = server.ExtenderServer(("127.0.0.1", port), decisions.Decisions(cache))
    http_server.start()
    while True:
        time.sleep(3600)


def http_prioritize(nodes: int, calls: int, directory: str) -> dict[str, Any]:
    """Prioritize for ``nodes`` vendor nodes over real HTTP, the extender in its own process
    (as beside a scheduler), one kept-alive connection as the scheduler's client uses."""
    port = free_port()
    child = multiprocessing.get_context("fork").Process(
        target=serve_states, args=(nodes, directory, port), daemon=True
    )
    child.start()
    try:
        wait_ready(port)
        names = [f"n{i}" for i in range(nodes)]
        bodies = []
        for i in range(64):
            limits = {GCU: str(SIZES[i % 4])}
            pod = {
                "metadata": {"name": f"p{i}", "namespace": "b", "uid": f"u{i}"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
            }
            bodies.append(json.dumps({"Pod": pod, "NodeNames": names}).encode())
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        durations = []
        for i in range(calls + 100):
            started = time.perf_counter()
            connection.request("POST", "/prioritize", bodies[i % len(bodies)])
            connection.getresponse().read()
            if i >= 100:  # the first calls fill the score cache
                durations.append(time.perf_counter() - started)
        connection.close()
        durations.sort()
        server_side = stats(port)["verbs"]["prioritize"]
    finally:
        child.terminate()
        child.join(10)
    p99 = _quantile(durations, 0.99) * 1000
    return {
        "nodes": nodes,
        "calls": calls,
        "client_p50_ms": round(_quantile(durations, 0.5) * 1000, 3),
        "client_p99_ms": round(p99, 3),
        "server_p50_ms": server_side["p50_ms"],
        "server_p99_ms": server_side["p99_ms"],
        "target_p99_ms": TARGET_P99_MS,
        "met": p99 <= TARGET_P99_MS,
    }


def cluster_binaries() -> str | None:
    """The control plane's build directory when it is built (never builds it here)."""
    given = os.environ.get("ENFLAME_E2E_CLUSTER_DIR")
    if given:
        return given
    cache = "/var/cache/enflame-e2e"
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(cache)):
            bin_dir = os.path.join(cache, entry)
            if entry.startswith("cluster-") and os.path.isfile(os.path.join(bin_dir, "stamp")):
                return bin_dir
    return None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load and arm, each figure's mean, min and max over the seeds (per-seed figures are
    in ``runs``)."""

    def figures(run: dict[str, Any]) -> dict[str, float | None]:
        two = run["locality"].get("2_cards_steady", {})
        return {
            "2_card_switch_local_share": two.get("switch_local_share"),
            "pending_mean": run["pending_mean"],
            "pending_at_end": run["pending_at_end"],
            "steady_pods_never_bound": run["steady_pods_never_bound"],
            "create_to_bound_p50_ms": run["create_to_bound_ms"]["p50"],
            "create_to_bound_p99_ms": run["create_to_bound_ms"]["p99"],
            "prioritize_p99_ms": run.get("extender_ms", {}).get("prioritize", {}).get("p99_ms"),
        }

    result: dict[str, Any] = {}
    for run in runs:
        arm = f"load {run['load']}, {'with' if run['extender'] else 'without'} extender"
        entry = result.setdefault(arm, {"seeds": [], "figures": {}})
        entry["seeds"].append(run["seed"])
        for name, value in figures(run).items():
            entry["figures"].setdefault(name, []).append(value)
    for entry in result.values():
        for name, values in list(entry["figures"].items()):
            known = [v for v in values if v is not None]
            entry["figures"][name] = {
                "per_seed": values,
                "mean": round(statistics.fmean(known), 4) if known else None,
                "min": min(known) if known else None,
                "max": max(known) if known else None,
            }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--loads", default="0.8")
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=None, help="default: 3 lifetimes")
    parser.add_argument("--measure", type=float, default=120.0)
    parser.add_argument("--seeds", default="25,26,27,28,29")
    parser.add_argument("--interval", type=float, default=5.0, help="PodResources reads, s")
    parser.add_argument("--admission-delay", type=float, default=1.0)
    parser.add_argument("--shared-slices", type=int, default=6, help="gcu7 as K slices; 0: off")
    parser.add_argument("--modes", default="without,with")
    parser.add_argument("--http-calls", type=int, default=2000)
    options = parser.parse_args(argv)
    if options.warmup is None:
        options.warmup = 3 * options.lifetime
    results: dict[str, Any] = {
        "benchmark": "cluster",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {
            k: getattr(options, k)
            for k in (
                "nodes",
                "loads",
                "lifetime",
                "warmup",
                "measure",
                "seeds",
                "interval",
                "admission_delay",
                "shared_slices",
                "modes",
            )
        },
    }
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as directory:
        results["prioritize_over_http"] = http_prioritize(
            options.nodes, options.http_calls, os.path.join(directory, "http")
        )
        bin_dir = cluster_binaries()
        if bin_dir is None:
            results["cluster"] = (
                "not run: the control plane is not built "
                "(scripts/e2e-build-cluster.sh, or make e2e-cluster)"
            )
        else:
            runs = []
            for load in (float(x) for x in options.loads.split(",")):
                for seed in (int(x) for x in options.seeds.split(",")):
                    options.seed = seed
                    for mode in options.modes.split(","):
                        work = os.path.join(directory, f"run-{load}-{seed}-{mode}")
                        os.makedirs(work)
                        run = asyncio.run(one_run(bin_dir, work, load, mode == "with", options))
                        runs.append(run)
                        print(json.dumps(run), file=sys.stderr)
            results["runs"] = runs
            results["summary"] = summarize(runs)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
