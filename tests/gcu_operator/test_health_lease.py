"""Issue 47 points 12 and 13: /healthz on the project's bounded server, the Lease timed on a
monotonic clock, and a renew thread that survives any error (or fails /healthz when it ends)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, leader, main
from tests.gcu_operator.fake_api import WRITES, FakeApi, FakeCluster
from tests.gcu_operator.helpers import ours


def _get(port: int, host: str = "127.0.0.1") -> tuple[int, str]:
    connection = http.client.HTTPConnection(host, port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


# --- point 12: a bounded /healthz ---------------------------------------------------------------


def test_many_idle_connections_neither_exhaust_healthz_nor_cost_a_thread_each() -> None:
    """Anyone who reaches the port may open connections and send nothing: the old
    thread-per-connection server grew a thread (and its stack) per connection until it stopped
    answering; the bounded one keeps its one thread and still answers the probe."""
    health = main.Health(stale_after=60)
    server = main.serve_health(health, 0, host="127.0.0.1")
    held: list[socket.socket] = []
    try:
        assert _get(server.port)[0] == 200
        threads = threading.active_count()
        for _ in range(200):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(0.5)
        assert threading.active_count() <= threads + 1, threading.active_count() - threads
        assert server.open_connections <= main.HEALTH_LIMITS.connections
        assert _get(server.port) == (200, "ok\n")  # the probe still gets through
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_healthz_names_what_is_stale_and_refuses_other_paths() -> None:
    now = {"t": 0.0}
    health = main.Health(stale_after=10, clock=lambda: now["t"])
    server = main.serve_health(health, 0, host="127.0.0.1")
    try:
        health.beat(main.RENEWER)
        now["t"] = 11.0
        health.beat(main.RENEWER)
        status, text = _get(server.port)
        assert status == 503 and "the main loop has not come round for 11 s" in text
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("GET", "/metrics")
        assert connection.getresponse().status == 404
        connection.close()
    finally:
        server.stop()


# --- point 13: the renew thread -----------------------------------------------------------------


def test_healthz_fails_once_the_renew_thread_has_ended() -> None:
    health = main.Health(stale_after=60)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    health.watch_thread(main.RENEWER, thread)
    assert health.problem() == "the Lease's renew thread has ended"
    assert not health.healthy()


def _args(**over: Any) -> argparse.Namespace:
    base = {
        "namespace": "kube-system",
        "identity": "op-1",
        "interval": 0.02,
        "max_interval": 0.5,
        "lease_duration": 15,
        "renew_deadline": 10.0,
        "retry_period": 0.02,
    }
    base.update(over)
    return argparse.Namespace(**base)


@contextlib.contextmanager
def _serving(
    fake: FakeApi, args: argparse.Namespace, clock: Any = time.time
) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=main.serve, args=(args, fake, stop, clock), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def _wait(predicate: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


class Locked(FakeApi):
    """Calls serialised (the Lease's thread and the passes share the fake)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.by_thread: list[tuple[float, str, str, str]] = []
        for name in ("get", "list", "create", "replace", "patch", "delete", "replace_status"):
            method = getattr(self, name)

            def call(*a: Any, _m: Any = method, **k: Any) -> Any:
                with self.lock:
                    return _m(*a, **k)

            setattr(self, name, call)

    def _call(self, verb: str, kind: api.Kind) -> None:
        self.by_thread.append((time.monotonic(), threading.current_thread().name, verb, kind.kind))
        super()._call(verb, kind)

    def operator_writes(self, since: float) -> list[tuple[str, str]]:
        """Writes the operator's threads made (not the test's stand-in kubelets) since then."""
        return [
            (verb, kind)
            for t, thread, verb, kind in self.by_thread
            if t >= since and thread != "MainThread" and verb in WRITES and kind != "Lease"
        ]


def _lease(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api.LEASE.api_version,
        "kind": "Lease",
        "metadata": {"name": leader.LEASE_NAME, "namespace": "kube-system"},
        "spec": spec,
    }


def test_a_lease_this_code_cannot_read_does_not_end_the_renewals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Lease whose leaseDurationSeconds is not a number (written by hand or by another
    program) raised ValueError in the renew thread, which ended silently: the replica never led
    again and /healthz stayed 200. The error is now logged once and the renewals go on, so once
    the Lease is put right the replica leads."""
    fake = Locked()
    FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours())
    fake.put(api.LEASE, _lease({"holderIdentity": "other", "leaseDurationSeconds": "forty"}))
    caplog.set_level(logging.INFO, logger=main.__name__)
    with _serving(fake, _args()):
        time.sleep(0.5)
        assert not fake.objects(api.DAEMONSET)  # not leading: nothing written
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in caplog.records]
        assert "taking or renewing the Lease failed" in errors[0].getMessage()
        assert "forty" in errors[0].getMessage()
        assert errors[0].exc_info is not None  # the traceback, to find the cause
        with fake.lock:
            fake.remove(fake._key(api.LEASE, leader.LEASE_NAME, "kube-system"))
        assert _wait(lambda: bool(fake.objects(api.DAEMONSET))), "never led after the fix"


def test_a_wall_clock_stepped_back_does_not_keep_a_leader_writing_past_its_deadline() -> None:
    """Every Lease write fails, and the wall clock is stepped back an hour just after the
    leader's last renewal: timed on the wall clock, that renewal lay an hour in the future, so
    the leader kept writing for an hour while a standby took over after the Lease's duration.
    Timed on the monotonic clock it stops within the renew deadline."""
    fake = Locked()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours())
    jump = {"by": 0.0}
    lease_down = threading.Event()
    replace = fake.replace
    create = fake.create

    def failing(writer: Any) -> Any:
        def call(kind: api.Kind, obj: dict[str, Any]) -> Any:
            if kind == api.LEASE and lease_down.is_set():
                raise api.ApiError(500, "etcdserver: request timed out")
            return writer(kind, obj)

        return call

    fake.replace = failing(replace)  # type: ignore[method-assign]
    fake.create = failing(create)  # type: ignore[method-assign]
    args = _args(renew_deadline=0.5, lease_duration=1, max_interval=0.1)
    with _serving(fake, args, clock=lambda: time.time() - jump["by"]):
        assert _wait(lambda: bool(fake.objects(api.DAEMONSET)))
        lease_down.set()  # the last renewal has been made
        time.sleep(0.05)
        jump["by"] = 3600.0  # and then NTP steps the clock back
        time.sleep(args.renew_deadline + 0.3)
        since = time.monotonic()
        # Work to do: the nodes' pods come and the plan wants to write.
        for _ in range(5):
            with fake.lock:
                cluster.step()
            time.sleep(0.1)
        late = fake.operator_writes(since)
    assert fake.operator_writes(0.0), "the operator never wrote"
    assert late == [], late


class Closable(FakeApi):
    def close(self) -> None:
        """As LightkubeApi.close."""


def test_a_health_port_in_use_is_named_not_a_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounded server names the address and the cause; main() logs it and exits 2."""
    monkeypatch.setattr(main, "_cluster", lambda _kubeconfig: Closable())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        code = main.main(["--health-port", str(port), "--health-address", "127.0.0.1"])
    assert code == 2
    assert time.monotonic() - started < 5
    assert any(f"127.0.0.1:{port}" in r.getMessage() for r in caplog.records), caplog.text
