"""Issue 47 point 1: an idle operator (or one whose API server does not answer) is never
restarted by the chart's liveness probe, and a wedged one is.

The operator's real main loop (main.serve: election, passes, the idle wait on its watches) and
its real /healthz server run with the chart's own arguments and probe, unscaled, on a
VirtualClock (tests/gcu_operator/virtual_time.py): simulated minutes pass in about a second,
and a pass takes no simulated time however loaded the machine is. The probe is a real HTTP GET
every ``periodSeconds`` of simulated time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, main, runner
from tests.deploy import helm_render
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours
from tests.gcu_operator.virtual_time import ClockThreading, VirtualClock, VirtualEvent

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
MAIN_THREAD = "operator-main"
# The release's namespace (helm lint renders none; the FakeApi serves the built-in ones).
RELEASE_NAMESPACE = "kube-system"
# Seconds into its first period the kubelet's first probe comes (any phase: not the loop's).
PHASE = 7.0
CALLS = ("get", "list", "create", "replace", "patch", "delete", "replace_status")


class TimedApi(FakeApi):
    """A FakeApi the operator's threads share on a VirtualClock: calls serialised, watches timed
    and waiting on the clock, each pass seen (its list of DaemonSets), and the calls of one
    thread wedgeable: they never return, as a request that hangs for good."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self.lock = threading.RLock()
        self.watch_clock = clock.monotonic
        self.watch_sleep = clock.sleep
        self.watch_poll = 1.0
        self.passes: list[float] = []
        # Every call: (when, the calling thread's name, the kind).
        self.stamps: list[tuple[float, str, str]] = []
        # The name of the thread whose next call hangs, and when (simulated) it hung.
        self.wedge: str | None = None
        self.wedged_at: float | None = None
        self._released = False
        # The threads (by name; "*": all) whose every request takes REQUEST_TIMEOUT and gets
        # no answer, as in an outage.
        self.outage: frozenset[str] = frozenset()
        for name in CALLS:
            setattr(self, name, self._serialised(getattr(self, name)))

    def _serialised(self, method: Any) -> Any:
        def call(kind: api.Kind, *args: Any, **kwargs: Any) -> Any:
            me = threading.current_thread().name
            if me == self.wedge and not self._released:
                self.wedged_at = self.clock.monotonic()
                self.clock.wait(None, lambda: self._released)
            self.stamps.append((self.clock.monotonic(), me, kind.kind))
            self._unanswered()
            if me == MAIN_THREAD and method.__name__ == "list" and kind == api.DAEMONSET:
                self.passes.append(self.clock.monotonic())
            with self.lock:
                return method(kind, *args, **kwargs)

        return call

    def _unanswered(self) -> None:
        if self.outage & {"*", threading.current_thread().name}:
            self.clock.sleep(main.REQUEST_TIMEOUT)
            raise api.ApiError(api.UNREACHABLE, "API server unreachable: timed out")

    def watch(self, kind: api.Kind, timeout: int, labels: Any = None) -> Iterator[Any]:
        self._unanswered()
        return super().watch(kind, timeout, labels)

    def _versions(self, kind: api.Kind, labels: Any) -> dict[Any, str]:
        with self.lock:
            return super()._versions(kind, labels)

    def release(self) -> None:
        """The wedged call returns (the test is over)."""
        self._released = True
        self.clock.notify()


def _chart_operator(
    tmp_path: Any, values: dict[str, Any] | None = None, extra: tuple[str, ...] = ()
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The operator's arguments as the chart passes them with ``values`` (parsed by the
    operator's own parser, ``extra`` after them) and the chart's liveness probe, installed in
    RELEASE_NAMESPACE."""
    operator = {"enabled": True, **(values or {})}
    rendered = helm_render.render(
        str(tmp_path), {"operator": operator, "namespaceOverride": RELEASE_NAMESPACE}
    )
    [container] = [
        c
        for d in helm_render.objects(rendered, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c.get("command") == ["enflame-gcu-operator"]
    ]
    argv = [str(a).replace("$(POD_IP)", "127.0.0.1") for a in container["args"]] + list(extra)
    args = main._parser().parse_args(argv)
    # What the pod's environment gives (POD_NAMESPACE, POD_NAME).
    args.namespace, args.identity = RELEASE_NAMESPACE, "op-1"
    return args, dict(container["livenessProbe"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _probe(port: int, count: int) -> tuple[int, str]:
    """One GET /healthz as the kubelet sends it: the status (0: no answer) and the body. Each
    comes from its own loopback address: /healthz limits each peer to 5 new connections a
    (real) second, and simulated probes come faster than that, the kubelet's never do."""
    source = f"127.0.0.{2 + count % 200}"
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=5, source_address=(source, 0)
    )
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace").strip()
    except OSError as exc:
        return 0, str(exc)
    finally:
        connection.close()


def _converged(clock: VirtualClock, args: argparse.Namespace) -> TimedApi:
    """A cluster the operator (as the chart configures it) has nothing left to do on."""
    fake = TimedApi(clock)
    cluster = FakeCluster(fake, ["node-0", "node-1"])
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(
        fake,
        clock=lambda: fake.now,
        allowed_namespaces=main.allowed_namespaces(args),
        dra_service_account=args.dra_service_account,
        component_namespace=main.component_namespace(args),
        scraper_namespace=args.scraper_namespace,
    )
    converge(operator, cluster)
    return fake


