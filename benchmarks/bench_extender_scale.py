"""Scheduler extender at 200, 1,000 and 5,000 nodes of 8 cards: filter and prioritize; JSON.

The extender's own HTTP server (``scheduler_extender.server``) in a child process, its cache
holding N vendor 8-card nodes (6 cards whole, 2 as 6 slices each) in mixed, seeded states with
``--bound-per-node`` bound GCU pods each (default 4: 20,000 at 5,000 nodes; half whole-card,
half shared-slice; one node in ten with its last pod not yet in its state, so pending), called
as kube-scheduler calls it in the shipped names-only mode (``nodeCacheCapable: true``:
``NodeNames`` only) over one kept-alive connection, for whole-card pods of 1/2/4/8 cards and
for shared-slice pods of 1, 2, 3, 2+2, 6, 9 and 4+4+4 slices (the last two refused by some
nodes). While it is called, a thread re-reads ``--renewals-per-s`` Lease renewals a second into
the cache, as the watch does (default N / 60: the plugin's 60 s heartbeat; each makes the node's
state anew), and the process keeps its heap as the server does (``--heap shipped``,
``scheduler_extender.heap``) or leaves CPython's collector as it is (``--heap default``).
Reported per N and pod kind: client-side p50/p99 of filter and prioritize; server-side p50/p99
over both kinds; the collector's generation-1 and -2 passes during the calls (count, longest,
total); the extender process's resident memory with the cache filled and after the calls.

Then, when the cluster tier's control plane is built (``bench_cluster.cluster_binaries()``), the
scheduler's own throughput (issue 38): per N and per arm a fresh etcd + kube-apiserver 1.20 +
kube-scheduler 1.20 with N Node objects only (8 cards each, each node's state Lease in the
same seeded mixed states, no kubelets, no plugins), kube-scheduler on the shipped configuration
in both arms (``percentageOfNodesToScore: 100`` included), ``extenders`` only in the "with" arm
(``enflame-scheduler-extender`` as its own process, names-only, ``--state-max-age`` long
enough that the static states stay known). ``--pods`` pods of 1/2/4 cards (50/35/15 %) are
created first (the extender, in its arm, sees them waiting), then kube-scheduler starts and
drains them; pods/s is the pods bound over the time from the first binding to the last. Both
arms share one control plane per N (the nodes are added once, the first arm's pods deleted
before the second). Reported beside it: the extender's own filter and prioritize
p50/p99 from its ``/stats``, and its resident memory with the nodes loaded and after the pods.

    .venv/bin/python benchmarks/bench_extender_scale.py [--nodes 200,1000,5000] [--calls 1000]
        [--heap shipped|default] [--renewals-per-s N] [--cluster-nodes 200,1000,5000]
        [--pods 500] [--modes without,with]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.client
import importlib
import itertools
import json
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import bench_cluster  # benchmarks/ is the script's directory, so it is on sys.path

from enflame_gcu import node_state

TARGET_P99_MS = 20.0


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _quantiles(durations: list[float]) -> dict[str, float]:
    ordered = sorted(durations)
    return {
        "p50_ms": round(bench_cluster._quantile(ordered, 0.5) * 1000, 3),
        "p99_ms": round(bench_cluster._quantile(ordered, 0.99) * 1000, 3),
    }


SHARED_CARDS = ("gcu6", "gcu7")  # served as slices; gcu0..gcu5 whole
SLICES = 6
# Slices per container of the shared pods; 9 and 4+4+4 do not fit every node (some are refused).
SHARED_SIZES = ((1,), (2,), (3,), (2, 2), (6,), (9,), (4, 4, 4))


def _pod(uid: str, name: str, node: str, cards: int, slices: Sequence[int]) -> dict[str, Any]:
    containers = []
    if cards:
        containers.append({"name": "c", "resources": {"limits": {bench_cluster.GCU: str(cards)}}})
    for index, count in enumerate(slices):
        limits = {bench_cluster.SHARED: str(count)}
        containers.append({"name": f"s{index}", "resources": {"limits": limits}})
    spec: dict[str, Any] = {"containers": containers}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "b", "uid": uid}, "spec": spec}


def cluster_states(nodes: int, bound_per_node: int, directory: str) -> tuple[
    list[tuple[str, str]], list[dict[str, Any]]
]:  # fmt: skip
    """``nodes`` vendor 8-card nodes (6 whole cards, 2 shared of 6 slices) in seeded mixed
    states, and ``bound_per_node`` bound pods per node, half whole-card, half shared-slice:
    the states list them all but one in ten nodes' last pod (still pending there)."""
    inventory, _, _, _ = bench_cluster.vendor_node(directory)
    base = node_state.build(inventory, [], whole=[c.name for c in inventory.cards], shared={})
    rng = random.Random(49)  # noqa: S311 (seeded node states)
    texts, pods = [], []
    whole = [c for c in base.cards if c.name not in SHARED_CARDS]
    for index in range(nodes):
        name = f"n{index}"
        cards = {c.name: c for c in whole}
        free_slices = dict.fromkeys(SHARED_CARDS, SLICES)
        held: dict[str, list[tuple[str, int]]] = {s: [] for s in SHARED_CARDS}
        listed: set[str] = set()
        for number in range(bound_per_node):
            key, uid = f"b/{name}-{number}", f"{name}-u{number}"
            counted = not (index % 10 == 0 and number == bound_per_node - 1)
            if number % 2 == 0:
                free = [c for c in cards.values() if c.free]
                if not free:
                    continue
                card = rng.choice(free)
                if counted:
                    cards[card.name] = dataclasses.replace(card, free=False, holder=key)
                pods.append(_pod(uid, key.split("/")[1], name, 1, ()))
            else:
                count = rng.choice((1, 2, 3))
                card_name = rng.choice(SHARED_CARDS)
                if free_slices[card_name] < count:
                    continue
                if counted:
                    free_slices[card_name] -= count
                    held[card_name].append((key, count))
                pods.append(_pod(uid, key.split("/")[1], name, 0, (count,)))
            if counted:
                listed.add(key)
        state = node_state.NodeState(
            tuple(cards[c.name] for c in whole),
            tuple(
                node_state.SharedCard(s, int(s[3:]), SLICES, free_slices[s], tuple(sorted(held[s])))
                for s in SHARED_CARDS
            ),
            frozenset(listed),
            observed=time.time(),
        )
        texts.append((name, state.to_json()))
    return texts, pods


