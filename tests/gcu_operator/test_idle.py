"""Issue 47: an idle operator stays alive and quiet.

Point 1: converged, the main loop waits up to --max-interval, yet /healthz (the chart's liveness
probe) never fails. Point 7: a pass that plans nothing waits on its watches whatever the phase
(the resource's pods are watched by label), and watches that keep failing are backed off, with
a list standing in for them, never a full pass each time. Time is scaled down: the chart's
seconds are hundredths here.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, main, runner
from tests.deploy import helm_render
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
# One second of the chart's is this many here.
SCALE = 0.01
TOO_LARGE = "Timeout: Too large resource version: 406, current: 299"


class Recorded(FakeApi):
    """A FakeApi that serialises its calls (the Lease's thread, the pass and the watches share
    it), stamps each call with the monotonic time, and can fail every watch as a lagging watch
    cache does: 504 after ``watch_fails_after`` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.stamps: list[tuple[float, str, str]] = []
        self.watch_fails_after: float | None = None

    def _call(self, verb: str, kind: api.Kind) -> None:
        self.stamps.append((time.monotonic(), verb, kind.kind))
        super()._call(verb, kind)

    def watch(self, kind: api.Kind, timeout: int, labels: Any = None) -> Iterator[Any]:
        if self.watch_fails_after is not None:
            self._call("watch", kind)
            time.sleep(self.watch_fails_after)
            raise api.ApiError(504, TOO_LARGE)
        return super().watch(kind, timeout, labels)

    def passes(self, since: float = 0.0) -> list[float]:
        """When each full pass observed a resource (its list of the resource's DaemonSets,
        which nothing else lists)."""
        return [
            t
            for t, verb, kind in self.stamps
            if t >= since and verb == "list" and kind == "DaemonSet"
        ]

    def requests(self, since: float = 0.0) -> int:
        return sum(1 for t, _, _ in self.stamps if t >= since)


def _serialised(fake: Recorded) -> None:
    for name in ("get", "list", "create", "replace", "patch", "delete", "replace_status"):
        method = getattr(fake, name)

        def call(*a: Any, _m: Any = method, **k: Any) -> Any:
            with fake.lock:
                return _m(*a, **k)

        setattr(fake, name, call)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _args(**over: Any) -> argparse.Namespace:
    base = {
        "namespace": "kube-system",
        "identity": "op-1",
        "interval": 5 * SCALE,
        "max_interval": 300 * SCALE,
        "lease_duration": 15,
        "renew_deadline": 10.0,
        "retry_period": 10 * SCALE,
    }
    base.update(over)
    return argparse.Namespace(**base)


@contextlib.contextmanager
def _serving(fake: Recorded, args: argparse.Namespace) -> Iterator[None]:
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            main.serve(args, fake, stop, clock=lambda: fake.now)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert not failure, failure


def _converged(nodes: int = 2) -> tuple[Recorded, FakeCluster]:
    fake = Recorded()
    cluster = FakeCluster(fake, [f"node-{i}" for i in range(nodes)])
    fake.put(api.GCU_RESOURCE, ours())
    converge(runner.Operator(fake, clock=lambda: fake.now), cluster)
    _serialised(fake)
    return fake, cluster