@contextlib.contextmanager
def _serving(
    fake: TimedApi, args: argparse.Namespace, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """main.serve on the fake's VirtualClock, in a thread of its own, until the block ends."""
    clock = fake.clock
    # The idle wait's Events, made inside main, wait on the clock too.
    monkeypatch.setattr(main, "threading", ClockThreading(clock))
    stop = VirtualEvent(clock)
    started = clock.monotonic()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            main.serve(
                args,
                fake,
                stop,
                clock=lambda: fake.now + clock.monotonic() - started,
                monotonic=clock.monotonic,
            )
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=MAIN_THREAD, daemon=True)
    thread.start()
    clock.watch(thread)
    try:
        yield
    finally:
        stop.set()
        fake.release()
        fake.outage = frozenset()
        # The loop notices at its next wake-up, as on real time (within --interval); the renew
        # thread, which serve joins, may be in a request that takes time.
        for _ in range(200):
            clock.step(args.interval)
            thread.join(timeout=0.05)
            if not thread.is_alive():
                break
        clock.close()
    assert not thread.is_alive(), "serve did not end on stop"
    assert not failure, failure


def _poll(fake: TimedApi, port: int, period: float, until: float) -> list[tuple[float, int, str]]:
    """The kubelet's probe every ``period`` simulated seconds until ``until``: (when, status,
    body) of each. The first comes PHASE seconds into the first period: the kubelet's probes
    are not in step with the operator's rounds (whole multiples of its intervals would see a
    short stale spell never)."""
    clock = fake.clock
    probes: list[tuple[float, int, str]] = []
    when = clock.monotonic() + PHASE - period
    while when + period <= until:
        when += period
        clock.advance(when)
        status, body = _probe(port, len(probes))
        probes.append((when, status, body))
    return probes


def _longest_failing_run(probes: list[tuple[float, int, str]]) -> int:
    """The most probes in a row that did not answer 2xx/3xx (the kubelet's success)."""
    worst = run = 0
    for _, status, _ in probes:
        run = 0 if 200 <= status < 400 else run + 1
        worst = max(worst, run)
    return worst


