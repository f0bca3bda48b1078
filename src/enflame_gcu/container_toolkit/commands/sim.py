"""``enflame-ctk sim``: create a simulated GCU node and unplug, replug or reload its parts."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation import simulate, topofile


def register(subparsers: Any) -> None:
    """Add the ``sim`` subcommand group."""
    parser = subparsers.add_parser("sim", help="simulated GCU nodes for demos and tests")
    actions = parser.add_subparsers(dest="sim_action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="write a fake sysfs and /dev tree under DIR")
    create.add_argument("dir")
    create.add_argument(
        "--topology",
        default="vendor-8card",
        help=f"built-in name ({', '.join(topofile.builtin_names())}) or a .topo file",
    )
    create.add_argument(
        "--regular-files", action="store_true", help="make /dev nodes regular files, not mknod"
    )
    create.set_defaults(handler=_create)

    topologies = actions.add_parser("topologies", help="list the built-in topologies")
    topologies.set_defaults(handler=_topologies)

    for name, helptext in (("unplug", "make a card vanish"), ("replug", "bring a card back")):
        action = actions.add_parser(name, help=helptext)
        action.add_argument("dir")
        action.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
        action.set_defaults(handler=_card_action, action=name)

    unload = actions.add_parser("unload-driver", help="unload the driver (all GCU nodes vanish)")
    unload.add_argument("dir")
    unload.set_defaults(handler=_unload)

    load = actions.add_parser("load-driver", help="load the driver again")
    load.add_argument("dir")
    load.add_argument("--version", dest="driver_version", help="load a different version")
    load.set_defaults(handler=_load)

    upgrade = actions.add_parser("set-driver-version", help="change the loaded driver's version")
    upgrade.add_argument("dir")
    upgrade.add_argument("driver_version", metavar="VERSION")
    upgrade.set_defaults(handler=_set_version)


def _create(args: argparse.Namespace) -> int:
    topo = topofile.load(args.topology)
    state = simulate.create(args.dir, topo, char_devices=False if args.regular_files else None)
    kind = "character devices (mknod)" if state.char_devices else "regular files (not root)"
    print(f"created simulated node {topo.name!r} with {len(topo.cards)} card(s) under {args.dir}")
    print(f"device nodes are {kind}")
    return 0


def _topologies(_args: argparse.Namespace) -> int:
    for name in topofile.builtin_names():
        topo = topofile.load(name)
        print(f"{name:16} {len(topo.cards):3} cards  {topo.description}")
    return 0


def _card_action(args: argparse.Namespace) -> int:
    minor = int(args.card.removeprefix("gcu")) if args.card.removeprefix("gcu").isdigit() else -1
    if minor < 0:
        raise SimulationError(f"card must be a minor or gcuN, got {args.card!r}")
    (simulate.unplug if args.action == "unplug" else simulate.replug)(args.dir, minor)
    print(f"{args.action}ged gcu{minor}")
    return 0


def _unload(args: argparse.Namespace) -> int:
    simulate.unload_driver(args.dir)
    print("driver unloaded")
    return 0


def _load(args: argparse.Namespace) -> int:
    simulate.load_driver(args.dir, args.driver_version)
    print("driver loaded")
    return 0


def _set_version(args: argparse.Namespace) -> int:
    simulate.set_driver_version(args.dir, args.driver_version)
    print(f"driver version is now {args.driver_version}")
    return 0