def _probe(port: int) -> bool:
    """One GET /healthz as the kubelet's probe sends it: whether it answered 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _chart_probe(tmp_path: Any) -> tuple[float, int, float]:
    """The chart's liveness probe (period, failure threshold) and the operator's --interval."""
    rendered = helm_render.render(str(tmp_path), {"operator": {"enabled": True}})
    deployment = next(d for d in helm_render.objects(rendered, "Deployment") if d)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    probe = container["livenessProbe"]
    interval = next(a for a in container["args"] if a.startswith("--interval="))
    return (
        float(probe.get("periodSeconds", 10)),
        int(probe.get("failureThreshold", 3)),
        float(interval.partition("=")[2]),
    )


# --- point 1: idle liveness ---------------------------------------------------------------------


@needs_helm
def test_an_idle_operator_never_fails_the_charts_liveness_probe(tmp_path: Any) -> None:
    """Converged, the loop waits up to --max-interval between passes, longer than /healthz's
    staleness limit; polled as the chart's probe polls it, for over two --max-intervals, it
    never fails failureThreshold times in a row (the kubelet would restart it)."""
    period, threshold, interval = _chart_probe(tmp_path)
    fake, _ = _converged()
    port = _free_port()
    args = _args(
        interval=interval * SCALE,
        health_port=port,
        health_address="127.0.0.1",
        # The default limit, max(60, 4 x interval) + 60 s, scaled like the rest.
        health_timeout=(max(60.0, 4 * interval) + main.MAX_BACKOFF) * SCALE,
    )
    started = time.monotonic()
    failed_in_a_row = worst = polls = 0
    with _serving(fake, args):
        while time.monotonic() - started < 2 * args.max_interval + 4 * period * SCALE:
            time.sleep(period * SCALE)
            polls += 1
            failed_in_a_row = 0 if _probe(port) else failed_in_a_row + 1
            worst = max(worst, failed_in_a_row)
    passes = fake.passes(started)
    gaps = [b - a for a, b in itertools.pairwise(passes)]
    # It was idle: some wait between two passes outlasted the staleness limit.
    assert gaps and max(gaps) > args.health_timeout, gaps
    assert polls > 2 * threshold
    assert worst < threshold, (
        f"{worst} failed probes in a row (the kubelet restarts at {threshold})"
    )


# --- point 7: polling ---------------------------------------------------------------------------


def test_failing_watches_are_backed_off_and_a_list_stands_in() -> None:
    """Every watch answers 504 after a while, as on an API server whose watch cache lags: the
    converged operator must not make a full pass after each failure (about 300 requests a
    minute at the defaults), but back each watch off up to --max-interval and list instead; a
    spec edit made meanwhile is still seen."""
    fake, _ = _converged()
    fake.watch_fails_after = 3 * SCALE
    args = _args()
    minute = 60 * SCALE
    with _serving(fake, args):
        time.sleep(0.5)  # the first pass and the first failures
        started = time.monotonic()
        time.sleep(3 * minute)
        counted = fake.requests(started)
        passes = fake.passes(started)
        watches = [t for t, verb, kind in fake.stamps if verb == "watch" and kind == "Node"]
        resource = fake.find(api.GCU_RESOURCE, "gcu")
        assert resource is not None
        resource["spec"]["devicePlugin"] = {"version": "0.2.0"}
        edited = time.monotonic()
        fake.replace(api.GCU_RESOURCE, resource)
        deadline = edited + 2 * main.LIST_FALLBACK_INTERVALS * args.interval + 2.0
        while not [t for t in fake.passes(edited)] and time.monotonic() < deadline:
            time.sleep(0.02)
        seen = fake.passes(edited)
    per_minute = counted / 3
    # A pass is about a dozen requests and the Lease 6 a minute: without backoff one pass per
    # failed watch is hundreds a minute.
    assert per_minute < 60, (per_minute, len(passes))
    assert len(passes) <= 3 * minute / args.interval / 8, passes
    # The Node watch is retried later and later: the delay doubles, so by the fourth retry it
    # is 8x the first; a loaded machine stretches the early gaps (a pass runs in them), so the
    # check is 3x the shortest early gap, which a fixed retry delay never reaches.
    gaps = [b - a for a, b in itertools.pairwise(watches)]
    assert len(gaps) >= 3 and max(gaps[-2:]) >= 3 * min(gaps[:2]), gaps
    assert seen, "the spec edit made while the watches failed was not seen"


def test_a_quiet_pass_waits_on_watches_whatever_the_phase_and_a_pod_ends_the_wait() -> None:
    """A resource still Deploying (its pods not ready yet) plans nothing in most passes: those
    passes wait on the watches (not a full pass every --interval), and the resource's pods are
    watched by its label, so a pod becoming ready starts a pass at once."""
    fake = Recorded()
    cluster = FakeCluster(fake, ["node-a"], ready_after=2)
    fake.put(api.GCU_RESOURCE, ours())
    _serialised(fake)
    args = _args()
    with _serving(fake, args):
        time.sleep(0.5)  # the DaemonSets are made and the node labelled; no pod yet
        with fake.lock:
            cluster.step()  # the toolkit's pod appears, not ready
        time.sleep(0.5)
        started = time.monotonic()
        time.sleep(2.0)
        quiet = fake.passes(started)
        phase = (fake.find(api.GCU_RESOURCE, "gcu") or {}).get("status", {}).get("phase")
        stepped = time.monotonic()
        with fake.lock:
            cluster.step()  # the toolkit's pod becomes ready
        deadline = stepped + 1.0
        while not fake.passes(stepped) and time.monotonic() < deadline:
            time.sleep(0.01)
        woken = fake.passes(stepped)
    assert phase == "Deploying"
    # Every --interval would be 40 passes; waiting on the watches (at most 6 intervals while
    # not settled), under a quarter of that.
    assert len(quiet) <= 10, len(quiet)
    assert woken and woken[0] - stepped < 0.5, "the ready pod did not end the wait"


def test_a_quiet_unsettled_pass_still_comes_round_within_the_unsettled_limit() -> None:
    """What only time changes (a pod's ready timeout) is looked at again within 30 s at the
    defaults, not only after --max-interval."""
    results = [runner.PassResult("gcu", actions=0, settled=False)]
    cap = main._next_wait_cap(_args(interval=5.0, max_interval=300.0), results, 0.0)
    assert cap == main.UNSETTLED_INTERVALS * 5.0 == 30.0
    settled = [runner.PassResult("gcu", settled=True)]
    assert main._next_wait_cap(_args(interval=5.0, max_interval=300.0), settled, 0.0) == 300.0
    refused = [runner.PassResult("gcu", error="refused", retry_at=12.0)]
    assert main._next_wait_cap(_args(interval=5.0, max_interval=300.0), refused, 2.0) == 10.0
    busy = [runner.PassResult("gcu", actions=3)]
    assert main._next_wait_cap(_args(interval=5.0, max_interval=300.0), busy, 0.0) is None
    unread = [runner.PassResult("gcu", error="409: conflict")]
    assert main._next_wait_cap(_args(interval=5.0, max_interval=300.0), unread, 0.0) is None


# --- issue 46 point 4: converged, at most 10 requests a minute -----------------------------------


def test_a_converged_operator_plans_nothing_where_the_server_drops_empty_fields() -> None:
    """The device plugin's NetworkPolicy is written with ``ingress: []`` (no scraper namespace:
    nothing admitted) and read back without it, as kube-apiserver stores it: that is no
    difference. Before, every pass replaced the policy, so a converged operator never went
    quiet and passed every --interval (174 requests a minute on the control-plane harness)."""
    fake, _ = _converged()
    operator = runner.Operator(fake, clock=lambda: fake.now)
    before = fake.writes()
    for _ in range(3):
        results = operator.run_once()
        assert [r.actions for r in results] == [0], results
        assert all(r.settled for r in results), results
    assert fake.writes() == before
    policy = fake.objects(api.NETWORK_POLICY)
    assert policy and "ingress" not in policy[0]["spec"], policy


def test_a_converged_operator_makes_at_most_ten_requests_a_minute_lease_included() -> None:
    """The operator as the chart runs it (its --interval, and --max-interval and the Lease's
    timings at their defaults), converged, for 10 minutes of its time: every request counted,
    the Lease's renewals too, at most 10 a minute; and a GcuResource edit is still acted on at
    once, not at the next full pass."""
    defaults = main._parser().parse_args(["--interval=5"])
    fake, _ = _converged()
    args = _args(
        interval=defaults.interval * SCALE,
        max_interval=defaults.max_interval * SCALE,
        retry_period=defaults.retry_period * SCALE,
    )
    minute = 60 * SCALE
    with _serving(fake, args):
        time.sleep(minute)  # the first pass, which plans nothing, and its wait begins
        started = time.monotonic()
        time.sleep(10 * minute)
        counted = fake.requests(started)
        passes = fake.passes(started)
        leases = sum(1 for t, _, kind in fake.stamps if t >= started and kind == "Lease")
        watches = sum(1 for t, verb, _ in fake.stamps if t >= started and verb == "watch")
        resource = fake.find(api.GCU_RESOURCE, "gcu")
        assert resource is not None
        resource["spec"]["devicePlugin"] = {"version": "0.2.0"}
        edited = time.monotonic()
        fake.replace(api.GCU_RESOURCE, resource)
        deadline = edited + 1.0
        while not fake.passes(edited) and time.monotonic() < deadline:
            time.sleep(0.01)
        woken = fake.passes(edited)
    per_minute = counted / 10
    assert per_minute <= 10, (per_minute, f"{leases} Lease requests", f"{len(passes)} passes")
    # Full passes no more often than --max-interval (10 minutes: 2, a third on a slow machine
    # whose waits end late and start a little earlier in the window).
    assert len(passes) <= 10 * minute / args.max_interval + 1, passes
    # One watch per target (2 GcuResource groups, the Nodes, the resource's pods) per wait, not
    # a second one for the last second of each wait.
    assert watches <= 4 * (len(passes) + 1), (watches, len(passes))
    assert woken and woken[0] - edited < 20 * SCALE, "the spec edit did not start a pass at once"
