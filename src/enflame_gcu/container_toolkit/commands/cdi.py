"""``enflame-ctk cdi``: generate, list and validate CDI specs for the node's GCUs."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from enflame_gcu import devices, edits, fileio
from enflame_gcu.container_toolkit import cdi, cdi_keeper, cdi_validate
from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.errors import SpecError
from enflame_gcu.shim import config as runtime_config

FILE_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


def register(subparsers: Any) -> None:
    """Add the ``cdi`` subcommand group."""
    parser = subparsers.add_parser(
        "cdi",
        help="Container Device Interface specs for the GCUs",
        description="Generate, list and validate CDI specs (enflame.com/gcu, enflame.com/vgcu).",
    )
    actions = parser.add_subparsers(dest="cdi_action", metavar="ACTION", required=True)

    generate = actions.add_parser(
        "generate",
        help="write enflame.com/gcu CDI spec(s)",
        description="Discover the node's GCUs and write one CDI spec per device kind. With "
        "--host-root DIR, the runtime config is read and the default outputs are written "
        "inside DIR, never on this machine.",
    )
    common.add_host_root(generate, "read and write")
    generate.add_argument(
        "--output",
        metavar="PATH",
        help="a directory to write enflame.com-<kind>.<format> into; a FILE ending in .yaml, "
        ".yml or .json to write that file (one device kind only); or - for stdout (default: "
        f"{cdi.DEFAULT_OUTPUT_DIR} inside the host root)",
    )
    generate.add_argument(
        "--format",
        choices=["yaml", "json"],
        help="spec format: %(choices)s (default: from the --output file's suffix, else yaml)",
    )
    generate.add_argument(
        "--config",
        metavar="FILE",
        help="runtime config whose mounts/env to include (default: "
        f"{runtime_config.DEFAULT_PATH} inside the host root)",
    )
    generate.add_argument(
        "--prepared-edits",
        metavar="FILE",
        help="also write the runtime's prepared edits file (its fast create path) to FILE, "
        "or 'config' for the runtime config's prepared-edits path (inside the host root); a "
        "node without usable GCUs gets the file removed",
    )
    generate.set_defaults(handler=_generate)

    watch = actions.add_parser(
        "watch",
        help="keep the node's CDI specs current: write them now, rewrite them within a second "
        "of any device change (atomically), until SIGTERM (node mode cdi without the DaemonSet)",
    )
    common.add_host_root(watch, "read and write")
    watch.add_argument(
        "--output",
        metavar="DIR",
        help=f"directory of the specs (default: {cdi.DEFAULT_OUTPUT_DIR} inside the host root)",
    )
    watch.add_argument(
        "--remove-on-exit",
        action="store_true",
        help="remove the specs when stopped (default: leave them, they describe the node)",
    )
    watch.set_defaults(handler=_watch)

    listing = actions.add_parser(
        "list",
        help="list the CDI device names found in spec dirs (exit 1: none)",
        description="List every CDI device name (kind=name) in the spec directories.",
    )
    common.add_host_root(listing)
    listing.add_argument(
        "--spec-dir",
        action="append",
        metavar="DIR",
        help="directory to search (repeatable; default: the runtime config's spec dirs, "
        f"{', '.join(cdi.DEFAULT_SPEC_DIRS)}, inside the host root)",
    )
    common.add_json(listing)
    listing.set_defaults(handler=_list)

    validate = actions.add_parser(
        "validate",
        help="check a CDI spec file against the schema and our semantic rules (exit 1: invalid)",
    )
    validate.add_argument("file", metavar="FILE", help="the CDI spec (.yaml, .yml or .json)")
    validate.add_argument(
        "--schema-dir",
        metavar="DIR",
        help="directory with another CDI JSON schema (schema.json + defs.json; default: the "
        "one shipped in the package, CDI spec 1.1.0)",
    )
    validate.set_defaults(handler=_validate)


def _runtime_config(args: argparse.Namespace) -> runtime_config.RuntimeConfig:
    if args.config is not None:
        return runtime_config.load(fileio.confine(args.host_root, args.config))
    return host_runtime_config(args.host_root)


def host_runtime_config(root: str) -> runtime_config.RuntimeConfig:
    """The host's runtime config: under ``root`` when one is given (missing: the defaults).

    ``ENFLAME_CONTAINER_RUNTIME_CONFIG`` names the file explicitly, as ``--config`` does: it is
    used as written, whatever the root.
    """
    if root == "/" or os.environ.get(runtime_config.PATH_ENV):
        return runtime_config.load()
    path = common.host_file(root, runtime_config.DEFAULT_PATH)
    return runtime_config.load(path) if os.path.lexists(path) else runtime_config.RuntimeConfig()


def _output_target(output: str) -> tuple[str, str | None]:
    """(``dir``/``file``, format implied by a file's suffix)."""
    suffix = os.path.splitext(output)[1].lower()
    if suffix in FILE_SUFFIXES and not os.path.isdir(output):
        return "file", FILE_SUFFIXES[suffix]
    return "dir", None


def _generate(args: argparse.Namespace) -> int:
    root = args.host_root
    config = _runtime_config(args)
    # The runtime config's root is a host path: seen from here it lies inside --host-root.
    discovery_root = fileio.host_path(root, config.root) if root != "/" else config.root
    fileio.require_confined(discovery_root, devices.DISCOVERY_PATHS)
    mounts = [edits.MountEdit(host, container) for host, container in config.mounts]
    inventory = devices.discover(discovery_root)
    output = args.output
    kind, implied = ("stdout", None) if output == "-" else _output_target(output or "/")
    fmt = args.format or implied or "yaml"
    if args.prepared_edits:
        if args.prepared_edits == "config":
            path = config.prepared_edits and common.host_file(root, config.prepared_edits)
        else:
            path = fileio.confine(root, args.prepared_edits)
        if not path:
            common.note("the runtime config turns prepared-edits off; nothing to write")
        elif cdi.refresh_prepared_edits(path, inventory, config.root):
            common.note(f"wrote {path}")
        else:
            common.note(f"removed {path}: no usable GCU to prepare")
    specs = cdi.build_specs(inventory, mounts, config.env)
    if kind == "stdout":
        separator = "---\n" if fmt == "yaml" else ""
        sys.stdout.write(separator.join(cdi.render(named.spec, fmt) for named in specs))
        return common.EXIT_OK
    if kind == "file":
        if len(specs) > 1:
            kinds = ", ".join(named.spec["kind"] for named in specs)
            raise SpecError(
                f"this node needs {len(specs)} CDI specs ({kinds}) and a spec file holds one: "
                f"give --output a directory instead of {output}"
            )
        path = fileio.confine(root, output)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fileio.atomic_write_text(path, cdi.render(specs[0].spec, fmt), mode=0o644)
        common.note(f"wrote {path}")
        return common.EXIT_OK
    directory = (
        common.host_file(root, cdi.DEFAULT_OUTPUT_DIR)
        if output is None
        else fileio.confine(root, output)
    )
    for path in cdi.write(specs, directory, fmt):
        common.note(f"wrote {path}")
    return common.EXIT_OK


def _watch(args: argparse.Namespace) -> int:
    # As generate does: a root whose /dev or /sys leads out of it is refused before starting.
    fileio.require_confined(args.host_root, devices.DISCOVERY_PATHS)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if "log_level" not in vars(args):  # not asked for: a watcher reports each spec it writes
        logging.getLogger().setLevel(logging.INFO)
    output = (
        common.host_file(args.host_root, cdi.DEFAULT_OUTPUT_DIR)
        if args.output is None
        else fileio.confine(args.host_root, args.output)
    )
    common.note(f"keeping the CDI specs in {output} current (SIGTERM stops)")
    cdi_keeper.run_until(args.host_root, output, stop)
    if args.remove_on_exit:
        for path in cdi_keeper.spec_paths(output):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                common.note(f"removed {path}")
    return common.EXIT_OK


def _list(args: argparse.Namespace) -> int:
    root = args.host_root
    if args.spec_dir:
        directories = [fileio.confine(root, d) for d in args.spec_dir]
    else:
        config = host_runtime_config(root)
        directories = [common.host_file(root, d) for d in config.cdi_spec_dirs]
    found = cdi.list_devices(directories)
    twice = cdi.duplicates(found)
    if args.json:
        common.print_json(
            "CDIDeviceList",
            {
                "specDirs": directories,
                "duplicates": twice,
                "devices": [{"name": name, "file": path} for name, path in found],
            },
        )
    else:
        for name, path in found:
            print(f"{name}\t{path}")
    if not found:
        common.note(f"no CDI devices found in {', '.join(directories)}")
        return common.EXIT_FAILED
    for name, paths in twice.items():
        common.warn(
            f"{name} is defined by {len(paths)} spec files ({', '.join(paths)}): the engine uses "
            "one of them and the other goes stale; keep one (enflame-ctk cdi generate writes "
            f"{cdi.DEFAULT_OUTPUT_DIR}, which the toolkit keeps current)"
        )
    return common.EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    spec = cdi.load_file(args.file)
    missing = cdi_validate.schema_missing_reason()
    if missing is not None:
        common.warn(f"the CDI schema is not checked: {missing}")
    schema_dir = None if missing else args.schema_dir or cdi_validate.default_schema_dir()
    problems = cdi_validate.validate(spec, schema_dir)
    for problem in problems:
        common.note(f"{args.file}: {problem}")
    if problems:
        return common.EXIT_FAILED
    checked = "schema and semantic checks" if schema_dir else "semantic checks only"
    print(f"{args.file}: valid ({checked})")
    return common.EXIT_OK
