"""Unmodified ``enflame.com/gcu: N`` pods on a DRA node: switch-local share under churn; JSON.

Replays seeded churn traces (``churn.make_trace``, the model of bench_churn.py) at about 80 %
of the cards busy, on simulated boards, for several ways of choosing a pod's N cards:

- ``device_plugin``: the device plugin's topology policy (``allocation.TopologyPolicy``);
- ``dra_plain``: the KEP-5004 path without a webhook: the scheduler's claim asks N devices of
  the class, no constraint, and its allocator takes the first N free devices in the order the
  driver publishes them (DRA.md §5: slices scanned by name, devices in order, first fit);
- ``dra_switch_local``: the claim a rewriting webhook would make for the pod: ``firstAvailable``
  same ``pcieSwitch`` -> same ``pcieRootPort`` -> same ``numaNode`` -> any N, each alternative
  with a ``matchAttribute`` constraint, resolved as the allocator does (first alternative that
  fits; in it, the first device in published order whose attribute group has N free; a device
  lacking the attribute is never chosen for that alternative). One card: no constraint;
- ``dra_switch_local_busiest_first``: the same claim, with the devices published busiest switch
  first (fewest free cards, then published order), so the allocator's first fit becomes a best
  fit. Idealised: the order is current at every allocation;
- ``dra_topology_order_lagK``: the same claim over the order the driver publishes
  (``resourceslices.allocation_order``: fewest free in the switch, smaller switch, fewest free
  in the root port, NUMA node, minor) from what it knows: every release, and every allocation
  but the last K (the scheduler made them before their Prepare reached the driver and it
  re-published). ``lag0``: current at every allocation;
- ``dra_topology_order_snapshotK``: the order published just after allocation i - K, releases
  since then unknown too (a driver that re-publishes only every K allocations or so);
- ``dra_topology_order_static``: that order computed once with nothing held, never re-published;
- ``dra_plain_topology_order_lagK``: the plain path (no webhook) over the driver's topology
  order, lag 0 and 1.

The devices, their order and attributes are what the driver publishes for the board
(``resourceslices.node_devices``), not a copy. A request that does not fit in the free cards is
rejected the same way for every policy (``rejected``); every chooser places a pod that fits,
so no policy leaves more pods pending than another.

Environment: ``CHURN_EVENTS`` (default 20000), ``CHURN_SEEDS`` (traces per board and mix,
default 3), ``TARGET_BUSY`` (default 0.8), ``ORDER_LAGS`` (default ``0,1,2,4,8``),
``ORDER_SNAPSHOTS`` (default ``1,4``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import churn
from bench_churn import MIXES, board_path, busy_share
from bench_plugin import machine

from enflame_gcu import allocation, devices, health, resourceslices, topology
from enflame_gcu.simulation import simulate, topofile

EVENTS = int(os.environ.get("CHURN_EVENTS", "20000"))
SEEDS = int(os.environ.get("CHURN_SEEDS", "3"))
TARGET_BUSY = float(os.environ.get("TARGET_BUSY", "0.8"))
BOARDS = ["vendor-8card", "2socket-16card", "nosw-8card"]
LAGS = [int(x) for x in os.environ.get("ORDER_LAGS", "0,1,2,4,8").split(",")]
SNAPSHOTS = [int(x) for x in os.environ.get("ORDER_SNAPSHOTS", "1,4").split(",")]
LEVELS = ("pcieSwitch", "pcieRootPort", "resource.kubernetes.io/numaNode")


def published(root: str) -> list[tuple[str, dict[str, Any]]]:
    """``[(gcuN, {attribute: value})]`` in the order the driver publishes the devices."""
    inventory = devices.discover(root)
    report = health.check(root, inventory.cards)
    return [
        (resourceslices.node_device(device["name"]), _values(device))
        for device in resourceslices.node_devices(inventory, report.healthy())
    ]


def raw_devices(root: str) -> list[dict[str, Any]]:
    """The devices as the driver publishes them (in minor order)."""
    inventory = devices.discover(root)
    return resourceslices.node_devices(inventory, health.check(root, inventory.cards).healthy())


def _values(device: dict[str, Any]) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in device["attributes"].items()}


def first_fit(order: Sequence[str]) -> churn.Choose:
    """The plain path: the first ``size`` free devices in published order."""
    rank = {name: i for i, name in enumerate(order)}

    def choose(available: Sequence[str], size: int) -> list[str]:
        return sorted(available, key=rank.__getitem__)[:size]

    return choose


def switch_local(devices_in_order: list[tuple[str, dict[str, Any]]]) -> churn.Choose:
    """The webhook's claim: firstAvailable over matchAttribute levels, then any."""
    order = [name for name, _ in devices_in_order]
    attributes = dict(devices_in_order)
    plain = first_fit(order)

    def choose(available: Sequence[str], size: int) -> list[str]:
        if size == 1:
            return plain(available, size)
        free = [name for name in order if name in set(available)]
        for level in LEVELS:
            groups: dict[Any, list[str]] = {}
            for name in free:
                value = attributes[name].get(level)
                if value is not None:  # a device lacking the attribute is never chosen
                    groups.setdefault(value, []).append(name)
            for name in free:  # the first device whose group has room decides
                value = attributes[name].get(level)
                if value is not None and len(groups[value]) >= size:
                    return groups[value][:size]
        return plain(available, size)

    return choose