def serve_cluster(
    nodes: int,
    bound_per_node: int,
    directory: str,
    port: int,
    *,
    heap_policy: str = "shipped",
    renewals_per_s: float = 0.0,
) -> None:
    """In a child process: an extender whose cache holds the nodes and bound pods of
    :func:`cluster_states`; with ``heap_policy`` "shipped" its heap kept as the server keeps it
    (:mod:`.heap`), with "default" CPython's collector left as it is; ``renewals_per_s`` Lease
    renewals a second (the plugin's 60 s heartbeat: nodes / 60) re-read into the cache in a
    thread, as the watch does; every collector pass of generation 1 or 2 logged to
    ``directory``/gc.log (generation, milliseconds)."""
    import gc
    import threading

    from enflame_gcu.scheduler_extender import cache as extender_cache
    from enflame_gcu.scheduler_extender import decisions, server

    texts, pods = cluster_states(nodes, bound_per_node, directory)
    cache = extender_cache.ClusterCache(max_age=86400)
    for name, text in texts:
        if hasattr(cache, "set_lease"):
            cache.set_lease(name, node_state.lease(name, "default", text, time.time()))
        else:  # a tree before issue 49 (measured through PYTHONPATH): states on Nodes
            cache.set_node(name, {node_state.ANNOTATION: text})  # type: ignore[attr-defined]
    cache.replace_pods(pods)
    del pods
    log = open(os.path.join(directory, "gc.log"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    started: dict[int, float] = {}

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[info["generation"]] = time.perf_counter()
        elif info["generation"] >= 1:
            took = time.perf_counter() - started.get(info["generation"], time.perf_counter())
            log.write(f"{info['generation']} {took * 1000:.3f}\n")

    gc.callbacks.append(timed)

    def renew() -> None:
        for name, text in itertools.cycle(texts):
            cache.set_lease(name, node_state.lease(name, "default", text, time.time()))
            time.sleep(1 / renewals_per_s)

    if renewals_per_s > 0:
        threading.Thread(target=renew, daemon=True).start()
    http_server = server.ExtenderServer(("127.0.0.1", port), decisions.Decisions(cache))
    http_server.start()
    if heap_policy == "shipped":
        from enflame_gcu.scheduler_extender import heap

        asyncio.run(heap.HeapKeeper().run())
    while True:
        time.sleep(3600)


def measure(
    nodes: int,
    calls: int,
    directory: str,
    bound_per_node: int = 4,
    *,
    heap_policy: str = "shipped",
    renewals_per_s: float = 0.0,
) -> dict[str, Any]:
    """Filter and prioritize ``calls`` times each for ``nodes`` nodes, for whole-card and for
    shared-slice pods; latencies, the collector's pauses during the calls, and memory."""
    port = bench_cluster.free_port()
    child = multiprocessing.get_context("fork").Process(
        target=serve_cluster,
        args=(nodes, bound_per_node, directory, port),
        kwargs={"heap_policy": heap_policy, "renewals_per_s": renewals_per_s},
        daemon=True,
    )
    child.start()
    try:
        bench_cluster.wait_ready(port, timeout=300)
        assert child.pid is not None
        rss_filled = _rss_mb(child.pid)
        gc_log = os.path.join(directory, "gc.log")
        names = [f"n{i}" for i in range(nodes)]
        bodies: dict[str, list[bytes]] = {"whole": [], "shared": []}
        for i in range(64):
            whole = _pod(f"u{i}", f"p{i}", "", bench_cluster.SIZES[i % 4], ())
            shared = _pod(f"s{i}", f"s{i}", "", 0, SHARED_SIZES[i % len(SHARED_SIZES)])
            for kind, pod in (("whole", whole), ("shared", shared)):
                bodies[kind].append(json.dumps({"Pod": pod, "NodeNames": names}).encode())
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client: dict[str, dict[str, list[float]]] = {
            kind: {"filter": [], "prioritize": []} for kind in bodies
        }
        for i in range(calls + 100):
            for kind, verb in itertools.product(bodies, ("filter", "prioritize")):
                started = time.perf_counter()
                connection.request("POST", f"/{verb}", bodies[kind][i % 64])
                answer = connection.getresponse()
                answer.read()
                if answer.status != 200:
                    raise SystemExit(f"{verb} answered {answer.status}")
                if i >= 100:  # the first calls fill the score cache
                    client[kind][verb].append(time.perf_counter() - started)
            if i == 99:  # the collector's pauses from here on
                with open(gc_log, "w", encoding="utf-8"):
                    pass
        connection.close()
        server_side = bench_cluster.stats(port)
        rss_after = _rss_mb(child.pid)
        with open(gc_log, encoding="utf-8") as handle:
            pauses = [line.split() for line in handle if line.strip()]
    finally:
        child.terminate()
        child.join(10)
    result: dict[str, Any] = {
        "nodes": nodes,
        "bound_pods": server_side["cache"]["bound_pods"],
        "calls_per_verb_and_kind": calls,
        "heap_policy": heap_policy,
        "renewals_per_s": round(renewals_per_s, 1),
    }
    for kind, verbs in client.items():
        result[kind] = {}
        for verb, durations in verbs.items():
            quantiles = _quantiles(durations)
            result[kind][verb] = {
                "client": quantiles,
                "met_p99": quantiles["p99_ms"] <= TARGET_P99_MS,
            }
    result["server_both_kinds"] = {
        verb: {k: server_side["verbs"][verb][k] for k in ("p50_ms", "p99_ms")}
        for verb in ("filter", "prioritize")
    }
    result["collector_pauses_during_calls"] = {
        f"generation_{gen}": {
            "count": len(ms),
            "max_ms": round(max(ms, default=0.0), 2),
            "total_ms": round(sum(ms), 1),
        }
        for gen in ("1", "2")
        for ms in [[float(took) for g, took in pauses if g == gen]]
    }
    result["request_body_kb"] = round(len(bodies["whole"][0]) / 1024, 1)
    result["rss_mb"] = {"cache_filled": rss_filled, "after_calls": rss_after}
    return result


POD_SIZES, POD_WEIGHTS = (1, 2, 4), (0.50, 0.35, 0.15)


def node_states(nodes: int, directory: str) -> list[str]:
    """``nodes`` node-state annotations in seeded mixed states (as ``serve_states``)."""
    inventory, _, _, _ = bench_cluster.vendor_node(directory)
    base = node_state.build(inventory, [], whole=[c.name for c in inventory.cards], shared={})
    rng = random.Random(25)  # noqa: S311 (seeded node states)
    texts = []
    for _ in range(nodes):
        busy = set(rng.sample(range(8), rng.randint(0, 6)))
        cards = tuple(dataclasses.replace(c, free=c.minor not in busy) for c in base.cards)
        texts.append(dataclasses.replace(base, cards=cards, observed=time.time()).to_json())
    return texts


async def add_nodes(client: Any, texts: list[str]) -> list[str]:
    """Node objects with capacity 8 cards, Ready, untainted, each with its state Lease."""
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.core_v1 import Node, NodeStatus

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", bench_cluster.GCU: "8"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    ready |= {"lastHeartbeatTime": now, "lastTransitionTime": now}
    names = [f"gcu-node-{i:04d}" for i in range(len(texts))]

    async def one(name: str, text: str) -> None:
        meta = {"name": name, "labels": {"kubernetes.io/hostname": name}}
        await client.create(Node.from_dict({"metadata": meta}))
        # The node's state as the device plugin publishes it: its Lease, in the namespace the
        # extender (same kubeconfig) reads.
        found = node_state.lease(name, "default", text, time.time())
        await client.create(Lease.from_dict(found), namespace="default")
        status = {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}
        await client.patch(NodeStatus, name, status, patch_type=bench_cluster._merge())
        # TaintNodesByCondition taints a new Node not-ready; no kubelet would lift it.
        await client.patch(Node, name, {"spec": {"taints": []}}, patch_type=bench_cluster._merge())

    for start in range(0, len(names), 50):
        await asyncio.gather(*(one(n, t) for n, t in zip(names[start : start + 50],
                                                          texts[start : start + 50],
                                                          strict=True)))  # fmt: skip
    return names


async def create_pods(client: Any, namespace: str, pods: int) -> dict[str, str]:
    """``pods`` GCU pods of 1/2/4 cards in a new namespace; name -> size."""
    from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    await client.create(
        ServiceAccount.from_dict({"metadata": {"name": "default", "namespace": namespace}})
    )
    rng = random.Random(38)  # noqa: S311 (the same seeded mix in both arms)
    sizes = {f"p{i:05d}": str(rng.choices(POD_SIZES, POD_WEIGHTS)[0]) for i in range(pods)}

    async def create(name: str, size: str) -> None:
        want = {bench_cluster.GCU: size}
        container = {
            "name": "c",
            "image": "bench.invalid/none",
            "resources": {"limits": want, "requests": {**want, "cpu": "10m"}},
        }
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"automountServiceAccountToken": False, "containers": [container]},
        }
        await client.create(Pod.from_dict(body))

    items = list(sizes.items())
    for start in range(0, pods, 50):
        await asyncio.gather(*(create(n, size) for n, size in items[start : start + 50]))
    return sizes


