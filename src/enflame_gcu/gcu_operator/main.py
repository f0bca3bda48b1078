"""enflame-gcu-operator: leader election, then reconcile every GcuResource every few seconds.

API trouble never ends the process: a refused or unanswered request (an API-server restart, a
network cut, a timeout) is logged once when it starts and once when it ends, and the loop retries
with a doubling delay; the Lease is renewed on its own thread, and passes stop writing as soon
as it has not been renewed within the renew deadline.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from enflame_gcu import bounded_http
from enflame_gcu.errors import ConfigError
from enflame_gcu.gcu_operator import api, leader, names, runner
from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.support import daemon_cli

if TYPE_CHECKING:
    from enflame_gcu.gcu_operator import kube as kube_module

LOG = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    daemon_cli.add_version(parser)
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
        help="seconds between full passes once converged (default 300): after a pass that "
        "planned nothing the wait doubles from --interval (up to 6 intervals while a resource "
        "is not settled); meanwhile the GcuResources, the nodes and each resource's pods are "
        "watched, and a change starts a pass at once; a failing watch is retried up to this "
        "late, a list standing in",
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=60,
        help="seconds a Lease stays valid without renewal (default 60: a standby takes over a "
        "crashed leader after this; the operator is never in a pod's start path)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=45.0,
        help="seconds without a renewal after which this replica stops writing (default 45)",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=15.0,
        help="seconds between attempts to take or renew the Lease (default 15: one PUT each "
        "while leading, 4 requests a minute, three tries within the renew deadline)",
    )
    parser.add_argument(
        "--allowed-namespaces",
        default="",
        help="comma-separated namespaces components may be deployed to (default: any); a "
        "component elsewhere is reported, not deployed",
    )
    parser.add_argument(
        "--component-namespace",
        default=None,
        help="namespace of every component that names none (default: --namespace, the "
        "operator's own, so that it needs write access nowhere else)",
    )
    parser.add_argument(
        "--scraper-namespace",
        default="",
        help="the namespace whose Prometheus pods may scrape the device plugin's metrics port "
        "(its NetworkPolicy matches the namespace's kubernetes.io/metadata.name label, which "
        "the API server sets); default none: the policy admits nothing",
    )
    parser.add_argument(
        "--dra-service-account",
        default="enflame-dra-plugin",
        help="ServiceAccount of the DRA driver's pods (the chart passes <release>-dra-plugin)",
    )
    parser.add_argument(
        "--image-registry",
        default=rs.DEFAULT_REPOSITORY,
        type=_registry,
        help="registry host and repository path of the components' images where a GcuResource "
        "names no repository (the chart passes its global.image.registry)",
    )
    parser.add_argument(
        "--image-tag",
        default=rs.DEFAULT_VERSION,
        type=_tag,
        help="tag of the components' images where a GcuResource names no version (the chart "
        "passes its global.image.tag, else its appVersion)",
    )
    daemon_cli.add_http_address(
        parser,
        serves="serve /healthz here (port 0 or empty: none): 200 while the loop comes round, "
        "else 503; an empty host is every address, the pod IP when replicas share a network "
        "namespace (hostNetwork)",
        default="",
        environ=os.environ,
        into=("health_address", "health_port"),
    )
    daemon_cli.add_old_address_part(parser, "--health-port", "health_port", prog=PROG, port=True)
    daemon_cli.add_old_address_part(
        parser, "--health-address", "health_address", prog=PROG, port=False
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=0.0,
        help="seconds the loop or the Lease's thread may go without coming round before "
        "/healthz answers 503 (default 0: max(60, 4 x --interval, 2 x --retry-period) + 60)",
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
    daemon_cli.add_logging(parser, os.environ)
    daemon_cli.apply_env_defaults(
        parser, os.environ, skip={"once", "remove_resources"}, shown=SHOWN_DEFAULTS
    )
    return parser


PROG = "enflame-gcu-operator"
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _registry(value: str) -> str:
    """An image registry prefix: no space, digest or tag, no trailing slash."""
    cleaned = value.rstrip("/")
    if not cleaned or any(c.isspace() for c in cleaned) or "@" in cleaned:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a registry and repository path (e.g. registry.example.com/enflame)"
        )
    return cleaned


def _tag(value: str) -> str:
    """An image tag as the distribution spec allows it."""
    if not _TAG.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an image tag (letters, digits, '_', '.', '-'; at most 128)"
        )
    return value


# Defaults the code computes, as --help and docs/operator.md show them.
SHOWN_DEFAULTS = {
    "kubeconfig": "KUBECONFIG, else the service account",
    "namespace": "POD_NAMESPACE, else kube-system",
    "identity": "POD_NAME, else the host name",
}


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


def configure_logging(level: str, log_format: str = "text") -> None:
    """The operator's log at ``level``; the HTTP client's requests only with ``debug``."""
    daemon_cli.configure_logging(level, log_format)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the operator until SIGTERM."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    rs.set_image_defaults(rs.ImageDefaults(args.image_registry, args.image_tag))
    cluster = _cluster(args.kubeconfig)
    try:
        return _run(args, cluster)
    except ConfigError as exc:  # the health port cannot be had: say so, not a traceback
        LOG.error("%s", exc)
        return 2
    finally:
        cluster.close()


class Health:
    """The liveness answer: healthy while the main loop and the Lease's thread each come round
    within ``stale_after`` seconds (a pass that hangs, not one that fails, is what a restart can
    cure) and no watched thread has ended (a renew thread that died would leave a replica that
    never leads again, or stops writing for good, behind a 200)."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._beats: dict[str, float] = {"the main loop": clock()}
        self._threads: dict[str, threading.Thread] = {}

    def beat(self, what: str = "the main loop") -> None:
        """``what`` came round."""
        self._beats[what] = self._clock()

    def watch_thread(self, what: str, thread: threading.Thread) -> None:
        """Unhealthy once ``thread`` has ended."""
        self._threads[what] = thread
        self._beats[what] = self._clock()

    def problem(self) -> str:
        """What is wrong ("" when healthy)."""
        now = self._clock()
        for what, thread in self._threads.items():
            if not thread.is_alive():
                return f"{what} has ended"
        for what, beat in self._beats.items():
            if now - beat > self._stale_after:
                return f"{what} has not come round for {now - beat:.0f} s"
        return ""

    def healthy(self) -> bool:
        """Whether every part came round recently enough."""
        return not self.problem()


