"""enflame-gcu-operator: leader election, then reconcile every GcuResource every few seconds."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from enflame_gcu.gcu_operator import api, leader, runner

if TYPE_CHECKING:
    from enflame_gcu.gcu_operator import kube as kube_module

LOG = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="enflame-gcu-operator", description=__doc__)
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", ""),
        help="kubeconfig file (default: in-cluster service account)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "kube-system"),
        help="namespace of the leader-election Lease",
    )
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME", socket.gethostname()),
        help="this replica's name in the Lease",
    )
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds between reconcile passes (default 5)"
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=15,
        help="seconds a Lease stays valid without renewal (default 15)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit (no election)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def _cluster(kubeconfig: str) -> kube_module.LightkubeApi:
    import lightkube  # noqa: PLC0415 - the CLI's --help needs no client
    from lightkube.config.kubeconfig import KubeConfig  # noqa: PLC0415

    from enflame_gcu.gcu_operator import kube  # noqa: PLC0415

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return kube.LightkubeApi(lightkube.Client(config, field_manager="enflame-gcu-operator"))


# The HTTP client logs every request at INFO: a few lines a second, drowning the operator's own.
HTTP_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")


def configure_logging(level: str) -> None:
    """The operator's log at ``level``; the HTTP client's requests only with ``debug``."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(message)s")
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the operator until SIGTERM."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    cluster = _cluster(args.kubeconfig)
    try:
        return _run(args, cluster)
    finally:
        cluster.close()


def _run(args: argparse.Namespace, cluster: kube_module.LightkubeApi) -> int:
    operator = runner.Operator(cluster)
    if args.once:
        results = operator.run_once()
        return 1 if any(r.error for r in results) else 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    elector = leader.LeaderElector(cluster, args.namespace, args.identity, args.lease_duration)
    LOG.info(
        "enflame-gcu-operator %s starting (Lease %s/%s)",
        args.identity,
        args.namespace,
        leader.LEASE_NAME,
    )
    try:
        while not stop.is_set():
            try:
                leading = elector.try_acquire(time.time())
                if leading:
                    for result in operator.run_once():
                        if result.actions:
                            LOG.info("%s: %d actions", result.resource, result.actions)
            except api.ApiError as exc:
                LOG.warning("pass failed: %s (retrying)", exc)
            stop.wait(args.interval if leading else args.lease_duration / 3)
    finally:
        elector.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