async def throughput_runs(
    bin_dir: str, work: str, nodes: int, pods: int, modes: Sequence[str]
) -> list[dict[str, Any]]:
    """Both arms at one size on one control plane (the nodes are added once): per arm, the
    pods are created first, then kube-scheduler starts and drains them; pods/s is the pods
    bound over the time from the first binding to the last."""
    from lightkube import AsyncClient, KubeConfig

    controlplane: Any = importlib.import_module("tests.cluster.controlplane")
    plane = controlplane.ControlPlane(
        bin_dir, work, controller_manager=False, scheduler=False, verbosity=0
    )
    runs: list[dict[str, Any]] = []
    with plane:
        client = AsyncClient(config=KubeConfig.from_file(plane.kubeconfig), field_manager="bench")
        try:
            started = time.monotonic()
            await add_nodes(client, node_states(nodes, work))
            added = round(time.monotonic() - started, 1)
            for mode in modes:
                load_before = [round(x, 2) for x in os.getloadavg()]
                bench_cluster.progress(f"{nodes} nodes, {mode} extender")
                run = await one_arm(plane, client, nodes, pods, mode == "with")
                run["seconds_to_add_nodes"] = added
                run["load_average"] = {
                    "before": load_before,
                    "after": [round(x, 2) for x in os.getloadavg()],
                }
                print(json.dumps(run), file=sys.stderr, flush=True)
                runs.append(run)
        finally:
            await client.close()
    return runs


