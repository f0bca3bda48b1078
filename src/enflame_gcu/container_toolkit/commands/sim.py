"""``enflame-ctk sim``: create a simulated GCU node and unplug, replug or reload its parts."""

from __future__ import annotations

import argparse
from typing import Any

from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.errors import SimulationError
from enflame_gcu.simulation import efmlsim, simulate, topofile

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
    create.add_argument(
        "--no-efml",
        action="store_true",
        help="do not build the simulated libefml (card telemetry then stays off)",
    )
    create.set_defaults(handler=_create)

    efml = actions.add_parser(
        "efml",
        help="set a card's libefml readings or inject a fault",
        description="Change what the simulated libefml reports for one card, so /metrics and "
        "the alerts react: set KEY=VALUE readings (e.g. asic_temp=91), make every call fail "
        "with an error code (or one call with --call), make the card's calls hang, or clear "
        "the faults.",
    )
    kinds = efml.add_subparsers(dest="efml_action", metavar="ACTION", required=True)
    setter = kinds.add_parser("set", help="set readings: KEY=VALUE ...")
    setter.add_argument("dir", metavar="DIR", help=DIR_HELP)
    setter.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
    setter.add_argument("values", metavar="KEY=VALUE", nargs="+", help="e.g. asic_temp=91")
    setter.set_defaults(handler=_efml_set)
    fail = kinds.add_parser("fail", help="make the card's calls return an error code")
    fail.add_argument("dir", metavar="DIR", help=DIR_HELP)
    fail.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
    fail.add_argument("code", type=int, help="efmlReturn_t code, e.g. 254 (FAIL)")
    fail.add_argument("--call", metavar="NAME", help="only this function, e.g. EfmlGetDevPwr")
    fail.set_defaults(handler=_efml_fail)
    hang = kinds.add_parser("hang", help="make the card's calls block until cleared")
    hang.add_argument("dir", metavar="DIR", help=DIR_HELP)
    hang.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
    hang.set_defaults(handler=_efml_hang)
    clear = kinds.add_parser("clear", help="remove the card's injected faults")
    clear.add_argument("dir", metavar="DIR", help=DIR_HELP)
    clear.add_argument("card", help="card minor or name, e.g. 3 or gcu3")
    clear.set_defaults(handler=_efml_clear)

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
    if args.no_efml:
        return 0
    try:
        path = efmlsim.install(args.dir, vendor_layout=True)
    except SimulationError as exc:
        common.note(f"simulated libefml not built, card telemetry will be off: {exc}")
    else:
        common.note(f"simulated libefml at {path} (values in {args.dir}/{efmlsim.EFML_DIR})")
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


FAULTS = ("fail", "hang", "refuse", "unsupported")


def _minor(card: str) -> int:
    digits = card.removeprefix("gcu")
    if not digits.isdigit():
        raise SimulationError(f"card must be a minor or gcuN, got {card!r}")
    return int(digits)


def _efml_card(root: str, card: str) -> str:
    """The values file name (``card<I>``) of ``card`` on the node at ``root``."""
    topo, _ = simulate.open_node(root)
    name = f"card{efmlsim.index_of(topo, _minor(card))}"
    efmlsim.read_values(root, name)  # names a node made without the simulated libefml
    return name


def _efml_set(args: argparse.Namespace) -> int:
    name = _efml_card(args.dir, args.card)
    known = efmlsim.read_values(args.dir, name)
    changes: dict[str, str | None] = {}
    for pair in args.values:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value or any(c.isspace() for c in pair):
            raise SimulationError(f"{pair!r} is not KEY=VALUE (no spaces)")
        if key in FAULTS:
            raise SimulationError(f"{key!r} is a fault: use 'sim efml {key}' or 'sim efml clear'")
        if key not in known:
            raise SimulationError(
                f"{args.card} has no reading {key!r}; readings: {', '.join(sorted(known))}"
            )
        changes[key] = value
    efmlsim.set_values(args.dir, name, changes)
    common.note(f"{args.card}: " + ", ".join(f"{k}={v}" for k, v in changes.items()))
    return 0


def _efml_fail(args: argparse.Namespace) -> int:
    name = _efml_card(args.dir, args.card)
    if not 1 <= args.code <= 255:
        raise SimulationError(f"error code {args.code} is outside 1..255 (0 is success)")
    if args.call is None:
        efmlsim.set_values(args.dir, name, {"fail": str(args.code)})
        common.note(f"{args.card}: every libefml call returns {args.code}")
        return 0
    if not args.call.startswith("Efml") or not args.call.isalnum():
        raise SimulationError(f"{args.call!r} is not a libefml function name")
    refused = efmlsim.read_values(args.dir, name).get("refuse", "").split()
    refused = [r for r in refused if r.partition("=")[0] != args.call]
    efmlsim.set_values(args.dir, name, {"refuse": " ".join([*refused, f"{args.call}={args.code}"])})
    common.note(f"{args.card}: {args.call} returns {args.code}")
    return 0


def _efml_hang(args: argparse.Namespace) -> int:
    name = _efml_card(args.dir, args.card)
    efmlsim.set_values(args.dir, name, {"hang": "1"})
    common.note(f"{args.card}: libefml calls block until 'sim efml clear'")
    return 0


def _efml_clear(args: argparse.Namespace) -> int:
    name = _efml_card(args.dir, args.card)
    efmlsim.set_values(args.dir, name, dict.fromkeys(FAULTS))
    common.note(f"{args.card}: faults cleared")
    return 0
