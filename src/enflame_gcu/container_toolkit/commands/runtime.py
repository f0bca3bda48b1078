"""``enflame-ctk runtime configure|unconfigure|detect``: set an engine up for the GCU runtime."""

from __future__ import annotations

import argparse
import os
from typing import Any

from enflame_gcu import fileio, node_modes
from enflame_gcu.container_toolkit import engines
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.container_toolkit.engines import base, cri
from enflame_gcu.container_toolkit.engines import reload as engine_reload
from enflame_gcu.errors import EnflameError, EngineConfigError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        required=True,
        choices=sorted(engines.ENGINES),
        help="container engine: %(choices)s",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="engine config file (default: the engine's standard path inside the host root)",
    )
    common.add_host_root(parser, "read and write")
    parser.add_argument(
        "--dry-run", action="store_true", help="print a unified diff and change nothing"
    )
    parser.add_argument(
        "--restart-engine",
        action="store_true",
        help="signal or restart the engine afterwards (SIGHUP for docker runtimes, else systemctl)",
    )
    common.add_deprecated(parser, "--restart", "--restart-engine", "restart_engine", flag=True)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``runtime`` command group to the ``enflame-ctk`` parser."""
    group = subparsers.add_parser(
        "runtime", help="configure docker/containerd/CRI-O for enflame-container-runtime"
    )
    actions = group.add_subparsers(dest="runtime_command", metavar="ACTION", required=True)

    configure = actions.add_parser(
        "configure", help="add the runtime to the engine config (merge, back up, idempotent)"
    )
    _common(configure)
    configure.add_argument(
        "--runtime-name",
        default=base.DEFAULT_RUNTIME_NAME,
        metavar="NAME",
        help="the runtime's name in the engine config (default: %(default)s)",
    )
    configure.add_argument(
        "--runtime-path",
        default=base.DEFAULT_RUNTIME_PATH,
        metavar="PATH",
        help="absolute path of enflame-container-runtime on the host (default: %(default)s)",
    )
    configure.add_argument(
        "--set-as-default", action="store_true", help="make it the engine's default runtime"
    )
    configure.add_argument(
        "--force",
        action="store_true",
        help="with --set-as-default: set it even when the runtime binary is missing or the "
        "node's recorded mode wants no wrapper as default (every container start then uses it)",
    )
    configure.add_argument("--cdi", action="store_true", help="turn CDI on where supported")
    configure.add_argument(
        "--cdi-annotations",
        action="store_true",
        help="the device plugin runs the cdi-annotations strategy: containerd 1.x passes the "
        "container annotations cdi.k8s.io/* to the runtime (never the pod's)",
    )
    configure.add_argument(
        "--drop-in",
        action="store_true",
        help="containerd: write conf.d/99-enflame.toml and import it (CRI-O always uses one)",
    )
    configure.set_defaults(handler=configure_command)

    unconfigure = actions.add_parser("unconfigure", help="remove exactly what configure added")
    _common(unconfigure)
    unconfigure.set_defaults(handler=unconfigure_command)

    detect = actions.add_parser(
        "detect",
        help="print the engine this node's kubelet runs, and why (doctor and k8s-config.sh ask)",
        description="The engine behind the kubelet's CRI endpoint (a running kubelet's flags, "
        "else the config file it names; with no kubelet running, the flags files its unit "
        "passes, else /var/lib/kubelet/config.yaml), else the first socket found: containerd, "
        "CRI-O, docker. Prints 'ENGINE: why'; exit 1 when no engine is found.",
    )
    common.add_host_root(detect)
    common.add_json(detect)
    detect.set_defaults(handler=detect_command)


def configure_command(args: argparse.Namespace) -> int:
    """Handler of ``runtime configure``."""
    if not args.runtime_path.startswith("/"):
        common.note(f"--runtime-path must be absolute, got {args.runtime_path!r}")
        return common.EXIT_USAGE
    if args.set_as_default and not args.force and (why := _default_refused(args)):
        if not args.dry_run:
            common.note(f"refusing --set-as-default: {why}; nothing was changed (--force to do it)")
            return common.EXIT_FAILED
        common.note(f"a real run would refuse --set-as-default: {why} (--force to do it)")
    options = base.RuntimeOptions(
        runtime_name=args.runtime_name,
        runtime_path=args.runtime_path,
        set_as_default=args.set_as_default,
        cdi=args.cdi,
        drop_in=args.drop_in,
        cdi_annotations=args.cdi_annotations,
    )
    try:
        change = engines.configure(
            args.runtime, args.config, options, host_root=args.host_root, dry_run=args.dry_run
        )
        return _report(change, args)
    except EngineConfigError as exc:
        common.note(str(exc))
        return common.EXIT_FAILED


def _default_refused(args: argparse.Namespace) -> str | None:
    """Why making the runtime the engine's default would break or contradict this node."""
    try:
        binary = fileio.resolve(args.host_root, args.runtime_path)
    except EnflameError as exc:
        return f"{args.runtime_path}: {exc}"
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return (
            f"{args.runtime_path} does not exist on this node (or is not an executable file): "
            "every container start would fail; install the runtime first (docs/packaging.md)"
        )
    try:
        record = node_modes.read(args.host_root)
    except ValueError as exc:
        return f"{exc} (the node's mode cannot be told)"
    if record is not None and record.mode != "default-runtime":
        return (
            f"this node's mode is {record.mode} ({node_modes.MODE_FILE}, "
            f"chosen {record.chosen_by}), which wants no wrapper as the default runtime; "
            "change the mode with: enflame-ctk install --mode default-runtime "
            f"--host-root {args.host_root}"
        )
    return None


def unconfigure_command(args: argparse.Namespace) -> int:
    """Handler of ``runtime unconfigure``."""
    try:
        change = engines.unconfigure(
            args.runtime, args.config, host_root=args.host_root, dry_run=args.dry_run
        )
        return _report(change, args)
    except EngineConfigError as exc:
        common.note(str(exc))
        return common.EXIT_FAILED


def detect_command(args: argparse.Namespace) -> int:
    """Handler of ``runtime detect``: the engine and why on stdout; exit 1 when none."""
    found = cri.detect(args.host_root)
    status = common.EXIT_OK if found.engine else common.EXIT_FAILED
    if args.json:
        document = {
            "root": args.host_root,
            "engine": found.engine or None,
            "source": found.source or None,
            "endpoint": found.endpoint or None,
            "reason": found.reason,
        }
        common.print_json("RuntimeDetection", document)
    elif found.engine:
        print(found.describe())
    else:
        common.note(f"no container engine found: {found.reason}")
    return status


def _report(change: engines.Change, args: argparse.Namespace) -> int:
    # A dry run's diff and summary are its result (stdout); a real run reports on stderr.
    # Paths as the host sees them (an explicit --config outside the host root stays as given).
    if change.dry_run:
        print(base.host_view_text(change.diff, args.host_root), end="")
        print(base.host_view_text(change.describe(), args.host_root))
        return 0
    common.note(base.host_view_text(change.describe(), args.host_root))
    if args.restart_engine:
        if change.changed:
            common.note(engine_reload.reload(change, args.host_root))
        else:
            common.note(f"{change.engine}: nothing changed, not restarted")
    elif change.changed:
        # The engine reads its config at start only: said as the installer says it.
        common.note(
            f"{change.engine}: restart it so it loads the change (systemctl restart "
            f"{change.engine}), or run again with --restart-engine"
        )
    return 0
