"""``enflame-ctk doctor``: check a GCU node the way the vendor manual's FAQ does by hand."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from enflame_gcu.container_toolkit import doctor
from enflame_gcu.container_toolkit.commands import common, install

EXIT_CODES = {"pass": common.EXIT_OK, "warn": common.EXIT_WARNINGS, "fail": common.EXIT_FAILED}

EPILOG = """\
checks: driver loaded and its version; /dev/gcu* and /dev/gcuctl present and matching sysfs;
the runtime binary the engines point at; the runtime config; the engine the kubelet runs (as
`enflame-ctk runtime detect` finds it) set up as the node mode needs: enflame the default
runtime, only the RuntimeClass handler, or absent (device-specs, cdi); runc 1.1.3-1.1.6 vs
/dev/char links (runc issue 3671); the kubelet's device-plugin dir and kubelet.sock; a stale
enflame.sock; swap; cpuManagerPolicy static;
a device-list strategy the engine cannot honour (cdi-cri on containerd < 1.7, cdi-annotations
without the annotation pass-through) and pod_annotations that let pods name devices;
the node mode (device-specs, cdi, runtimeclass, default-runtime), whether the node is set up
for it (CDI specs current, the wrapper default or not) and whether the plugin's settings match.

exit status: 0 every check passed, 1 at least one check failed, 3 warnings only,
2 usage error (bad option or value, missing --host-root directory).
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``doctor`` command to the ``enflame-ctk`` parser."""
    parser = subparsers.add_parser(
        "doctor",
        help="diagnose this node: driver, devices, runtime, engines, kubelet (exit 0/1/3)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common.add_host_root(parser)
    common.add_json(parser)
    parser.add_argument(
        "--device-list-strategy",
        metavar="LIST",
        help="the device plugin's strategies (e.g. cdi-annotations); default: read from a "
        "running enflame-device-plugin's command line",
    )
    install.add_containerd_options(parser)
    parser.set_defaults(handler=doctor_command)


def doctor_command(args: argparse.Namespace) -> int:
    """Handler of ``doctor``: run every check, print them, exit with the worst status."""
    strategies = None
    if args.device_list_strategy:
        strategies = tuple(s.strip() for s in args.device_list_strategy.split(",") if s.strip())
    node = doctor.inspect(args.host_root, strategies, install.containerd_from(args))
    results = doctor.run_checks(node)
    worst = doctor.worst(results)
    if args.json:
        document: dict[str, object] = {"root": args.host_root, "status": worst}
        # The engine checked and why (the "engine" result says it in words).
        document["engine"] = dataclasses.asdict(node.cri) if node.cri is not None else None
        document["results"] = [dataclasses.asdict(r) for r in results]
        common.print_json("DoctorReport", document)
        return EXIT_CODES[worst]
    width = max((len(r.name) for r in results), default=0)
    for result in results:
        # Details quote what the node holds (the mode record's strings, config values): escaped,
        # so a newline cannot forge a PASS line and an escape sequence cannot reach the terminal.
        detail = common.printable(result.detail)
        print(f"{result.status.upper():4}  {result.name:{width}}  {detail}")
        if result.fix and result.status != "pass":
            print(f"{'':4}  {'':{width}}  fix: {common.printable(result.fix)}")
    counts = {s: sum(r.status == s for r in results) for s in EXIT_CODES}
    print(f"{counts['pass']} passed, {counts['warn']} warning(s), {counts['fail']} failed")
    return EXIT_CODES[worst]