def busiest_first(devices_in_order: list[tuple[str, dict[str, Any]]]) -> churn.Choose:
    """The switch-local claim over devices ordered busiest switch first at each allocation."""
    order = [name for name, _ in devices_in_order]
    attributes = dict(devices_in_order)
    rank = {name: i for i, name in enumerate(order)}

    def choose(available: Sequence[str], size: int) -> list[str]:
        free: dict[Any, int] = {}
        for name in available:
            switch = attributes[name].get("pcieSwitch")
            free[switch] = free.get(switch, 0) + 1
        ranked = sorted(
            order,
            key=lambda n: (free.get(attributes[n].get("pcieSwitch"), len(order) + 1), rank[n]),
        )
        return switch_local([(n, attributes[n]) for n in ranked])(available, size)

    return choose


def topology_ordered(
    raw: list[dict[str, Any]], lag: int, *, snapshot: bool = False, plain: bool = False
) -> churn.Choose:
    """The switch-local claim over the driver's topology order (``allocation_order``), stale.

    ``lag``: the driver does not know the last ``lag`` allocations yet (made by the scheduler
    before their Prepare reached the driver and it re-published); it knows every release (an
    Unprepare comes with it). ``snapshot``: the order is the one published just after
    allocation i - ``lag``, releases since then unknown too (a driver re-publishing only now
    and then). ``lag`` 0: current at every allocation. ``plain``: the scheduler's own claim
    (no webhook: first fit, no constraint) over that order.
    """
    names = {resourceslices.node_device(d["name"]): d["name"] for d in raw}
    recent: list[list[str]] = []  # the cards of the last allocations, newest last
    history: list[set[str]] = []  # cards busy just after each allocation

    def choose(available: Sequence[str], size: int) -> list[str]:
        held = set(names) - set(available)
        if lag and snapshot:
            held = history[-lag] if len(history) >= lag else set()
        elif lag:
            held -= {card for cards in recent[-lag:] for card in cards}
        order = [
            (resourceslices.node_device(d["name"]), _values(d))
            for d in resourceslices.allocation_order(raw, {names[c] for c in held})
        ]
        if plain:
            chosen = first_fit([name for name, _ in order])(available, size)
        else:
            chosen = switch_local(order)(available, size)
        recent.append(chosen)
        history.append(set(names) - set(available) | set(chosen))
        del recent[: -max(lag, 1)], history[: -max(lag, 1)]
        return chosen

    return choose


def calibrate(cards: int, mix: dict[int, float], seed: int) -> tuple[float, float]:
    """The arrival probability whose trace keeps about ``TARGET_BUSY`` of the cards busy."""
    best = (0.5, 0.0)
    for step in range(40, 90):
        arrive = step / 100
        share = busy_share(churn.make_trace(cards, mix, arrive, seed, 4000), cards)
        if abs(share - TARGET_BUSY) < abs(best[1] - TARGET_BUSY):
            best = (arrive, share)
    return best


