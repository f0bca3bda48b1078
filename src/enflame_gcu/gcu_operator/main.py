"""enflame-gcu-operator: leader election, then reconcile every GcuResource every few seconds.

API trouble never ends the process: a refused or unanswered request (an API-server restart, a
network cut, a timeout) is logged once when it starts and once when it ends, and the loop retries
with a doubling delay; the Lease is renewed on its own thread, and passes stop writing as soon
as it has not been renewed within the renew deadline.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
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
        "--max-interval",
        type=float,
        default=300.0,
        help="seconds between full passes once converged (default 300): the wait doubles from "
        "--interval; meanwhile the GcuResources and nodes are watched, and a changed "
        "GcuResource or a new, deleted or relabelled node starts a pass at once",
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=40,
        help="seconds a Lease stays valid without renewal (default 40: a standby takes over a "
        "crashed leader after this; the operator is never in a pod's start path)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=30.0,
        help="seconds without a renewal after which this replica stops writing (default 30)",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=10.0,
        help="seconds between attempts to take or renew the Lease (default 10: one PUT each "
        "while leading, 6 requests a minute)",
    )
    parser.add_argument(
        "--allowed-namespaces",
        default="",
        help="comma-separated namespaces components may be deployed to (default: any); a "
        "component elsewhere is reported, not deployed",
    )
    parser.add_argument(
        "--dra-service-account",
        default="enflame-dra-plugin",
        help="ServiceAccount of the DRA driver's pods (the chart passes <release>-dra-plugin)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="serve /healthz on this port (0: none): 200 while the loop comes round, else 503",
    )
    parser.add_argument(
        "--health-address",
        default="",
        help="the address /healthz listens on (default: all); the pod IP when replicas share "
        "a network namespace (hostNetwork)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit (no election)")
    parser.add_argument(
        "--remove-resources",
        action="store_true",
        help="delete every GcuResource (both groups) and wait until the running operator has "
        "removed their components and they are gone (the chart's pre-delete hook)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds --remove-resources waits (default 600)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def _cluster(kubeconfig: str) -> kube_module.LightkubeApi:
    import httpx2  # noqa: PLC0415 - lightkube's HTTP client
    import lightkube  # noqa: PLC0415 - the CLI's --help needs no client
    from lightkube.config.kubeconfig import KubeConfig  # noqa: PLC0415

    from enflame_gcu.gcu_operator import kube  # noqa: PLC0415

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return kube.LightkubeApi(
        lightkube.Client(
            config, field_manager="enflame-gcu-operator", timeout=httpx2.Timeout(REQUEST_TIMEOUT)
        )
    )


# Seconds one API request may take: a server that stops answering is a failed call, not a hang.
REQUEST_TIMEOUT = 20.0
# The longest wait between attempts while the API server is unreachable or refusing.
MAX_BACKOFF = 60.0


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


class Health:
    """The liveness answer: healthy while the main loop comes round within ``stale_after``
    seconds (a pass that hangs, not one that fails, is what a restart can cure)."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._beat = clock()

    def beat(self) -> None:
        """The loop came round."""
        self._beat = self._clock()

    def healthy(self) -> bool:
        """Whether the loop came round recently enough."""
        return self._clock() - self._beat <= self._stale_after


def serve_health(health: Health, port: int, host: str = "") -> http.server.ThreadingHTTPServer:
    """/healthz on ``port`` in a daemon thread; the caller shuts the server down."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/healthz" and health.healthy()
            body = b"ok\n" if ok else b"stale\n" if self.path == "/healthz" else b"not found\n"
            self.send_response(200 if ok else 503 if self.path == "/healthz" else 404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


class Trouble:
    """Says once that the API is in trouble and once that it is over, however long it lasts."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._since: float | None = None
        self.failures = 0

    def failed(self, exc: Exception) -> None:
        """One more failure; logged only when it is the first of a run."""
        self.failures += 1
        if self._since is None:
            self._since = self._clock()
            LOG.warning("%s failed: %s (retrying with backoff; said once)", self._what, exc)
        else:
            LOG.debug("%s failed again: %s", self._what, exc)

    def ok(self) -> None:
        """A success: ends a run of failures."""
        if self._since is not None:
            LOG.info(
                "%s works again after %.0f s and %d failed attempts",
                self._what,
                self._clock() - self._since,
                self.failures,
            )
        self._since = None
        self.failures = 0

    def delay(self, base: float) -> float:
        """``base`` doubled per failure in a row, at most MAX_BACKOFF."""
        if not self.failures:
            return base
        return float(min(MAX_BACKOFF, base * 2 ** min(self.failures, 16)))


