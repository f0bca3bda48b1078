"""``enflame-ctk runtime configure|unconfigure``: set an engine up to use the GCU runtime."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from enflame_gcu.container_toolkit import engines
from enflame_gcu.container_toolkit.engines import base
from enflame_gcu.container_toolkit.engines import reload as engine_reload
from enflame_gcu.errors import EngineConfigError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime", required=True, choices=sorted(engines.ENGINES), help="container engine"
    )
    parser.add_argument(
        "--config", metavar="PATH", help="engine config file (default: the engine's standard path)"
    )
    parser.add_argument(
        "--host-root", default="/", metavar="DIR", help="the host's / as seen from here"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print a unified diff and change nothing"
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="signal or restart the engine afterwards (SIGHUP for docker runtimes, else systemctl)",
    )


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
    configure.add_argument("--runtime-name", default=base.DEFAULT_RUNTIME_NAME)
    configure.add_argument("--runtime-path", default=base.DEFAULT_RUNTIME_PATH)
    configure.add_argument(
        "--set-as-default", action="store_true", help="make it the engine's default runtime"
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


def configure_command(args: argparse.Namespace) -> int:
    """Handler of ``runtime configure``."""
    if not args.runtime_path.startswith("/"):
        print(
            f"enflame-ctk: --runtime-path must be absolute, got {args.runtime_path!r}",
            file=sys.stderr,
        )
        return 1
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
        print(f"enflame-ctk: {exc}", file=sys.stderr)
        return 1


def unconfigure_command(args: argparse.Namespace) -> int:
    """Handler of ``runtime unconfigure``."""
    try:
        change = engines.unconfigure(
            args.runtime, args.config, host_root=args.host_root, dry_run=args.dry_run
        )
        return _report(change, args)
    except EngineConfigError as exc:
        print(f"enflame-ctk: {exc}", file=sys.stderr)
        return 1


def _report(change: engines.Change, args: argparse.Namespace) -> int:
    if change.dry_run:
        print(change.diff, end="")
    print(change.describe())
    if args.restart and not change.dry_run:
        if change.changed:
            print(engine_reload.reload(change, args.host_root))
        else:
            print(f"{change.engine}: nothing changed, not restarted")
    return 0