# The /healthz port's bounds: the kubelet's probe is one connection every period; a flood of
# idle or half-sent connections costs at most these and never a thread each.
HEALTH_LIMITS = bounded_http.Limits(
    connections=16, per_client=8, rate_per_client=5.0, burst_per_client=10, head_bytes=2048
)


def serve_health(health: Health, port: int, host: str = "") -> bounded_http.BoundedServer:
    """/healthz on ``port`` (the project's bounded server, in a daemon thread of its own); the
    caller stops it. ConfigError when the port cannot be had."""

    def answer(request: bounded_http.Request) -> bounded_http.Response:
        if request.path != "/healthz":
            return bounded_http.Response(404, "not found\n")
        problem = health.problem()
        return bounded_http.Response(503 if problem else 200, f"{problem or 'ok'}\n")

    return bounded_http.serve(
        answer, host, port, HEALTH_LIMITS, name="health", what="the operator's /healthz"
    )


class Trouble:
    """Says once that the API is in trouble and once that it is over, however long it lasts."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._since: float | None = None
        self.failures = 0

    def failed(self, exc: Exception, *, unexpected: bool = False) -> None:
        """One more failure; logged only when it is the first of a run (``unexpected``: not
        the API's refusal but an error of ours, logged with its traceback)."""
        self.failures += 1
        if self._since is None:
            self._since = self._clock()
            LOG.log(
                logging.ERROR if unexpected else logging.WARNING,
                "%s failed: %s (retrying with backoff; said once)",
                self._what,
                exc,
                exc_info=unexpected,
            )
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
                cluster,
                allowed_namespaces=allowed_namespaces(args),
                component_namespace=component_namespace(args),
                scraper_namespace=str(args.scraper_namespace or ""),
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


def component_namespace(args: argparse.Namespace) -> str:
    """--component-namespace, by default the operator's own (--namespace)."""
    given = getattr(args, "component_namespace", None)
    return str(given if given is not None else args.namespace)


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
    health: Health | None = None,
) -> None:
    """Take or renew the Lease every ``period`` seconds until ``stop``. No error ends it: an
    error of ours (a Lease whose fields this code cannot read, a bug) is logged with its
    traceback once and tried again, as the API's refusals are; the thread beats ``health``."""
    trouble = Trouble("taking or renewing the Lease")
    while not stop.is_set():
        try:
            elector.try_acquire()
            trouble.ok()
        except api.ApiError as exc:
            trouble.failed(exc)
        except Exception as exc:  # the renewals must outlive any one failure
            trouble.failed(exc, unexpected=True)
        if health is not None:
            health.beat(RENEWER)
        stop.wait(period)