def _idle(
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    values: dict[str, Any] | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[argparse.Namespace, TimedApi, list[tuple[float, int, str]], float]:
    """The chart's operator, converged, polled as the chart's probe polls it for over two
    --max-interval: (its arguments, the fake, the probes, when it started); asserts that no
    probe failed (nor failureThreshold in a row, the kubelet's restart)."""
    args, probe = _chart_operator(tmp_path, values, extra)
    period = float(probe.get("periodSeconds", 10))
    threshold = int(probe.get("failureThreshold", 3))
    args.health_port = _free_port()
    clock = VirtualClock()
    fake = _converged(clock, args)
    started = clock.monotonic()
    with _serving(fake, args, monkeypatch):
        probes = _poll(fake, args.health_port, period, started + 2 * args.max_interval + 80)
    assert len(probes) >= 2 * args.max_interval / period
    failed = [
        (round(when - started), status, body) for when, status, body in probes if status != 200
    ]
    assert _longest_failing_run(probes) < threshold, failed
    assert not failed, f"/healthz failed while idle (passes at {fake.passes}): {failed}"
    return args, fake, probes, started


@needs_helm
@pytest.mark.parametrize(
    "values", [{}, {"interval": 1}, {"interval": 30}], ids=["chart", "interval-1", "interval-30"]
)
def test_an_idle_operator_polled_as_the_chart_polls_it_never_fails(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, values: dict[str, Any]
) -> None:
    """Converged, the loop waits up to --max-interval (300 s) between full passes, longer than
    /healthz's staleness limit (120 s at the chart's values). Polled every periodSeconds for
    over two --max-interval, /healthz answers 200 every time (before the fix it went stale after
    120 s of each wait and the kubelet restarted the leader about every 8 minutes)."""
    args, fake, _, _ = _idle(tmp_path, monkeypatch, values)
    gaps = [b - a for a, b in itertools.pairwise(fake.passes)]
    # It was idle: the loop waited longer than the staleness limit between two full passes.
    assert gaps and max(gaps) > main.health_timeout(args), gaps


@needs_helm
def test_a_lease_renewed_rarely_never_fails_the_probe(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the chart's (it passes no --retry-period), the CLI's: a Lease renewed every 200 s.
    The renew thread comes round that rarely, healthy; the default staleness limit was 120 s
    whatever --retry-period, so /healthz failed 3 times in a row after each renewal."""
    retry = 200.0
    extra = (f"--retry-period={retry:g}", "--lease-duration=600", "--renew-deadline=500")
    args, fake, _, _ = _idle(tmp_path, monkeypatch, extra=extra)
    renewals = [when for when, thread, kind in fake.stamps if thread == "lease"]
    gaps = [b - a for a, b in itertools.pairwise(renewals)]
    assert args.retry_period == retry
    assert gaps and min(g for g in gaps if g > 0) >= retry, gaps


@needs_helm
@pytest.mark.parametrize("threads", ["*", MAIN_THREAD], ids=["outage", "passes-only"])
def test_an_api_outage_is_not_a_hang(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, threads: str
) -> None:
    """Every request (or every request of the passes, the Lease's still answered) times out
    (REQUEST_TIMEOUT, then no answer) for over two --max-interval: the passes fail and back off
    up to MAX_BACKOFF (or the Lease is lost), and the loop and the renew thread still come
    round, so the probe never fails (a restart cannot cure an outage; restarts would end in
    CrashLoopBackOff by the time the API server is back)."""
    args, probe = _chart_operator(tmp_path)
    period = float(probe.get("periodSeconds", 10))
    args.health_port = _free_port()
    clock = VirtualClock()
    fake = _converged(clock, args)
    started = clock.monotonic()
    with _serving(fake, args, monkeypatch):
        clock.advance(started + 3 * period)
        fake.outage = frozenset({threads})
        cut = clock.monotonic()
        probes = _poll(fake, args.health_port, period, started + 2 * args.max_interval + 80)
        ended = clock.monotonic()
    during = [(when, thread) for when, thread, _ in fake.stamps if cut < when <= ended]
    # The renew thread kept trying (every --retry-period + a timeout); with only the passes cut
    # off, passes failed in it. (With everything cut off, a converged leader waits out its
    # --max-interval on the watches and has lost the Lease before its next pass: it makes none.)
    passes = [when for when, thread in during if thread == MAIN_THREAD]
    if threads == MAIN_THREAD:
        assert passes, during
    renewals = [when for when, thread in during if thread == "lease"]
    assert len(renewals) >= (ended - cut) / (args.retry_period + main.REQUEST_TIMEOUT) - 1
    if threads == MAIN_THREAD:  # still leading: the passes backed off up to MAX_BACKOFF
        gaps = [b - a for a, b in itertools.pairwise(passes)]
        assert max(gaps) >= main.MAX_BACKOFF + main.REQUEST_TIMEOUT, gaps
    failed = [(round(w - started), status, body) for w, status, body in probes if status != 200]
    assert not failed, failed


def _wedge_and_poll(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, thread: str
) -> tuple[argparse.Namespace, float, int, float, list[tuple[float, int, str]], float]:
    """The chart's operator, converged and idle; then every call of ``thread`` hangs for good
    from its next one. Polled every periodSeconds until the kubelet would have restarted it
    twice over: (its arguments, period, threshold, when it hung, the probes, when it started)."""
    args, probe = _chart_operator(tmp_path)
    period = float(probe.get("periodSeconds", 10))
    threshold = int(probe.get("failureThreshold", 3))
    args.health_port = _free_port()
    clock = VirtualClock()
    fake = _converged(clock, args)
    started = clock.monotonic()
    with _serving(fake, args, monkeypatch):
        # Idle first: the operator has passed and is waiting on its watches.
        clock.advance(started + 3 * period)
        assert fake.passes, "no pass in the first minute"
        fake.wedge = thread
        probes = _poll(fake, args.health_port, period, started + 2 * args.max_interval + 80)
        wedged_at = fake.wedged_at
    assert wedged_at is not None, f"{thread} made no call after it was wedged"
    return args, period, threshold, wedged_at, probes, started


@needs_helm
@pytest.mark.parametrize(
    ("thread", "named"),
    [(MAIN_THREAD, "the main loop"), ("lease", main.RENEWER)],
    ids=["pass", "renewal"],
)
def test_a_wedged_operator_fails_the_charts_probe_within_the_limit_and_its_window(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, thread: str, named: str
) -> None:
    """A pass (or a Lease renewal) that never returns is what a restart cures: /healthz answers
    503 naming it once it has not come round for --health-timeout, and keeps failing, so the
    kubelet's failureThreshold-th failure in a row comes within limit + threshold x period of
    the hang (the idle wait's beats must not hide it). Before it hung, every probe passed."""
    args, period, threshold, wedged_at, probes, started = _wedge_and_poll(
        tmp_path, monkeypatch, thread
    )
    limit = main.health_timeout(args)
    before = [p for p in probes if p[0] <= wedged_at]
    after = [p for p in probes if p[0] > wedged_at]
    assert all(status == 200 for _, status, _ in before), before
    failing = [(when, status, body) for when, status, body in after if status != 200]
    assert failing, f"/healthz never failed after {thread} hung at {wedged_at - started:.0f} s"
    first = failing[0][0]
    # Not before the limit (a pass may take that long; the renew thread last came round up to
    # --retry-period before its call hung), and at the first probe after it.
    assert limit - args.retry_period < first - wedged_at <= limit + period, (first, wedged_at)
    # From then on every probe fails: the kubelet restarts it at the threshold-th.
    assert all(status == 503 for when, status, _ in after if when >= first), after
    restart = first + (threshold - 1) * period
    assert restart - wedged_at <= limit + threshold * period
    assert _longest_failing_run(probes) >= threshold
    assert all(f"{named} has not come round" in body for _, _, body in failing), failing
