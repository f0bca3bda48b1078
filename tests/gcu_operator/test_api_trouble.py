"""API trouble never ends the operator: a refused connection or a server that stops answering
is an ApiError (not the HTTP client's own exception), the main loop retries with backoff and
says so once, and the Lease is renewed on its own timer with a renew deadline."""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, kube, leader, main, runner
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}


def _client(url: str, timeout: float) -> kube.LightkubeApi:
    import httpx2
    import lightkube
    from lightkube.config.kubeconfig import KubeConfig

    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    return kube.LightkubeApi(lightkube.Client(config, timeout=httpx2.Timeout(timeout)))


def _calls(cluster: kube.LightkubeApi) -> dict[str, Any]:
    lease = {
        "apiVersion": api.LEASE.api_version,
        "kind": "Lease",
        "metadata": {"name": "x", "namespace": "kube-system", "resourceVersion": "1"},
        "spec": {},
    }
    return {
        "get": lambda: cluster.get(api.NODE, "n"),
        "list": lambda: cluster.list(api.POD),
        "create": lambda: cluster.create(api.NODE, NODE),
        "replace": lambda: cluster.replace(api.LEASE, lease),
        "patch": lambda: cluster.patch(api.NODE, "n", {"metadata": {"labels": {"a": "b"}}}),
        "delete": lambda: cluster.delete(api.NODE, "n"),
        "evict": lambda: cluster.evict("default", "p"),
    }


@contextlib.contextmanager
def _closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]  # bound, never listening: connections are refused


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """Accepts connections and never answers (an API server hung mid-restart)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        held: list[socket.socket] = []
        done = threading.Event()

        def accept() -> None:
            sock.settimeout(0.1)
            while not done.is_set():
                with contextlib.suppress(OSError):
                    held.append(sock.accept()[0])

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield sock.getsockname()[1]
        finally:
            done.set()
            thread.join()
            for conn in held:
                conn.close()


def test_refused_connection_is_an_api_error_for_every_call() -> None:
    with _closed_port() as port:
        cluster = _client(f"http://127.0.0.1:{port}", timeout=2.0)
        try:
            for verb, call in _calls(cluster).items():
                with pytest.raises(api.ApiError) as caught:
                    call()
                assert caught.value.status == api.UNREACHABLE, verb
                assert "unreachable" in caught.value.message, verb
        finally:
            cluster.close()


def test_a_server_that_never_answers_times_out_as_an_api_error() -> None:
    with _silent_server() as port:
        cluster = _client(f"http://127.0.0.1:{port}", timeout=0.3)
        try:
            for verb in ("get", "list", "patch"):
                with pytest.raises(api.ApiError) as caught:
                    _calls(cluster)[verb]()
                assert caught.value.status == api.UNREACHABLE, verb
        finally:
            cluster.close()


class Outage(FakeApi):
    """A FakeApi whose every call fails while ``down`` is set (the API server restarting)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.refused = 0

    def _call(self, verb: str, kind: api.Kind) -> None:
        if self.down.is_set():
            self.refused += 1
            raise api.ApiError(api.UNREACHABLE, "API server unreachable: connection refused")
        super()._call(verb, kind)


def _locked(fake: Outage) -> None:
    """Serialise the fake's calls (the Lease thread and the pass thread share it)."""
    for name in ("get", "list", "create", "replace", "patch", "delete", "replace_status"):
        method = getattr(fake, name)

        def call(*a: Any, _m: Any = method, **k: Any) -> Any:
            with fake.lock:
                return _m(*a, **k)

        setattr(fake, name, call)


def _args(**over: Any) -> argparse.Namespace:
    base = {
        "namespace": "kube-system",
        "identity": "op-1",
        "interval": 0.02,
        "lease_duration": 15,
        "renew_deadline": 10.0,
        "retry_period": 0.02,
    }
    base.update(over)
    return argparse.Namespace(**base)