async def one_arm(
    plane: Any, client: Any, nodes: int, pods: int, with_extender: bool
) -> dict[str, Any]:
    """One arm on a running control plane with its nodes."""
    from lightkube.resources.core_v1 import Pod as pod_kind

    namespace = f"bench-{'with' if with_extender else 'without'}"
    result: dict[str, Any] = {"nodes": nodes, "pods": pods, "extender": with_extender}
    sizes = await create_pods(client, namespace, pods)
    port = bench_cluster.free_port() if with_extender else None
    extender: subprocess.Popen[bytes] | None = None
    bound: dict[str, float] = {}
    done = asyncio.Event()

    async def follow() -> None:
        async for _, pod in client.watch(pod_kind, namespace=namespace):
            name = pod.metadata.name
            if pod.spec and pod.spec.nodeName and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) >= pods:
                    done.set()

    watcher = asyncio.ensure_future(follow())
    try:
        if port is not None:
            with open(os.path.join(plane.work, "extender.log"), "ab") as log:
                extender = subprocess.Popen(
                    [
                        bench_cluster.EXTENDER_BIN,
                        f"--kubeconfig={plane.kubeconfig}",
                        f"--port={port}",
                        "--bind-address=127.0.0.1",
                        "--state-max-age=86400",  # the states are static here
                    ],
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            bench_cluster.wait_ready(port)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                counts = bench_cluster.stats(port).get("cache", {})
                if counts.get("nodes", 0) >= nodes and counts.get("waiting_pods", 0) >= pods:
                    break
                await asyncio.sleep(0.5)
            result["extender_rss_mb"] = {"nodes_loaded": _rss_mb(extender.pid)}
        plane.scheduler_config = bench_cluster.scheduler_config(port)
        scheduler_started = time.monotonic()
        bench_cluster.start_scheduler(plane)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=max(180.0, pods / 2))
        times = sorted(bound.values())
        first, last = (times[0], times[-1]) if times else (scheduler_started, scheduler_started)
        result |= {
            "pods_bound": len(bound),
            "pods_by_size": {size: list(sizes.values()).count(size) for size in ("1", "2", "4")},
            "seconds_scheduler_start_to_first_bound": round(first - scheduler_started, 2),
            "seconds_first_to_last_bound": round(last - first, 2),
            "pods_per_s": round((len(bound) - 1) / (last - first), 1) if last > first else 0,
        }
        if port is not None and extender is not None:
            verbs = bench_cluster.stats(port)["verbs"]
            result["extender_ms"] = {
                verb: {k: verbs[verb][k] for k in ("calls", "p50_ms", "p99_ms", "max_ms")}
                for verb in verbs
            }
            result["extender_rss_mb"]["after_pods"] = _rss_mb(extender.pid)
    finally:
        await bench_cluster.cancel_all([watcher])
        scheduler = plane.processes.pop("kube-scheduler", None)
        if scheduler is not None:
            scheduler.terminate()
            scheduler.wait(10)
        if extender is not None:
            extender.terminate()
            extender.wait(10)
    # The next arm starts from the same free cards: these pods go (no kubelet: at once).
    await client.deletecollection(pod_kind, namespace=namespace, grace_period=0)
    return result


