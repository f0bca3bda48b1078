"""``enflame-ctk sim``: create a simulated GCU node and unplug, replug or reload its parts."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation import simulate, topofile

DIR_HELP = "the simulated node's root (its sysfs and /dev tree)"


def register(subparsers: Any) -> None:
    """Add the ``sim`` subcommand group."""
    parser = subparsers.add_parser(
        "sim",
        help="simulated GCU nodes for demos and tests",
        description="Build a fake GCU node (sysfs + /dev with real character devices when "
        "root) and unplug, replug or reload its parts; pass DIR as --host-root to the other "
        "commands.",
    )
    actions = parser.add_subparsers(dest="sim_action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="write a fake sysfs and /dev tree under DIR")
    create.add_argument("dir", metavar="DIR", help=DIR_HELP)
    create.add_argument(
        "--topology",
        default="vendor-8card",
        help=f"built-in name ({', '.join(topofile.builtin_names())}) or a .topo file "
        "(default: %(default)s)",
    )
    create.add_argument(
        "--regular-files", action="store_true", help="make /dev nodes regular files, not mknod"
    )
    create.set_defaults(handler=_create)

    topologies = actions.add_parser("topologies", help="list the built-in topologies")
    common.add_json(topologies)
    topologies.set_defaults(handler=_topologies)

    for name, helptext in (("unplug", "make a card vanish"), ("replug", "bring a card back")):
        action = actions.add_parser(name, help=helptext)
        action.add_argument("dir", metavar="DIR", help=DIR_HELP)
        action.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
        action.set_defaults(handler=_card_action, action=name)

    unload = actions.add_parser("unload-driver", help="unload the driver (all GCU nodes vanish)")
    unload.add_argument("dir", metavar="DIR", help=DIR_HELP)
    unload.set_defaults(handler=_unload)

    load = actions.add_parser("load-driver", help="load the driver again")
    load.add_argument("dir", metavar="DIR", help=DIR_HELP)
    load.add_argument(
        "--driver-version", metavar="VERSION", help="load a different version (default: the same)"
    )
    common.add_deprecated(load, "--version", "--driver-version", "driver_version")
    load.set_defaults(handler=_load)

    upgrade = actions.add_parser("set-driver-version", help="change the loaded driver's version")
    upgrade.add_argument("dir", metavar="DIR", help=DIR_HELP)
    upgrade.add_argument("driver_version", metavar="VERSION", help="e.g. 1.2.3")
    upgrade.set_defaults(handler=_set_version)


def _create(args: argparse.Namespace) -> int:
    topo = topofile.load(args.topology)
    state = simulate.create(args.dir, topo, char_devices=False if args.regular_files else None)
    kind = "character devices (mknod)" if state.char_devices else "regular files (not root)"
    common.note(
        f"created simulated node {topo.name!r} with {len(topo.cards)} card(s) under {args.dir}"
    )
    common.note(f"device nodes are {kind}")
    return 0


def _topologies(args: argparse.Namespace) -> int:
    loaded = [(name, topofile.load(name)) for name in topofile.builtin_names()]
    if args.json:
        common.print_json(
            "TopologyList",
            {
                "topologies": [
                    {"name": name, "cards": len(topo.cards), "description": topo.description}
                    for name, topo in loaded
                ]
            },
        )
        return common.EXIT_OK
    for name, topo in loaded:
        count = f"{len(topo.cards):3} card" + ("" if len(topo.cards) == 1 else "s")
        print(f"{name:16} {count:9}  {topo.description}")
    return common.EXIT_OK


def _card_action(args: argparse.Namespace) -> int:
    minor = int(args.card.removeprefix("gcu")) if args.card.removeprefix("gcu").isdigit() else -1
    if minor < 0:
        raise SimulationError(f"card must be a minor or gcuN, got {args.card!r}")
    (simulate.unplug if args.action == "unplug" else simulate.replug)(args.dir, minor)
    common.note(f"{args.action}ged gcu{minor}")
    return 0


def _unload(args: argparse.Namespace) -> int:
    simulate.unload_driver(args.dir)
    common.note("driver unloaded")
    return 0


def _load(args: argparse.Namespace) -> int:
    simulate.load_driver(args.dir, args.driver_version)
    common.note("driver loaded")
    return 0


def _set_version(args: argparse.Namespace) -> int:
    simulate.set_driver_version(args.dir, args.driver_version)
    common.note(f"driver version is now {args.driver_version}")
    return 0