def _run(args: argparse.Namespace, cluster: kube_module.LightkubeApi) -> int:
    if args.remove_resources:
        return remove_resources(cluster, args.timeout)
    if args.once:
        try:
            results = runner.Operator(
                cluster, allowed_namespaces=allowed_namespaces(args)
            ).run_once()
        except api.ApiError as exc:
            LOG.error("pass failed: %s", exc)
            return 1
        return 1 if any(r.error for r in results) else 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    serve(args, cluster, stop)
    return 0


def allowed_namespaces(args: argparse.Namespace) -> frozenset[str]:
    """--allowed-namespaces as a set (empty: any namespace)."""
    text = str(getattr(args, "allowed_namespaces", "") or "")
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def remove_resources(
    cluster: api.ClusterApi,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Delete every GcuResource and wait until all are gone (their finalizer lifted by the
    operator once it removed their components in reverse order): 0, or 1 naming those left."""
    deadline = clock() + timeout
    left: list[str] = []
    while True:
        left = []
        try:
            for kind, resource in runner.list_resources(cluster):
                meta = resource["metadata"]
                left.append(f"{kind.group}/{meta['name']}")
                if not meta.get("deletionTimestamp"):
                    cluster.delete(kind, str(meta["name"]))
                    LOG.info("deleting GcuResource %s (%s)", meta["name"], kind.group)
        except api.ApiError as exc:
            LOG.warning("removing GcuResources: %s (retrying)", exc)
            left = left or ["(could not list)"]
        if not left:
            LOG.info("no GcuResource left")
            return 0
        if clock() >= deadline:
            LOG.error(
                "GcuResources still present after %.0f s: %s (is the operator running?)",
                timeout,
                ", ".join(left),
            )
            return 1
        sleep(2.0)


def _renew(
    elector: leader.LeaderElector,
    stop: threading.Event,
    period: float,
    clock: Callable[[], float],
) -> None:
    """Take or renew the Lease every ``period`` seconds until ``stop``."""
    trouble = Trouble("taking or renewing the Lease")
    while not stop.is_set():
        try:
            elector.try_acquire(clock())
            trouble.ok()
        except api.ApiError as exc:
            trouble.failed(exc)
        stop.wait(period)


def idle_delay(interval: float, max_interval: float, idle: int) -> float:
    """Seconds to the next full pass after ``idle`` passes in a row that changed nothing:
    ``interval`` while work is going on, then doubling up to ``max_interval``."""
    if idle <= 0:
        return interval
    return float(min(max(interval, max_interval), interval * 2 ** min(idle, 16)))


def fingerprint(cluster: api.ClusterApi) -> frozenset[tuple[str, str, str]]:
    """Every GcuResource's (group, uid, resourceVersion): one cheap list per group."""
    return frozenset(
        runner.resource_key(kind.group, resource)
        for kind, resource in runner.list_resources(cluster)
    )


class _Watches:
    """The idle wait's watches: one request per GcuResource group and one on the nodes, each
    ending after the wait's length; ``changed`` is set by the first event that differs from
    what the last pass read (a GcuResource added, edited or deleted; a node added, deleted or
    relabelled). A node's annotations and status (heartbeats, the device plugins' node state)
    are not changes: those events are read and dropped."""

    def __init__(
        self,
        cluster: api.ClusterApi,
        seen_resources: frozenset[tuple[str, str, str]],
        seen_nodes: dict[str, dict[str, str]] | None,
    ) -> None:
        self._cluster = cluster
        self._seen_resources = seen_resources
        self._seen_nodes = seen_nodes
        self.changed = threading.Event()
        self.done = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, timeout: float) -> None:
        """One watch per GcuResource group (and the nodes, when the last pass read them)."""
        kinds: list[api.Kind] = list(runner.GROUPS)
        if self._seen_nodes is not None:
            kinds.append(api.NODE)
        for kind in kinds:
            thread = threading.Thread(
                target=self._watch,
                args=(kind, timeout),
                name=f"idle-watch-{kind.plural}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _watch(self, kind: api.Kind, timeout: float) -> None:
        try:
            events = self._cluster.watch(kind, timeout=int(timeout))
            try:
                for event_type, obj in events:
                    if self.done.is_set():
                        return
                    if self._differs(kind, event_type, obj):
                        LOG.debug("%s %s changed while idle", kind.kind, runner.node_name(obj))
                        self.changed.set()
                        return
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
        except api.ApiError as exc:
            if exc.status == api.NOT_FOUND and kind in runner.GROUPS:
                return  # that group's CRD is not installed: nothing to watch
            LOG.debug("idle watch of %s failed: %s (a full pass follows)", kind.plural, exc)
            self.changed.set()

    def _differs(self, kind: api.Kind, event_type: str, obj: dict[str, object]) -> bool:
        if event_type == "BOOKMARK":
            return False
        if kind in runner.GROUPS:
            key = runner.resource_key(kind.group, obj)
            return event_type != "ADDED" or key not in self._seen_resources
        seen = self._seen_nodes or {}
        name = runner.node_name(obj)
        if event_type == "DELETED":
            return True
        return seen.get(name) != runner.node_labels(obj)

    def stop(self) -> None:
        """The wait is over: each watch returns at its next event or when its request ends."""
        self.done.set()


def _idle_wait(
    cluster: api.ClusterApi,
    stop: threading.Event,
    args: argparse.Namespace,
    idle: int,
    clock: Callable[[], float],
    *,
    operator: runner.Operator | None = None,
) -> None:
    """Wait for the next pass: ``interval`` while working; when converged, up to
    ``idle_delay`` seconds, watching the GcuResources and the nodes (a handful of requests per
    wait, not a list every ``interval``) and starting a pass at once when one of them changed
    from what the last pass read (a spec edit, a new or relabelled node is not delayed)."""
    delay = idle_delay(args.interval, getattr(args, "max_interval", args.interval), idle)
    if delay <= args.interval:
        stop.wait(delay)
        return
    deadline = clock() + delay
    seen = operator.seen_resources if operator is not None else None
    seen_nodes = operator.seen_nodes if operator is not None else None
    if seen is None:
        try:
            seen = fingerprint(cluster)
        except api.ApiError:
            stop.wait(args.interval)
            return
    watches = _Watches(cluster, seen, seen_nodes)
    watches.start(delay)
    try:
        while not stop.is_set() and not watches.changed.is_set():
            left = deadline - clock()
            if left <= 0:
                return
            watches.changed.wait(min(args.interval, left))
    finally:
        watches.stop()


def serve(
    args: argparse.Namespace,
    cluster: api.ClusterApi,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
) -> None:
    """Elect, and reconcile while leading, until ``stop`` is set; API failures never end it."""
    elector = leader.LeaderElector(
        cluster,
        args.namespace,
        args.identity,
        args.lease_duration,
        renew_deadline=args.renew_deadline,
    )
    operator = runner.Operator(
        cluster,
        clock=clock,
        may_write=lambda: elector.leading(clock()),
        allowed_namespaces=allowed_namespaces(args),
        dra_service_account=getattr(args, "dra_service_account", "enflame-dra-plugin"),
    )
    LOG.info(
        "enflame-gcu-operator %s starting (Lease %s/%s)",
        args.identity,
        args.namespace,
        leader.LEASE_NAME,
    )
    renewer = threading.Thread(
        target=_renew,
        args=(elector, stop, args.retry_period, clock),
        name="lease",
        daemon=True,
    )
    renewer.start()
    trouble = Trouble("reconcile pass")
    idle = 0
    health = Health(stale_after=max(60.0, 4 * args.interval) + MAX_BACKOFF)
    port = getattr(args, "health_port", 0)
    server = serve_health(health, port, getattr(args, "health_address", "")) if port else None
    try:
        while not stop.is_set():
            health.beat()
            if not elector.leading(clock()):
                stop.wait(args.retry_period)
                continue
            converged = False
            try:
                results = operator.run_once()
                for result in results:
                    if result.actions:
                        LOG.info("%s: %d actions", result.resource, result.actions)
                converged = all(r.settled and not r.error for r in results)
                trouble.ok()
            except api.ApiError as exc:
                trouble.failed(exc)
            if trouble.failures:
                stop.wait(trouble.delay(args.interval))
                continue
            idle = idle + 1 if converged else 0
            _idle_wait(cluster, stop, args, idle, clock=time.monotonic, operator=operator)
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
            server.server_close()
        renewer.join()
        elector.release()


if __name__ == "__main__":
    raise SystemExit(main())