def one_board(name: str, directory: str) -> dict[str, Any]:
    root = tempfile.mkdtemp(dir=directory)
    simulate.create(root, topofile.load(board_path(name, directory)))
    topo = topology.Topology.from_inventory(devices.discover(root))
    board = churn.Board(topo)
    order = published(root)
    policy = allocation.TopologyPolicy(topo)
    chooses: dict[str, churn.Choose] = {
        "device_plugin": lambda a, s: policy.choose(a, [], s),
        "dra_plain": first_fit([n for n, _ in order]),
        "dra_switch_local": switch_local(order),
        "dra_switch_local_busiest_first": busiest_first(order),
        **{
            f"dra_topology_order_lag{lag}": topology_ordered(raw_devices(root), lag) for lag in LAGS
        },
        **{
            f"dra_topology_order_snapshot{lag}": topology_ordered(
                raw_devices(root), lag, snapshot=True
            )
            for lag in SNAPSHOTS
        },
        **{
            f"dra_plain_topology_order_lag{lag}": topology_ordered(
                raw_devices(root), lag, plain=True
            )
            for lag in (0, 1)
        },
        # Ordered once with nothing held, never re-published (lone cards first: a static order).
        "dra_topology_order_static": switch_local(
            [
                (resourceslices.node_device(d["name"]), _values(d))
                for d in resourceslices.allocation_order(raw_devices(root), ())
            ]
        ),
    }
    cards = len(board.names)
    result: dict[str, Any] = {"board": name, "cards": cards, "mixes": {}}
    seed = 51_000
    for mix_name, mix in MIXES.items():
        totals: dict[str, dict[str, Any]] = {
            p: {"got": 0, "eligible": 0, "found": 0, "rejected": 0} for p in chooses
        }
        shares = []
        for _ in range(SEEDS):
            seed += 1
            arrive, _ = calibrate(cards, mix, seed)
            trace = churn.make_trace(cards, mix, arrive, seed, EVENTS)
            shares.append(busy_share(trace, cards))
            for policy_name, choose in chooses.items():
                summary = churn.replay(board, trace, choose).summary()
                row = summary["local"]["switch"]
                for key in ("got", "eligible", "found"):
                    totals[policy_name][key] += row[key]
                totals[policy_name]["rejected"] += summary["rejected"]
        for row in totals.values():
            row["switch_local_share"] = (
                round(row["got"] / row["eligible"], 4) if row["eligible"] else None
            )
        dp = totals["device_plugin"]["switch_local_share"]
        ours = totals["dra_switch_local"]["switch_local_share"]
        plain = totals["dra_plain"]["switch_local_share"]
        ordered = totals["dra_switch_local_busiest_first"]["switch_local_share"]
        ratios = {
            p: round(row["switch_local_share"] / dp, 4)
            for p, row in totals.items()
            if dp and row["switch_local_share"] is not None
        }
        result["mixes"][mix_name] = {
            "vs_device_plugin": ratios,
            "mean_busy_share": round(sum(shares) / len(shares), 3),
            "policies": totals,
            "ours_vs_device_plugin": round(ours / dp, 4) if dp and ours is not None else None,
            "busiest_first_vs_device_plugin": (
                round(ordered / dp, 4) if dp and ordered is not None else None
            ),
            "plain_vs_device_plugin": round(plain / dp, 4) if dp and plain is not None else None,
        }
        print(f"# {name} {mix_name}: {result['mixes'][mix_name]}", file=sys.stderr)
    return result


def main() -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-dra-ext-") as directory:
        boards = [one_board(name, directory) for name in BOARDS]
    print(
        json.dumps(
            {
                "benchmark": "dra_extended_resource_switch_local",
                "machine": machine(),
                "events_per_trace": EVENTS,
                "seeds": SEEDS,
                "target_busy_share": TARGET_BUSY,
                "boards": boards,
                "seconds": round(time.perf_counter() - started, 1),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
