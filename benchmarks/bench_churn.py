"""Churn benchmark of the whole-card policies: locality kept under churn, and RPC latency; JSON.

Part 1 replays seeded churn traces (``churn.make_trace``) on simulated boards, in process, for
the topology policy, the topology policy without its fragmentation tie-break (how it chose
before), first-fit (the ``simple`` policy) and a best-fit reference enumerated independently
(``churn.Board.best_fit``). Part 2 sends the requests of one heavy trace per board to the real
``enflame-device-plugin`` process over gRPC (stub kubelet, unix sockets, as bench_plugin.py
does) and times GetPreferredAllocation; every answer must equal the in-process choice.

Environment: ``CHURN_EVENTS`` (events per trace, default 20000), ``CHURN_SEEDS`` (traces per
board, mix and load, default 1), ``CHURN_PARTS`` (``traces``, ``latency`` or both, the default:
``traces,latency``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from typing import Any

import churn
from bench_plugin import machine, summary

from enflame_gcu import allocation, devices, topology
from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing import plugin_process

RESOURCE = "enflame.com/gcu"
EVENTS = int(os.environ.get("CHURN_EVENTS", "20000"))
SEEDS = int(os.environ.get("CHURN_SEEDS", "1"))
PARTS = set(os.environ.get("CHURN_PARTS", "traces,latency").split(","))
MIXES = {"small": {1: 0.6, 2: 0.3, 4: 0.1}, "mixed": {1: 0.4, 2: 0.3, 4: 0.2, 8: 0.1}}
LOADS = {"moderate": 0.45, "heavy": 0.55}  # probability that an event is an arrival
CHURN_BOARDS = ["vendor-8card", "2socket-16card", "nosw-8card", "flat-4card"]
LATENCY = {  # board -> p99 target of GetPreferredAllocation (docs/benchmarks.md)
    "vendor-8card": None,
    "2socket-16card": 2.0,
    "2socket-64card": 20.0,
}
LATENCY_EVENTS = 2000
LATENCY_ROUNDS = 3  # the trace's requests are sent this many times (about 2,500 calls per board)
POLICIES_COMPARED = ("topology", "best_fit_reference")
NO_SWITCH_BOARD = """\
# Eight cards straight on root ports (no PCIe switch anywhere), four per NUMA node.
name: nosw-8card
description: Eight cards on their own root ports, no switches, two NUMA nodes
device: 0xc035
gcu0 0000:01:00.0 <- 0000:00:01.0 <- cpu  numa=0
gcu1 0000:02:00.0 <- 0000:00:02.0 <- cpu  numa=0
gcu2 0000:03:00.0 <- 0000:00:03.0 <- cpu  numa=0
gcu3 0000:04:00.0 <- 0000:00:04.0 <- cpu  numa=0
gcu4 0000:81:00.0 <- 0000:80:01.0 <- cpu  numa=1
gcu5 0000:82:00.0 <- 0000:80:02.0 <- cpu  numa=1
gcu6 0000:83:00.0 <- 0000:80:03.0 <- cpu  numa=1
gcu7 0000:84:00.0 <- 0000:80:04.0 <- cpu  numa=1
"""


def board_path(name: str, directory: str) -> str:
    """A built-in topology name, or the path of this benchmark's own board file."""
    if name != "nosw-8card":
        return name
    path = os.path.join(directory, "nosw-8card.topo")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(NO_SWITCH_BOARD)
    return path


def discover(name: str, directory: str) -> topology.Topology:
    """The board's topology as the plugin sees it: simulated on disk, then discovered."""
    root = tempfile.mkdtemp(dir=directory)
    simulate.create(root, topofile.load(board_path(name, directory)))
    return topology.Topology.from_inventory(devices.discover(root))


def policies(topo: topology.Topology, board: churn.Board) -> dict[str, churn.Choose]:
    """The compared policies as ``choose(available, size)``."""
    ours = allocation.TopologyPolicy(topo)
    before = allocation.TopologyPolicy(topo, spare_groups=False)
    first = allocation.SimplePolicy()
    chosen: dict[str, churn.Choose] = {
        "topology": lambda a, s: ours.choose(a, [], s),
        "topology_before": lambda a, s: before.choose(a, [], s),
        "first_fit": lambda a, s: first.choose(a, [], s),
    }
    if len(board.names) <= 16:  # the reference enumerates every set
        chosen["best_fit_reference"] = board.best_fit
    return chosen


def busy_share(trace: list[churn.Event], cards: int) -> float:
    """Mean share of cards in use over the trace's events (the same for every policy)."""
    sizes: dict[int, int] = {}
    busy = total = 0
    for event in trace:
        if event.size and busy + event.size <= cards:
            sizes[event.pod] = event.size
            busy += event.size
        elif not event.size:
            busy -= sizes.pop(event.pod)
        total += busy
    return round(total / len(trace) / cards, 3)