def scheduler_throughput(
    bin_dir: str, sizes: Sequence[int], pods: int, modes: Sequence[str], directory: str
) -> list[dict[str, Any]]:
    """Every size, both arms; the ratio of pods/s with to without."""
    runs: list[dict[str, Any]] = []
    for nodes in sizes:
        work = os.path.join(directory, f"plane-{nodes}")
        os.makedirs(work)
        runs += asyncio.run(throughput_runs(bin_dir, work, nodes, pods, modes))
    for nodes in sizes:
        arms = {r["extender"]: r for r in runs if r["nodes"] == nodes}
        if True in arms and False in arms and arms[False]["pods_per_s"]:
            ratio = arms[True]["pods_per_s"] / arms[False]["pods_per_s"]
            arms[True]["throughput_vs_without"] = round(ratio, 3)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every size; print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="200,1000,5000")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--bound-per-node", type=int, default=4, help="bound GCU pods per node")
    parser.add_argument(
        "--heap",
        default="shipped",
        choices=("shipped", "default"),
        help="the server's heap keeping (scheduler_extender.heap) or CPython's defaults",
    )
    parser.add_argument(
        "--renewals-per-s",
        type=float,
        default=-1.0,
        help="Lease renewals a second re-read while calling; default nodes / 60 (the plugin's "
        "heartbeat), 0 for none",
    )
    parser.add_argument("--cluster-nodes", default="200,1000,5000", help="'' to skip")
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--modes", default="without,with")
    options = parser.parse_args(argv)
    results: dict[str, Any] = {
        "benchmark": "scheduler extender at scale (names-only, no control plane)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "target_p99_ms": TARGET_P99_MS,
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-extender-") as directory:
        for nodes in (int(n) for n in options.nodes.split(",") if n):
            work = os.path.join(directory, str(nodes))
            os.makedirs(work)
            renewals = nodes / 60 if options.renewals_per_s < 0 else options.renewals_per_s
            results["sizes"].append(
                measure(
                    nodes,
                    options.calls,
                    work,
                    options.bound_per_node,
                    heap_policy=options.heap,
                    renewals_per_s=renewals,
                )
            )
        bin_dir = bench_cluster.cluster_binaries()
        sizes = [int(n) for n in options.cluster_nodes.split(",") if n]
        if not sizes:
            pass
        elif bin_dir is None:
            results["scheduler_throughput"] = "not run: the control plane is not built"
        else:
            results["scheduler_throughput"] = scheduler_throughput(
                bin_dir, sizes, options.pods, options.modes.split(","), directory
            )
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