RENEWER = "the Lease's renew thread"


def idle_delay(interval: float, max_interval: float, idle: int) -> float:
    """Seconds to the next full pass after ``idle`` passes in a row that changed nothing:
    ``interval`` while work is going on, then doubling up to ``max_interval``."""
    if idle <= 0:
        return interval
    return float(min(max(interval, max_interval), interval * 2 ** min(idle, 16)))


# A quiet pass (no action planned) that is not settled (pods starting, a NotReady node, a
# refused resource, a drain waiting on a PodDisruptionBudget) waits on the watches too, but comes
# round at least every this many --interval (30 s at the default 5): what only time changes
# (podReadyTimeoutSeconds, a drain's timeout, a removal's wait on a NotReady node) is looked at
# then.
UNSETTLED_INTERVALS = 6
# While one kind's watch keeps failing, that kind is listed instead (compared with what the last
# pass read), from every --interval, doubling per failure up to this many --interval (60 s at
# the default); its watch is tried again from every --interval, doubling up to --max-interval.
LIST_FALLBACK_INTERVALS = 12


def fingerprint(cluster: api.ClusterApi) -> frozenset[tuple[str, str, str]]:
    """Every GcuResource's (group, uid, resourceVersion): one cheap list per group."""
    return frozenset(
        runner.resource_key(kind.group, resource)
        for kind, resource in runner.list_resources(cluster)
    )