def parting(
    board: churn.Board,
    ours: list[tuple[list[str], int, list[str]]],
    reference: list[tuple[list[str], int, list[str]]],
) -> dict[str, Any] | None:
    """The first request the two policies answer differently (same free cards until then).

    Until that request both have made the same choices, so their counts agree up to it; what
    follows depends on which pods then hold which cards, and a gap either way is a consequence
    of this one choice. None: they agree on the whole trace.
    """
    for index, ((free, size, mine), (_free, _size, theirs)) in enumerate(
        zip(ours, reference, strict=True)
    ):
        if mine != theirs:
            return {
                "request": index,
                "size": size,
                "free": free,
                "ours": mine,
                "reference": theirs,
                "ours_splits_intact_switch": board.score(free, mine).splits > 0,
                "reference_splits_intact_switch": board.score(free, theirs).splits > 0,
                "same_locality": board.score(free, mine).locality
                == board.score(free, theirs).locality,
                "switch_cards_touched": [switch_cards(board, mine), switch_cards(board, theirs)],
            }
    return None


def switch_cards(board: churn.Board, cards: list[str]) -> int:
    """Cards (free or not) under the switches a set touches."""
    return sum(board.sizes[0][key] for key in board.counts(cards, 0))


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's split target on one trace, and the switch-local gap to the reference."""
    ours = result["policies"]["topology"]
    avoidable = ours["avoidable_intact_switch_splits"]
    met: dict[str, Any] = {
        "no_avoidable_split": avoidable["single"] + avoidable["partial"] == 0
        and avoidable["not_checked"] == 0
    }
    reference = result["policies"].get("best_fit_reference")
    if reference and ours["local"]["switch"]["eligible"]:
        met["switch_local_minus_reference"] = (
            ours["local"]["switch"]["got"] - reference["local"]["switch"]["got"]
        )
    return met


def run_churn(directory: str) -> list[dict[str, Any]]:
    """Every churn trace, every policy."""
    results = []
    seed = 14_000
    for name in CHURN_BOARDS:
        topo = discover(name, directory)
        board = churn.Board(topo)
        for mix in MIXES:
            for load in LOADS:
                for _ in range(SEEDS):
                    seed += 1
                    results.append(one_trace(topo, board, name, mix=mix, load=load, seed=seed))
    return results


def one_trace(
    topo: topology.Topology, board: churn.Board, name: str, *, mix: str, load: str, seed: int
) -> dict[str, Any]:
    """One seeded trace, replayed by every policy."""
    cards = len(board.names)
    trace = churn.make_trace(cards, MIXES[mix], LOADS[load], seed, EVENTS)
    result: dict[str, Any] = {
        "board": name,
        "mix": mix,
        "load": load,
        "seed": seed,
        "events": len(trace),
        "mean_busy_share": busy_share(trace, cards),
        "policies": {},
    }
    requests: dict[str, list[tuple[list[str], int, list[str]]]] = {}
    for policy, choose in policies(topo, board).items():
        started = time.perf_counter()
        requests[policy] = []
        replayed = churn.replay(board, trace, choose, requests[policy]).summary()
        replayed["seconds"] = round(time.perf_counter() - started, 1)
        result["policies"][policy] = replayed
    if "best_fit_reference" in requests:
        result["parting_from_reference"] = parting(
            board, requests["topology"], requests["best_fit_reference"]
        )
    result["targets"] = targets(result)
    part = result.get("parting_from_reference")
    cause = "" if part is None else f" parted from the reference: {parting_cause(part)}"
    print(f"# {name} {mix} {load} {seed}: {result['targets']}{cause}", file=sys.stderr)
    return result


