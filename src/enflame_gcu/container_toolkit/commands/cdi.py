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

from enflame_gcu import devices, edits
from enflame_gcu.container_toolkit import cdi, cdi_keeper, cdi_validate
from enflame_gcu.shim import config as runtime_config


def register(subparsers: Any) -> None:
    """Add the ``cdi`` subcommand group."""
    parser = subparsers.add_parser("cdi", help="Container Device Interface specs for the GCUs")
    actions = parser.add_subparsers(dest="cdi_action", metavar="ACTION", required=True)

    generate = actions.add_parser("generate", help="write enflame.com/gcu CDI spec(s)")
    generate.add_argument("--root", default=None, help="host root (default: the runtime config's)")
    generate.add_argument(
        "--output",
        default=cdi.DEFAULT_OUTPUT_DIR,
        help=f"directory to write into, or - for stdout (default: {cdi.DEFAULT_OUTPUT_DIR})",
    )
    generate.add_argument("--format", choices=["yaml", "json"], default="yaml")
    generate.add_argument(
        "--config", help="runtime config whose mounts/env to include (default: its usual path)"
    )
    generate.add_argument(
        "--prepared-edits",
        metavar="FILE",
        help="also write the runtime's prepared edits file (its fast create path) to FILE, "
        "or 'config' for the runtime config's prepared-edits path; a node without usable "
        "GCUs gets the file removed",
    )
    generate.set_defaults(handler=_generate)

    watch = actions.add_parser(
        "watch",
        help="keep the node's CDI specs current: write them now, rewrite them within a second "
        "of any device change (atomically), until SIGTERM (node mode cdi without the DaemonSet)",
    )
    watch.add_argument("--root", default="/", help="host root (default: /)")
    watch.add_argument(
        "--output",
        default=cdi.DEFAULT_OUTPUT_DIR,
        help=f"directory of the specs (default: {cdi.DEFAULT_OUTPUT_DIR})",
    )
    watch.add_argument(
        "--remove-on-exit",
        action="store_true",
        help="remove the specs when stopped (default: leave them, they describe the node)",
    )
    watch.set_defaults(handler=_watch)

    listing = actions.add_parser("list", help="list the CDI device names found in spec dirs")
    listing.add_argument(
        "--spec-dir",
        action="append",
        help=f"directory to search (repeatable; default: {', '.join(cdi.DEFAULT_SPEC_DIRS)})",
    )
    listing.set_defaults(handler=_list)

    validate = actions.add_parser("validate", help="check a CDI spec file")
    validate.add_argument("file")
    validate.add_argument(
        "--schema-dir", help="directory with the CDI JSON schema (schema.json + defs.json)"
    )
    validate.set_defaults(handler=_validate)


def _generate(args: argparse.Namespace) -> int:
    config = runtime_config.load(args.config)
    root = args.root or config.root
    mounts = [edits.MountEdit(host, container) for host, container in config.mounts]
    inventory = devices.discover(root)
    if args.prepared_edits:
        path = config.prepared_edits if args.prepared_edits == "config" else args.prepared_edits
        if not path:
            print("the runtime config turns prepared-edits off; nothing to write", file=sys.stderr)
        elif cdi.refresh_prepared_edits(path, inventory, config.root):
            print(f"wrote {path}", file=sys.stderr if args.output == "-" else sys.stdout)
        else:
            print(f"removed {path}: no usable GCU to prepare", file=sys.stderr)
    specs = cdi.build_specs(inventory, mounts, config.env)
    if args.output == "-":
        sys.stdout.write(
            ("---\n" if args.format == "yaml" else "").join(
                cdi.render(named.spec, args.format) for named in specs
            )
        )
        return 0
    for path in cdi.write(specs, args.output, args.format):
        print(f"wrote {path}")
    return 0


def _watch(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    print(f"keeping the CDI specs in {args.output} current (SIGTERM stops)", flush=True)
    cdi_keeper.run_until(args.root, args.output, stop)
    if args.remove_on_exit:
        for path in cdi_keeper.spec_paths(args.output):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                print(f"removed {path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    directories = args.spec_dir or list(runtime_config.load().cdi_spec_dirs)
    found = cdi.list_devices(directories)
    for name, path in found:
        print(f"{name}\t{path}")
    if not found:
        print(f"no CDI devices found in {', '.join(directories)}", file=sys.stderr)
        return 1
    return 0


def _validate(args: argparse.Namespace) -> int:
    spec = cdi.load_file(args.file)
    schema_dir = args.schema_dir or cdi_validate.default_schema_dir()
    problems = cdi_validate.validate(spec, schema_dir)
    for problem in problems:
        print(f"{args.file}: {problem}", file=sys.stderr)
    if problems:
        return 1
    checked = "schema and semantic checks" if schema_dir else "semantic checks (no schema found)"
    print(f"{args.file}: valid ({checked})")
    return 0