class WatchBackoff:
    """Failures in a row of each watch, kept across idle waits: a watch that keeps failing (an
    API server whose watch cache lags answers every watch ``504 Too large resource version``
    after a few seconds) is retried later and later, never at once with a full pass."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}

    def failures(self, key: str) -> int:
        """Failures in a row of that watch."""
        with self._lock:
            return self._failures.get(key, 0)

    def retry_at(self, key: str) -> float:
        """When (this clock) that watch may be tried again."""
        with self._lock:
            return self._retry_at.get(key, 0.0)

    def failed(self, key: str, interval: float, max_interval: float) -> float:
        """One more failure: the seconds until the next try (doubling from ``interval``)."""
        with self._lock:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = float(min(max(interval, max_interval), interval * 2 ** min(failures, 16)))
            self._retry_at[key] = self._clock() + delay
            return delay

    def ok(self, key: str) -> None:
        """The watch worked."""
        with self._lock:
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)

    def list_delay(self, key: str, interval: float) -> float:
        """Seconds between the lists standing in for that failing watch."""
        failures = self.failures(key)
        return float(
            min(interval * LIST_FALLBACK_INTERVALS, interval * 2 ** min(max(failures - 1, 0), 16))
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """One watch of the idle wait: a kind, its label selector, the key of its backoff."""

    kind: api.Kind
    labels: Mapping[str, str] | None = None
    # The resource whose pods these are ("" for the GcuResources and the Nodes).
    owner: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind.plural}/{self.owner}" if self.owner else self.kind.plural


class _Watches:
    """The idle wait's watches: one request per GcuResource group, one on the nodes and one on
    each resource's pods (by its label), each held until the wait ends; ``changed`` is set by
    the first event that differs from what the last pass read (a GcuResource added, edited or
    deleted; a node added, deleted or relabelled; one of the resource's pods made, changed or
    gone). A node's annotations and status (heartbeats, the device plugins' node state) are not
    changes: those events are read and dropped. A watch that fails does not end the wait: it is
    retried after a doubling delay (``backoff``), and meanwhile its kind is listed and compared
    instead, never more often than every ``interval``."""

    def __init__(
        self,
        cluster: api.ClusterApi,
        seen_resources: frozenset[tuple[str, str, str]],
        seen_nodes: dict[str, dict[str, str]] | None,
        seen_pods: Mapping[str, Mapping[str, str]] | None = None,
        *,
        backoff: WatchBackoff | None = None,
        interval: float = 5.0,
        max_interval: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cluster = cluster
        self._seen_resources = seen_resources
        self._seen_nodes = seen_nodes
        self._seen_pods = dict(seen_pods or {})
        self._backoff = backoff or WatchBackoff(clock)
        self._interval = interval
        self._max_interval = max_interval
        self._clock = clock
        self.changed = threading.Event()
        self.done = threading.Event()
        self._threads: list[threading.Thread] = []

    def targets(self) -> list[_Target]:
        """What this wait watches."""
        out = [_Target(kind) for kind in runner.GROUPS]
        if self._seen_nodes is not None:
            out.append(_Target(api.NODE))
        out.extend(
            _Target(api.POD, {names.RESOURCE_LABEL: uid}, uid) for uid in sorted(self._seen_pods)
        )
        return out

    def start(self, timeout: float) -> None:
        """One thread per target, until ``timeout`` seconds from now or :meth:`stop`."""
        deadline = self._clock() + timeout
        for target in self.targets():
            thread = threading.Thread(
                target=self._follow,
                args=(target, deadline),
                name=f"idle-watch-{target.key}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _follow(self, target: _Target, deadline: float) -> None:
        while not self.done.is_set() and not self.changed.is_set():
            now = self._clock()
            if now >= deadline:
                return
            if now >= self._backoff.retry_at(target.key):
                started = now
                try:
                    self._watch(target, deadline - now)
                except api.ApiError as exc:
                    if exc.status == api.NOT_FOUND and target.kind in runner.GROUPS:
                        return  # that group's CRD is not installed: nothing to watch
                    delay = self._backoff.failed(target.key, self._interval, self._max_interval)
                    LOG.debug(
                        "idle watch of %s failed: %s (listed instead; watched again in %.0f s)",
                        target.key,
                        exc,
                        delay,
                    )
                else:
                    self._backoff.ok(target.key)
                    if self._clock() - started < self._interval:
                        # Ended early without an error: not again at once.
                        self.done.wait(min(self._interval, max(0.0, deadline - self._clock())))
                    continue
            # The watch is backing off: a list stands in for it, at a doubling delay.
            wait = min(
                self._backoff.list_delay(target.key, self._interval),
                self._backoff.retry_at(target.key) - self._clock(),
                deadline - self._clock(),
            )
            if self.done.wait(max(self._interval, wait) if wait > 0 else 0):
                return
            if self._clock() >= deadline:
                return
            try:
                listed = self._cluster.list(target.kind, labels=target.labels)
            except api.ApiError as exc:
                LOG.debug("idle list of %s failed: %s", target.key, exc)
                continue
            if self._list_differs(target, listed):
                LOG.debug("%s changed while idle (seen by a list)", target.key)
                self.changed.set()
                return

    def _watch(self, target: _Target, timeout: float) -> None:
        # Whole seconds, rounded up: a watch that ended up to a second before the wait would be
        # followed by a second watch of that second (one more request per kind and wait).
        events = self._cluster.watch(
            target.kind, timeout=max(1, math.ceil(timeout)), labels=target.labels
        )
        try:
            for event_type, obj in events:
                if self.done.is_set():
                    return
                if self._differs(target, event_type, obj):
                    LOG.debug("%s %s changed while idle", target.key, runner.node_name(obj))
                    self.changed.set()
                    return
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def _differs(self, target: _Target, event_type: str, obj: dict[str, object]) -> bool:
        kind = target.kind
        if event_type == "BOOKMARK":
            return False
        if kind in runner.GROUPS:
            key = runner.resource_key(kind.group, obj)
            return event_type != "ADDED" or key not in self._seen_resources
        if event_type == "DELETED":
            return True
        if kind == api.POD:
            uid, version = runner.version_of(obj)
            return self._seen_pods.get(target.owner, {}).get(uid) != version
        seen = self._seen_nodes or {}
        return seen.get(runner.node_name(obj)) != runner.node_labels(obj)

    def _list_differs(self, target: _Target, listed: list[dict[str, object]]) -> bool:
        kind = target.kind
        if kind in runner.GROUPS:
            mine = {k for k in self._seen_resources if k[0] == kind.group}
            return {runner.resource_key(kind.group, r) for r in listed} != mine
        if kind == api.POD:
            have = dict(runner.version_of(p) for p in listed)
            return have != dict(self._seen_pods.get(target.owner, {}))
        return {runner.node_name(n): runner.node_labels(n) for n in listed} != (
            self._seen_nodes or {}
        )

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
    cap: float | None = None,
    beat: Callable[[], None] = lambda: None,
    backoff: WatchBackoff | None = None,
    settled: bool = False,
) -> None:
    """Wait for the next pass: ``interval`` while working; after a quiet pass, up to
    ``idle_delay`` seconds (at most ``cap``, default ``--max-interval``; the whole ``cap`` at
    once when every resource is ``settled``), watching the
    GcuResources, the nodes and the resources' pods (a handful of requests per wait, not a list
    every ``interval``) and starting a pass at once when one of them changed from what the last
    pass read (a spec edit, a new or relabelled node, a pod becoming ready is not delayed).
    ``beat`` is called at least every ``interval`` while waiting: the wait is the loop coming
    round, not a hang."""
    max_interval = float(getattr(args, "max_interval", args.interval))
    limit = max_interval if cap is None else cap
    delay = max(args.interval, limit) if settled else idle_delay(args.interval, limit, idle)
    if delay <= args.interval:
        stop.wait(delay)
        return
    deadline = clock() + delay
    seen = operator.seen_resources if operator is not None else None
    seen_nodes = operator.seen_nodes if operator is not None else None
    seen_pods = operator.seen_pods if operator is not None else None
    if seen is None:
        try:
            seen = fingerprint(cluster)
        except api.ApiError:
            stop.wait(args.interval)
            return
    watches = _Watches(
        cluster,
        seen,
        seen_nodes,
        seen_pods,
        backoff=backoff,
        interval=args.interval,
        max_interval=max_interval,
        clock=clock,
    )
    watches.start(delay)
    try:
        while not stop.is_set() and not watches.changed.is_set():
            beat()
            left = deadline - clock()
            if left <= 0:
                return
            watches.changed.wait(min(args.interval, left))
    finally:
        watches.stop()


def health_timeout(args: argparse.Namespace) -> float:
    """Seconds the loop may go without coming round before /healthz answers 503: past its
    longest healthy round, an idle wait's --interval, a standby's (and the renew thread's)
    --retry-period, or a backoff (MAX_BACKOFF) after a failed pass."""
    given = float(getattr(args, "health_timeout", 0) or 0)
    if given > 0:
        return given
    return float(max(60.0, 4 * args.interval, 2 * args.retry_period)) + MAX_BACKOFF


def _next_wait_cap(
    args: argparse.Namespace, results: list[runner.PassResult], now: float
) -> float | None:
    """How long a quiet pass may wait (None: not quiet, the next pass after ``interval``).

    Quiet: no resource planned an action and none failed to be read or written (a refused one,
    waiting out its backoff, is quiet until its next try). Settled quiet passes wait up to
    --max-interval; others up to UNSETTLED_INTERVALS x --interval, and never past a refused
    resource's next try."""
    max_interval = float(getattr(args, "max_interval", args.interval))
    if any(r.actions or (r.error and r.retry_at is None) for r in results):
        return None
    cap = max_interval
    if not all(r.settled and not r.error for r in results):
        cap = min(cap, UNSETTLED_INTERVALS * args.interval)
    retries = [r.retry_at for r in results if r.retry_at is not None]
    if retries:
        cap = min(cap, max(args.interval, min(retries) - now))
    return cap


def serve(
    args: argparse.Namespace,
    cluster: api.ClusterApi,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Elect, and reconcile while leading, until ``stop`` is set; API failures never end it.

    ``clock`` is the wall clock (the Lease's and the status's stamps); every duration is timed
    on ``monotonic`` (the Lease's deadlines, the waits, /healthz's staleness)."""
    elector = leader.LeaderElector(
        cluster,
        args.namespace,
        args.identity,
        args.lease_duration,
        renew_deadline=args.renew_deadline,
        clock=monotonic,
        wall=clock,
    )
    operator = runner.Operator(
        cluster,
        clock=clock,
        may_write=elector.leading,
        allowed_namespaces=allowed_namespaces(args),
        dra_service_account=getattr(args, "dra_service_account", "enflame-dra-plugin"),
        component_namespace=component_namespace(args),
        scraper_namespace=str(getattr(args, "scraper_namespace", "") or ""),
    )
    LOG.info(
        "enflame-gcu-operator %s starting (Lease %s/%s)",
        args.identity,
        args.namespace,
        leader.LEASE_NAME,
    )
    health = Health(stale_after=health_timeout(args), clock=monotonic)
    renewer = threading.Thread(
        target=_renew,
        args=(elector, stop, args.retry_period, health),
        name="lease",
        daemon=True,
    )
    renewer.start()
    health.watch_thread(RENEWER, renewer)
    trouble = Trouble("reconcile pass", monotonic)
    backoff = WatchBackoff(monotonic)
    idle = 0
    port = getattr(args, "health_port", 0)
    server = serve_health(health, port, getattr(args, "health_address", "")) if port else None
    try:
        while not stop.is_set():
            health.beat()
            if not elector.leading():
                stop.wait(args.retry_period)
                continue
            results: list[runner.PassResult] = []
            try:
                results = operator.run_once()
                for result in results:
                    if result.actions:
                        LOG.info("%s: %d actions", result.resource, result.actions)
                trouble.ok()
            except api.ApiError as exc:
                trouble.failed(exc)
            if trouble.failures:
                stop.wait(trouble.delay(args.interval))
                continue
            cap = _next_wait_cap(args, results, clock())
            idle = idle + 1 if cap is not None else 0
            # Settled, nothing is left for time to change: the next full pass only after the
            # whole --max-interval (the watches start a pass at once on any change that matters,
            # and their first events are compared with this pass's reads, so nothing made
            # between the two is missed). Doubling up to it from --interval made 5 full passes
            # in the first 5 minutes after every change, about 13 requests each.
            settled = cap is not None and all(r.settled and not r.error for r in results)
            _idle_wait(
                cluster,
                stop,
                args,
                idle,
                clock=monotonic,
                operator=operator,
                cap=cap,
                beat=health.beat,
                backoff=backoff,
                settled=settled,
            )
    finally:
        stop.set()
        if server is not None:
            server.stop()
        renewer.join()
        elector.release()


if __name__ == "__main__":
    raise SystemExit(main())