def totals(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """Per board and policy, summed over its traces; and how the topology policy compares."""
    result: dict[str, Any] = {}
    for trace in traces:
        board = result.setdefault(trace["board"], {"traces": 0, "policies": {}})
        board["traces"] += 1
        for policy, figures in trace["policies"].items():
            mine = board["policies"].setdefault(
                policy,
                {"switch_local": [0, 0, 0], "violations": [0, 0], "avoidable_splits": 0},
            )
            row = figures["local"]["switch"]
            for i, key in enumerate(("got", "found", "eligible")):
                mine["switch_local"][i] += row[key]
            mine["violations"][0] += figures["violations"]["port"]
            mine["violations"][1] += figures["violations"]["numa"]
            avoidable = figures["avoidable_intact_switch_splits"]
            mine["avoidable_splits"] += avoidable["single"] + avoidable["partial"]
        gap = trace["targets"].get("switch_local_minus_reference")
        if gap is not None:
            board.setdefault("switch_local_minus_reference", []).append(gap)
            part = trace.get("parting_from_reference")
            causes = board.setdefault("partings_from_reference", {})
            cause = "never" if part is None else parting_cause(part)
            causes[cause] = causes.get(cause, 0) + 1
    for board in result.values():
        gaps = board.get("switch_local_minus_reference")
        if gaps is not None:
            ours, reference = (board["policies"][p]["switch_local"][0] for p in POLICIES_COMPARED)
            board["switch_local_at_least_reference"] = ours >= reference
            board["traces_below_reference"] = sum(1 for gap in gaps if gap < 0)
            board["traces_above_reference"] = sum(1 for gap in gaps if gap > 0)
    return result


def parting_cause(part: dict[str, Any]) -> str:
    """Why the topology policy first answered differently from the reference, in a few words."""
    size = "single" if part["size"] == 1 else f"{part['size']}-card"
    if part["reference_splits_intact_switch"] and not part["ours_splits_intact_switch"]:
        return f"{size}: reference splits an intact switch, ours does not"
    ours, reference = part["switch_cards_touched"]
    if ours < reference:
        return f"{size}: ours takes cards under smaller switches"
    both = "split one" if part["ours_splits_intact_switch"] else "keep switches whole"
    return f"{size}: another tie-break (both {both})"


async def run_latency(name: str, target: float | None, directory: str) -> dict[str, Any]:
    """GetPreferredAllocation for every request of a heavy mixed trace, through the plugin."""
    topo = discover(name, directory)
    board = churn.Board(topo)
    trace = churn.make_trace(len(board.names), MIXES["mixed"], LOADS["heavy"], 1, LATENCY_EVENTS)
    ours = allocation.TopologyPolicy(topo)
    requests: list[tuple[list[str], int, list[str]]] = []
    churn.replay(board, trace, lambda a, s: ours.choose(a, [], s), requests)
    policy_only = []  # the policy's own CPU time per request, in this process
    for available, size, _chosen in requests:
        started = time.thread_time()
        ours.choose(available, [], size)
        policy_only.append((time.thread_time() - started) * 1000)
    messages = []
    for available, size, _chosen in requests:
        message = api_pb2.PreferredAllocationRequest()
        message.container_requests.add(available_deviceIDs=available, allocation_size=size)
        messages.append(message)
    async with plugin_process.running_node(board_path(name, directory)) as node:
        stub = node.kubelet.plugins[RESOURCE].stub
        for message in messages[:20]:  # warm-up
            await stub.GetPreferredAllocation(message, timeout=5)
        gc.freeze()
        empty = api_pb2.Empty()
        floor = []  # an RPC that does no work, through the same client and server
        samples, mismatches = [], 0
        # Interleaved, so that the floor and the request see the same load on the machine.
        for message, (_available, _size, chosen) in zip(
            messages * LATENCY_ROUNDS, requests * LATENCY_ROUNDS, strict=True
        ):
            started = time.perf_counter()
            await stub.GetDevicePluginOptions(empty, timeout=5)
            floor.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            response = await stub.GetPreferredAllocation(message, timeout=5)
            samples.append((time.perf_counter() - started) * 1000)
            mismatches += list(response.container_responses[0].deviceIDs) != chosen
        gc.unfreeze()
    figures = summary(samples)
    return {
        "board": name,
        **figures,
        "sizes": sorted({size for _a, size, _c in requests}),
        "answers_differing_from_in_process": mismatches,
        "empty_rpc_floor": summary(floor),
        "policy_cpu_in_process": summary(policy_only),
        "target_p99_ms": target,
        "met": None if target is None else figures["p99_ms"] <= target and not mismatches,
    }


def main() -> int:
    """Run both parts, print the JSON document; exit 1 when a target is missed."""
    if not PARTS or PARTS - {"traces", "latency"}:
        print(f"CHURN_PARTS: {','.join(sorted(PARTS))!r}; valid: traces, latency", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="churn-", dir="/tmp") as directory:
        document: dict[str, Any] = {"benchmark": "churn", "machine": machine()}
        document["load_average_at_start"] = os.getloadavg()
        document["traces"] = run_churn(directory) if "traces" in PARTS else []
        document["totals"] = totals(document["traces"])
        document["get_preferred_allocation"] = [
            asyncio.run(run_latency(name, target, directory))
            for name, target in LATENCY.items()
            if "latency" in PARTS
        ]
        document["load_average_at_end"] = os.getloadavg()
    print(json.dumps(document, indent=2))
    # Targets: no avoidable split on any trace; per board, switch-local sets at least as often
    # as the reference over its traces (single traces drift apart by chance once two policies
    # have chosen differently: the per-trace gaps are in the JSON and in docs/benchmarks.md).
    missed: list[Any] = [t for t in document["traces"] if not t["targets"]["no_avoidable_split"]]
    missed += [
        b for b in document["totals"].values() if b.get("switch_local_at_least_reference") is False
    ]
    missed += [r for r in document["get_preferred_allocation"] if r["met"] is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