def _wait(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_serve_rides_out_an_api_outage_from_the_first_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server is down when the operator starts (the first Lease call fails), comes back,
    goes down mid-run and comes back: the loop never ends, logs each outage once, and
    reconciles once the server answers."""
    fake = Outage()
    _locked(fake)
    FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours())
    fake.down.set()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            main.serve(_args(), fake, stop)
        except BaseException as exc:
            failure.append(exc)

    caplog.set_level(logging.INFO, logger=main.__name__)
    thread = threading.Thread(target=run)
    thread.start()
    try:
        _wait(lambda: fake.refused > 20)
        fake.down.clear()
        _wait(lambda: bool(fake.objects(api.DAEMONSET)))
        fake.down.set()
        before = fake.refused
        _wait(lambda: fake.refused > before + 20)
        assert thread.is_alive() and not failure
        fake.down.clear()
        _wait(lambda: any("works again" in r.getMessage() for r in caplog.records[-50:]))
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert not failure, failure
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("enflame_gcu")
    ]
    # Two outages, each said once per loop (the Lease's and the passes'), not once per retry.
    assert 2 <= len(warnings) <= 4, warnings
    assert all("said once" in w for w in warnings), warnings


def test_backoff_doubles_and_is_capped() -> None:
    trouble = main.Trouble("x")
    assert trouble.delay(5.0) == 5.0
    delays = []
    for _ in range(8):
        trouble.failed(api.ApiError(api.UNREACHABLE, "down"))
        delays.append(trouble.delay(5.0))
    assert delays[:3] == [10.0, 20.0, 40.0]
    assert max(delays) == main.MAX_BACKOFF
    trouble.ok()
    assert trouble.delay(5.0) == 5.0


# --- point 11: leader election with a renew deadline ----------------------------------------


def test_a_leader_that_has_not_renewed_within_the_deadline_stops_writing() -> None:
    fake = FakeApi()
    fake.put(api.GCU_RESOURCE, ours())
    elector = leader.LeaderElector(fake, "kube-system", "a", duration=15, renew_deadline=10)
    t0 = fake.now
    assert elector.try_acquire(t0)
    assert elector.leading(t0 + 9)
    assert not elector.leading(t0 + 11)
    now = {"t": t0 + 11}
    operator = runner.Operator(fake, may_write=lambda: elector.leading(now["t"]))
    before = fake.writes()
    with pytest.raises(runner.NotLeading):
        operator.run_once()
    assert fake.writes() == before


def test_expiry_is_measured_from_when_the_record_was_seen_to_change() -> None:
    """The holder's clock is an hour behind: its renewTime looks ancient here, yet it renews."""
    fake = FakeApi()
    skewed = leader.LeaderElector(fake, "kube-system", "a", duration=15)
    standby = leader.LeaderElector(fake, "kube-system", "b", duration=15)
    now = fake.now
    assert skewed.try_acquire(now - 3600)
    assert not standby.try_acquire(now)
    for t in range(5, 60, 5):
        assert skewed.try_acquire(now - 3600 + t)  # renews with its own clock
        assert not standby.try_acquire(now + t), t
    # The holder stops renewing: the standby takes over one Lease after it last saw a change.
    assert not standby.try_acquire(now + 55 + 14)
    assert standby.try_acquire(now + 55 + 16)


def test_the_lease_is_renewed_while_a_pass_outlasts_it() -> None:
    """A pass that takes longer than the Lease: the standby never sees it expire."""
    fake = Outage()
    _locked(fake)
    fake.put(api.GCU_RESOURCE, ours())
    slow = threading.Event()
    original_list = fake.list

    def list_slowly(kind: api.Kind, *a: Any, **k: Any) -> Any:
        if kind == api.NODE and not slow.is_set():
            slow.set()
            time.sleep(3.5)
        return original_list(kind, *a, **k)

    fake.list = list_slowly  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(
        target=main.serve,
        args=(_args(lease_duration=2, renew_deadline=1.5, retry_period=0.1), fake, stop),
    )
    thread.start()
    standby = leader.LeaderElector(fake, "kube-system", "op-2", duration=2)
    try:
        _wait(slow.is_set)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert not standby.try_acquire(time.time())
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


# --- point 4: the liveness endpoint ------------------------------------------------------------


def test_healthz_answers_200_while_the_loop_comes_round_and_503_when_it_hangs() -> None:
    import urllib.error
    import urllib.request

    now = {"t": 0.0}
    health = main.Health(stale_after=60, clock=lambda: now["t"])
    server = main.serve_health(health, 0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
        now["t"] = 61.0
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url, timeout=5)
        assert caught.value.code == 503
        caught.value.close()
        health.beat()
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
    finally:
        server.stop()


def test_two_replicas_on_one_network_serve_healthz_on_their_own_pod_ip() -> None:
    """With hostNetwork, replicas share a network namespace (the cluster tier's nodes share one);
    each binds its pod IP (--health-address), so both get the same port."""
    import urllib.request

    first = main._parser().parse_args(["--health-port=1", "--health-address=127.0.0.2"])
    assert first.health_address == "127.0.0.2"
    health = main.Health(stale_after=60)
    one = main.serve_health(health, 0, host=first.health_address)
    port = one.port
    try:
        two = main.serve_health(health, port, host="127.0.0.3")
        try:
            for host in ("127.0.0.2", "127.0.0.3"):
                with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as answer:
                    assert answer.status == 200
        finally:
            two.stop()
    finally:
        one.stop()


# --- point 13: fewer API calls once converged -------------------------------------------------


def test_idle_delay_doubles_once_converged_up_to_the_maximum() -> None:
    assert main.idle_delay(5, 30, 0) == 5
    assert [main.idle_delay(5, 30, n) for n in range(1, 5)] == [10, 20, 30, 30]


def test_a_changed_resource_ends_the_idle_wait_at_once() -> None:
    fake = FakeApi()
    fake.put(api.GCU_RESOURCE, ours())
    stop = threading.Event()
    args = _args(interval=0.05, max_interval=30.0)
    done = threading.Event()

    def wait() -> None:
        main._idle_wait(fake, stop, args, idle=5, clock=time.monotonic)
        done.set()

    thread = threading.Thread(target=wait)
    started = time.monotonic()
    thread.start()
    try:
        time.sleep(0.3)
        assert not done.is_set()  # converged: no full pass for up to 30 s
        resource = fake.find(api.GCU_RESOURCE, "gcu")
        assert resource is not None
        resource["spec"]["devicePlugin"] = {"version": "0.2.0"}
        fake.replace(api.GCU_RESOURCE, resource)
        assert done.wait(5), "the edit did not end the wait"
    finally:
        stop.set()
        thread.join(timeout=5)
    assert time.monotonic() - started < 5
    # While idle, only the GcuResources were read (one list per group per look).
    assert {kind for _, kind in fake.calls} == {"GcuResource"}


def _waiting(fake: FakeApi, args: argparse.Namespace, **kwargs: Any) -> tuple[Any, Any]:
    """Run one idle wait in a thread: (its stop event, its done event)."""
    stop, done = threading.Event(), threading.Event()

    def wait() -> None:
        main._idle_wait(fake, stop, args, idle=10, clock=time.monotonic, **kwargs)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop, done


def test_a_converged_operator_waits_on_watches_not_a_list_every_interval() -> None:
    # Issue 38: a list of the GcuResources every --interval was 24 requests a minute per
    # operator at the defaults; the idle wait now holds one watch per group for its length.
    fake = FakeApi()
    fake.put(api.GCU_RESOURCE, ours())
    args = _args(interval=0.02, max_interval=1.0)
    started = time.monotonic()
    stop, done = _waiting(fake, args)
    try:
        assert done.wait(10)
    finally:
        stop.set()
    assert time.monotonic() - started >= 0.9  # nothing changed: the whole wait
    looks = [call for call in fake.calls if call[0] != "watch"]
    watches = [call for call in fake.calls if call[0] == "watch"]
    assert len(looks) <= 2, fake.calls  # one list per group to know what is there
    assert len(watches) == len(runner.GROUPS), fake.calls


def _converged() -> tuple[FakeApi, FakeCluster, runner.Operator]:
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a", "node-b"])
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    converge(operator, cluster)
    operator.run_once()
    return fake, cluster, operator


def test_a_relabelled_node_ends_the_idle_wait_but_its_annotations_do_not() -> None:
    fake, _, operator = _converged()
    fake.calls.clear()
    args = _args(interval=0.02, max_interval=5.0)
    stop, done = _waiting(fake, args, operator=operator)
    try:
        time.sleep(0.3)
        fake.patch(api.NODE, "node-a", {"metadata": {"annotations": {"x/state": "1"}}})
        assert not done.wait(0.5)  # the device plugins' node state is not a change
        fake.patch(api.NODE, "node-b", {"metadata": {"labels": {"enflame.com/gcu.mode": "dra"}}})
        assert done.wait(5), "the relabelled node did not end the wait"
    finally:
        stop.set()
    # No GcuResource list: the last pass's reading is the baseline, the watches do the rest.
    assert {verb for verb, _ in fake.calls} <= {"watch", "patch"}, fake.calls


def test_a_new_node_ends_the_idle_wait_at_once() -> None:
    fake, _, operator = _converged()
    args = _args(interval=0.02, max_interval=5.0)
    stop, done = _waiting(fake, args, operator=operator)
    try:
        time.sleep(0.3)
        assert not done.is_set()
        fake.create(api.NODE, {"metadata": {"name": "node-c"}})
        assert done.wait(5), "the new node did not end the wait"
    finally:
        stop.set()


def test_a_pass_waiting_for_pods_is_not_settled() -> None:
    """A rollout waiting on a pod does nothing in some passes, yet must not back off."""
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"], ready_after=3)
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(fake, clock=lambda: fake.now)
    seen = []
    for _ in range(30):
        result = operator.run_once()[0]
        seen.append((result.actions, result.settled))
        cluster.step()
    assert any(a == 0 and not settled for a, settled in seen)  # waiting, not settled
    assert seen[-1] == (0, True)  # Running and quiet: settled


def test_a_pass_lists_every_node_once_with_one_resource_and_afresh_for_a_second() -> None:
    # Issue 38's review: a full pass listed every Node twice (run_once, then the resource's
    # observe), the heaviest list of a pass on a cluster of thousands of nodes.
    fake, _, operator = _converged()
    fake.calls.clear()
    operator.run_once()
    assert fake.calls.count(("list", "Node")) == 1, fake.calls
    # A second resource lists again: it must see what the first one's pass wrote to Nodes.
    second = ours()
    second["metadata"] = {**second["metadata"], "name": "second", "uid": "uid-second"}
    fake.put(api.GCU_RESOURCE, second)
    fake.calls.clear()
    operator.run_once()
    assert fake.calls.count(("list", "Node")) == 2, fake.calls
    fake.calls.clear()
    stored = fake.get(api.GCU_RESOURCE, "second")
    assert stored is not None
    operator.reconcile(api.GCU_RESOURCE, stored)  # alone: its own list, nothing carried over
    assert fake.calls.count(("list", "Node")) == 1, fake.calls
