"""``python -m tests.controlplane up``: the control plane with N simulated GCU nodes, until
interrupted (for trying things by hand: the kubeconfig is printed)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from tests.controlplane import agent
from tests.controlplane.harness import Harness


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.controlplane", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the control plane and the simulated nodes")
    up.add_argument("--nodes", type=int, default=10, help="simulated GCU nodes (default 10)")
    up.add_argument("--cards", type=int, default=8, help="cards per node (default 8)")
    up.add_argument("--work", default="", help="an empty directory for the control plane's files")
    up.add_argument("--renew", type=float, default=10.0, help="seconds between Lease renewals")
    up.add_argument(
        "--seconds", type=float, default=0.0, help="stop after this long (default: on Ctrl-C)"
    )
    args = parser.parse_args(argv)
    if args.nodes < 0 or args.cards < 0:
        parser.error("--nodes and --cards must not be negative")
    work = args.work or tempfile.mkdtemp(prefix="enflame-controlplane-")
    if os.path.exists(work) and os.listdir(work):
        parser.error(f"--work {work} is not empty")
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    started = time.monotonic()
    with Harness.started(work, renew=args.renew) as harness:
        harness.add(
            agent.gcu_node(f"gcu-node-{i:05d}", cards=args.cards) for i in range(args.nodes)
        )
        print(f"{args.nodes} nodes ready in {time.monotonic() - started:.1f} s", flush=True)
        print(f"export KUBECONFIG={harness.plane.kubeconfig}", flush=True)
        stop.wait(args.seconds or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
