"""``enflame-ctk install|uninstall``: put the runtime on a node (DaemonSet, install.sh), undo it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from enflame_gcu import fileio, node_modes
from enflame_gcu.container_toolkit import cdi, cdi_keeper, engines, install_manifest, installer
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.support import env_vars

READY_MESSAGE = "install: ready"
READY_LINE = f"{common.PROG}: {READY_MESSAGE}"  # on stderr

INSTALL_EPILOG = """\
examples:
  # DaemonSet container, node's / mounted at /host: install, wait, undo on SIGTERM
  enflame-ctk install --host-root /host --wait --set-as-default --restart-engine
  # what would change, without changing anything
  enflame-ctk install --host-root /host --dry-run
  # choose the node mode from the engine and its version (DaemonSet, chart, install.sh)
  enflame-ctk install --host-root /host --wait --mode auto --restart-engine
  # k3s (or rke2): its containerd's template, socket and unit (ENFLAME_PRESET=k3s does the same)
  enflame-ctk install --host-root /host --wait --mode auto --restart-engine --preset k3s

The runtime runs on the host with the host's own python3 (>= 3.10): the pure-Python package is
copied to TOOLKIT_DIR/lib and TOOLKIT_DIR/bin/enflame-container-runtime launches it.
Everything done is recorded in TOOLKIT_DIR/install-manifest.json; `enflame-ctk uninstall`
undoes it. An existing runtime config is never overwritten; one installed from the template
is removed on uninstall only if nobody edited it.
"""


CONTAINERD_OPTIONS = ("preset", "containerd-config", "containerd-socket", "containerd-service")


def add_containerd_options(parser: argparse.ArgumentParser) -> None:
    """Where the node's containerd keeps its config and socket (k3s and RKE2: elsewhere).

    Each option is also ``ENFLAME_<OPTION>`` in the environment (the option wins).
    """
    group = parser.add_argument_group(
        "containerd elsewhere (k3s, RKE2); each also ENFLAME_<OPTION>, e.g. ENFLAME_PRESET"
    )
    group.add_argument(
        "--preset",
        choices=sorted(engines.PRESETS),
        help="the documented containerd layout of k3s or RKE2: its config template under "
        "/var/lib/rancher/<k3s|rke2>/agent/etc/containerd, socket "
        "/run/k3s/containerd/containerd.sock, units k3s/k3s-agent or rke2-server/rke2-agent",
    )
    group.add_argument(
        "--containerd-config",
        metavar="PATH",
        help="host path of containerd's config (default: the preset's, else "
        "/etc/containerd/config.toml); a *.tmpl is a k3s/RKE2 template, created from the "
        "config.toml beside it when missing",
    )
    group.add_argument(
        "--containerd-socket",
        metavar="PATH",
        help="host path of containerd's socket, asked for its version by --mode auto "
        "(default: the preset's, else /run/containerd/containerd.sock)",
    )
    group.add_argument(
        "--containerd-service",
        metavar="UNIT[,UNIT]",
        help="systemd unit(s) --restart-engine restarts for containerd, the first one active "
        "(default: the preset's, else containerd)",
    )


def containerd_from(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> engines.ContainerdSite:
    """The containerd paths the options (else ``ENFLAME_<OPTION>``, else the preset) give.

    Raises EngineConfigError naming a bad value (an unknown preset, a relative path).
    """
    values: dict[str, str | None] = {}
    for option in CONTAINERD_OPTIONS:
        attribute = option.replace("-", "_")
        value = getattr(args, attribute, None)
        if value is None:
            value = environ.get(env_vars.for_option(option)) or None
        values[attribute] = value
    return engines.containerd_site(
        values["preset"],
        values["containerd_config"],
        values["containerd_socket"],
        values["containerd_service"],
    )


def _paths(parser: argparse.ArgumentParser) -> None:
    common.add_host_root(parser, "read and write")
    parser.add_argument(
        "--toolkit-dir",
        default=installer.DEFAULT_TOOLKIT_DIR,
        metavar="DIR",
        help="host directory for the runtime and the install manifest (default: %(default)s)",
    )
    parser.add_argument(
        "--restart-engine",
        action="store_true",
        help="SIGHUP/restart each engine whose config changed (from a container: chroot "
        "HOST_ROOT systemctl; needs hostPID for docker's SIGHUP)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would change, change nothing"
    )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``install`` and ``uninstall`` commands to the ``enflame-ctk`` parser."""
    parser = subparsers.add_parser(
        "install",
        help="install the runtime onto a host and configure its container engines",
        epilog=INSTALL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _paths(parser)
    parser.add_argument(
        "--runtime",
        action="append",
        choices=["auto", "none", *sorted(engines.ENGINES)],
        help="engine(s) to configure, one of %(choices)s; repeatable (default: auto = the "
        "engines this host has)",
    )
    parser.add_argument(
        "--set-as-default", action="store_true", help="make enflame the engines' default runtime"
    )
    parser.add_argument(
        "--mode",
        choices=[node_modes.AUTO, *node_modes.NAMES],
        help="node mode: install what it needs and record it in "
        f"{node_modes.MODE_FILE} (auto: chosen from the engine and its version; see "
        "docs/user-guide.md, 'Node modes'); without it, the wrapper as --set-as-default says",
    )
    parser.add_argument(
        "--cdi-annotations",
        action="store_true",
        help="the device plugin runs the cdi-annotations strategy: let containerd 1.x pass the "
        "container annotations cdi.k8s.io/* to the runtime",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="after installing, wait for SIGTERM/SIGINT, then undo what this run changed (an "
        "install that was there before it started stays) and exit 0",
    )
    parser.add_argument(
        "--ready-file", metavar="PATH", help="with --wait: create PATH once installed (probes)"
    )
    parser.add_argument(
        "--python",
        default="/usr/bin/python3",
        metavar="PATH",
        help="host interpreter the runtime launcher uses (default: %(default)s)",
    )
    parser.add_argument(
        "--package-dir",
        metavar="DIR",
        help="host dir that already holds enflame_gcu (e.g. a venv's site-packages); "
        "default: copy the package to TOOLKIT_DIR/lib",
    )
    parser.add_argument(
        "--bin-dir",
        metavar="DIR",
        help="also link enflame-container-runtime there (e.g. /usr/bin); engines then use it",
    )
    parser.add_argument("--link-ctk", metavar="PATH", help="with --bin-dir: link this enflame-ctk")
    parser.add_argument(
        "--set-aside-vendor-runtime",
        action="store_true",
        help="with --bin-dir (install.sh --migrate): a BIN_DIR/enflame-container-runtime that is "
        "not ours (topscloud's) is renamed to *.topscloud, recorded; uninstall puts it back",
    )
    parser.add_argument(
        "--created",
        action="append",
        default=[],
        metavar="KIND:PATH",
        help="(install.sh) record dir:PATH or tree:PATH made by the caller, for uninstall",
    )
    add_containerd_options(parser)
    parser.set_defaults(handler=install_command)

    remove = subparsers.add_parser(
        "uninstall",
        help="undo everything `enflame-ctk install` recorded in its manifest",
        description="Undo what `enflame-ctk install` recorded in TOOLKIT_DIR/install-manifest."
        "json; --dry-run prints the same plan and changes nothing.",
    )
    _paths(remove)
    remove.set_defaults(handler=uninstall_command)


def _engines(choices: list[str] | None) -> tuple[str, ...] | None:
    if not choices or "auto" in choices:
        return None
    return tuple(dict.fromkeys(c for c in choices if c != "none"))


def _print(outcome: installer.Outcome, dry_run: bool) -> None:
    """A dry run's plan is its result (stdout); a real run's lines report progress (stderr)."""
    if dry_run:
        for line in outcome.lines:
            print(line)
        sys.stdout.flush()
    else:
        for line in outcome.lines:
            common.note(line)


def install_command(args: argparse.Namespace) -> int:
    """Handler of ``install``: install, and with --wait stay until told to stop, then undo."""
    if args.wait and args.dry_run:
        common.note("--wait and --dry-run do not go together")
        return common.EXIT_USAGE
    if args.mode and args.set_as_default:
        common.note(
            "--mode decides whether enflame is the default runtime (default-runtime); "
            "drop --set-as-default"
        )
        return common.EXIT_USAGE
    stop = threading.Event()
    if args.wait:
        # Installed before the work starts: a SIGTERM during install is acted on right after.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    options = installer.InstallOptions(
        host_root=args.host_root,
        toolkit_dir=args.toolkit_dir,
        engines=_engines(args.runtime),
        set_as_default=args.set_as_default,
        cdi_annotations=args.cdi_annotations,
        restart_engine=args.restart_engine,
        python=args.python,
        package_dir=args.package_dir,
        bin_dir=args.bin_dir,
        ctk=args.link_ctk,
        set_aside_vendor_runtime=args.set_aside_vendor_runtime,
        created=tuple(args.created),
        dry_run=args.dry_run,
        mode=args.mode,
        # Without --wait nothing of ours stays running: a systemd service keeps the CDI specs.
        cdi_service=not args.wait,
        containerd=containerd_from(args),
    )
    # A failed step takes back this run's changes (installer.install does), never an install
    # that was there before; with --wait, SIGTERM later takes back this run's changes only.
    run = installer.begin(options)
    outcome = installer.install(options, run, keep_undo=args.wait)
    _print(outcome, args.dry_run)
    if not args.wait:
        return 0
    if args.ready_file:
        os.makedirs(os.path.dirname(os.path.abspath(args.ready_file)), exist_ok=True)
        # Replaced, never written through: a link at the name is not followed.
        fileio.atomic_write_text(args.ready_file, "ready\n")
    common.note(f"{READY_MESSAGE}; waiting for SIGTERM to undo the install")
    if outcome.mode is not None and node_modes.MODES[outcome.mode].cdi_specs:
        # Node mode cdi: this process owns the CDI specs until it is stopped (cdi_keeper).
        output = installer.InstallRun(args.host_root, args.toolkit_dir, False).local(
            cdi.DEFAULT_OUTPUT_DIR, follow=True
        )
        common.note(f"keeping the CDI specs in {cdi.DEFAULT_OUTPUT_DIR} current")
        cdi_keeper.run_until(args.host_root, output, stop)
    while not stop.wait(3600):
        pass
    common.note("install: stopping, undoing what this run installed")
    if args.ready_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.ready_file)
    _print(installer.undo_run(run, args.restart_engine), dry_run=False)
    return 0


def _has_manifest(args: argparse.Namespace, toolkit_dir: str) -> bool:
    run = installer.InstallRun(args.host_root, toolkit_dir, True)
    return os.path.exists(run.manifest_path)


def uninstall_command(args: argparse.Namespace) -> int:
    """Handler of ``uninstall``."""
    toolkit_dir = args.toolkit_dir
    if toolkit_dir == installer.DEFAULT_TOOLKIT_DIR and not _has_manifest(args, toolkit_dir):
        legacy = install_manifest.LEGACY_TOOLKIT_DIR
        if _has_manifest(args, legacy):
            common.note(f"undoing the install recorded in {legacy} (the toolkit dir until 0.1)")
            toolkit_dir = legacy
    outcome = installer.uninstall(
        args.host_root, toolkit_dir, restart_engine=args.restart_engine, dry_run=args.dry_run
    )
    _print(outcome, args.dry_run)
    return 0
