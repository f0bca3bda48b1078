"""A simulated ``efsmi`` for simulated nodes: the DRS commands, their tables, state in the tree.

:func:`install` writes ``<root>/usr/local/bin/efsmi``, a script that runs this module for that
node; the efsmi adapter runs it like the real tool, so tests, the demo and the benchmarks take
the real code path. It prints the tables EFML.md §5 describes and keeps DRS state (on/off per
card, instances) in ``<root>/.enflame-sim/drs.json`` under a lock, so concurrent calls and
killed callers behave as with the real tool.

Profiles: a card is cut in 6 compute slices (4 when its memory does not divide by 6); every
divisor ``d`` of that is a profile ``<d>g.<d*mem/slices>gb`` that fits ``slices/d`` times. An
instance needs DRS on and room in both slices and memory, as on the hardware.

Faults for tests: ``<root>/.enflame-sim/efsmi-faults.json`` maps a command (``create``,
``destroy``, ``list``, ``profiles``, ``cards``) to ``fail`` (exit 1), ``hang`` (sleep) or
``slow:<seconds>`` (sleep that long, then do the work: a create that outlasts a deadline).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from enflame_gcu import fileio, products
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.topofile import SimCard

STATE_FILE = "drs.json"
FAULTS_FILE = "efsmi-faults.json"
SCRIPT = "/usr/local/bin/efsmi"


def install(root: str) -> str:
    """Write the node's ``efsmi`` script; returns its path (outside the tree's /dev and /sys)."""
    path = fileio.host_path(root, SCRIPT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    script = (
        "#!/bin/sh\n"
        f"exec {sys.executable} -m enflame_gcu.simulation.efsmi_sim "
        f'--sim-root {os.path.abspath(root)} "$@"\n'
    )
    fileio.atomic_write_text(path, script, mode=0o755)
    return path


def slices_of(card: SimCard) -> tuple[int, int]:
    """``(compute slices, memory in GB)`` of a simulated card."""
    memory = (products.memory_mib(products.product_name(card.device_id)) or 0) // 1024
    memory = memory or 32
    return (6 if memory % 6 == 0 else 4), memory


def profiles(card: SimCard) -> list[dict[str, Any]]:
    """The card's profiles: name, id, count, memory (GB), slices."""
    total, memory = slices_of(card)
    result = []
    for number, size in enumerate(d for d in range(1, total + 1) if total % d == 0):
        gb = size * memory // total
        result.append(
            {"name": f"{size}g.{gb}gb", "id": str(number), "count": total // size, "memory": gb}
        )
    return result


@contextlib.contextmanager
def _state(root: str) -> Iterator[dict[str, Any]]:
    folder = os.path.join(root, simulate.STATE_DIR)
    path = os.path.join(folder, STATE_FILE)
    fd = os.open(os.path.join(folder, STATE_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                state: dict[str, Any] = json.load(handle)
        except FileNotFoundError:
            state = {"drs": {}, "instances": [], "next_id": 1}
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            fileio.atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    finally:
        os.close(fd)


def _fault(root: str, command: str) -> None:
    try:
        with open(os.path.join(root, simulate.STATE_DIR, FAULTS_FILE), encoding="utf-8") as fh:
            faults = json.load(fh)
    except FileNotFoundError:
        return
    what = faults.get(command)
    if what == "hang":
        time.sleep(3600)
    if isinstance(what, str) and what.startswith("slow:"):
        time.sleep(float(what.removeprefix("slow:")))
    if what == "fail":
        raise SystemExit(f"efsmi: simulated failure of {command}")


def set_fault(root: str, command: str, what: str | None) -> None:
    """Make ``command`` fail or hang from now on (``None``: behave again)."""
    path = os.path.join(root, simulate.STATE_DIR, FAULTS_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            faults = json.load(handle)
    except FileNotFoundError:
        faults = {}
    if what is None:
        faults.pop(command, None)
    else:
        faults[command] = what
    fileio.atomic_write_text(path, json.dumps(faults) + "\n")


def instances(root: str) -> list[dict[str, Any]]:
    """Every instance on the node (for tests: what exists, whatever the driver believes)."""
    with _state(root) as state:
        return list(state["instances"])


def _present(root: str) -> list[SimCard]:
    topo, state = simulate.open_node(root)
    if not state.driver_loaded:
        raise SystemExit("efsmi: no Enflame driver loaded")
    return [card for card in topo.cards if card.minor not in state.unplugged]


def _card(root: str, index: int) -> SimCard:
    for card in _present(root):
        if card.minor == index:
            return card
    raise SystemExit(f"efsmi: invalid device index {index}")


def _print_cards(root: str) -> None:
    cards = _present(root)
    with _state(root) as state:
        drs = dict(state["drs"])
    rule = "+" + "=" * 78 + "+"
    print(rule)
    print(f"| {'EFSMI (simulated)':<76} |")
    print(f"| {'DEV    NAME':<27}| {'FW VER':<15}| {'BUS ID':<15}| {'':<15} |")
    print(f"| {'TEMP   PWR':<27}| {'MEM':<15}| {'':<15}| {'VIRT':<15} |")
    print(rule)
    for card in cards:
        _, memory = slices_of(card)
        product = products.product_name(card.device_id).replace("-", " ")
        virt = "DRS" if drs.get(str(card.minor)) else "Disable"
        first = f"{card.minor:<6} Enflame {product}"
        print(f"| {first:<27}| {'1.0.0':<15}| {card.bdf:<15}| {'':<15} |")
        second = f"{'35C':<6} 25W / 300W"
        memory_cell = f"0MiB / {memory * 1024}MiB"
        print(f"| {second:<27}| {memory_cell:<15}| {'':<15}| {virt:<15} |")
        print(rule)


def _print_profiles(root: str, index: int) -> None:
    card = _card(root, index)
    print(f"| {'GCU':<4} {'Profile':<10} {'ID':<4} {'Count':<6} {'Memory':<8} {'SIP':<4} |")
    for profile in profiles(card):
        print(
            f"| {index:<4} {profile['name']:<10} {profile['id']:<4} {profile['count']:<6} "
            f"{str(profile['memory']) + 'GB':<8} {profile['name'].split('g')[0]:<4} |"
        )


def _print_instances(root: str, index: int | None) -> None:
    if index is not None:
        _card(root, index)
    with _state(root) as state:
        listed = [i for i in state["instances"] if index is None or i["index"] == index]
    print(f"| {'GCU':<4} {'Profile':<10} {'Instance':<9} {'UUID':<36} |")
    for item in listed:
        print(f"| {item['index']:<4} {item['profile']:<10} {item['id']:<9} {item['uuid']:<36} |")


def _create(root: str, index: int, profile_id: str) -> None:
    card = _card(root, index)
    total, memory = slices_of(card)
    offered = {p["id"]: p for p in profiles(card)}
    if profile_id not in offered:
        raise SystemExit(f"efsmi: card {index} has no DRS profile {profile_id}")
    profile = offered[profile_id]
    size = int(profile["name"].split("g")[0])
    with _state(root) as state:
        if not state["drs"].get(str(index)):
            raise SystemExit(f"efsmi: DRS is disabled on card {index}")
        mine = [i for i in state["instances"] if i["index"] == index]
        used = sum(int(i["profile"].split("g")[0]) for i in mine)
        used_memory = sum(int(i["profile"].split(".")[1][:-2]) for i in mine)
        if used + size > total or used_memory + profile["memory"] > memory:
            raise SystemExit(f"efsmi: card {index} has no room for a {profile['name']} instance")
        state["instances"].append(
            {
                "index": index,
                "profile": profile["name"],
                "id": str(state["next_id"]),
                "uuid": str(uuid.uuid4()),
            }
        )
        state["next_id"] += 1


def _destroy(root: str, index: int, instance_id: str) -> None:
    _card(root, index)
    with _state(root) as state:
        kept = [
            i for i in state["instances"] if not (i["index"] == index and i["id"] == instance_id)
        ]
        if len(kept) == len(state["instances"]):
            raise SystemExit(f"efsmi: card {index} has no instance {instance_id}")
        state["instances"] = kept


def _set_drs(root: str, index: int, on: bool) -> None:
    _card(root, index)
    with _state(root) as state:
        if not on and any(i["index"] == index for i in state["instances"]):
            raise SystemExit(f"efsmi: card {index} still has DRS instances")
        state["drs"][str(index)] = on


def main(argv: Sequence[str] | None = None) -> int:
    """``efsmi`` as the adapter calls it, for the node given by ``--sim-root``."""
    parser = argparse.ArgumentParser(prog="efsmi")
    parser.add_argument("--sim-root", required=True)
    parser.add_argument("-i", dest="index", type=int)
    parser.add_argument("-L", dest="list_instances", action="store_true")
    parser.add_argument("--drs", nargs="?", const="", choices=["on", "off", ""])
    parser.add_argument("--list-profile", action="store_true")
    parser.add_argument("--create-instance", metavar="PROFILE_ID")
    parser.add_argument("--destroy-instance", metavar="INSTANCE_ID")
    args = parser.parse_args(argv)
    root = args.sim_root
    if args.list_instances:
        _fault(root, "list")
        _print_instances(root, args.index)
    elif args.drs is None:
        _fault(root, "cards")
        _print_cards(root)
    elif args.index is None:
        raise SystemExit("efsmi: DRS commands need -i <index>")
    elif args.list_profile:
        _fault(root, "profiles")
        _print_profiles(root, args.index)
    elif args.create_instance is not None:
        _fault(root, "create")
        _create(root, args.index, args.create_instance)
    elif args.destroy_instance is not None:
        _fault(root, "destroy")
        _destroy(root, args.index, args.destroy_instance)
    elif args.drs in ("on", "off"):
        _set_drs(root, args.index, args.drs == "on")
    else:
        raise SystemExit("efsmi: --drs needs on, off, --list-profile or an instance command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
