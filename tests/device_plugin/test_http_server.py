"""The metrics/probe port is reachable by any pod (issue 22 item 2): half-sent requests must
not cost a thread each, must be dropped after a deadline, must not lock the kubelet's probe
out, and a port in use is one clear line, not a traceback. Real sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enflame_gcu import devices, health, holders
from enflame_gcu.device_plugin import http_server, metrics
from enflame_gcu.errors import ConfigError
from tests.conftest import MakeNode

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def exported() -> metrics.Metrics:
    exported = metrics.Metrics()
    exported.beat()
    return exported


@pytest.fixture
def server(exported: metrics.Metrics) -> Iterator[http_server.MetricsServer]:
    served = http_server.start(exported, 0, "127.0.0.1")
    yield served
    served.stop()


def _request(port: int, raw: bytes, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), 10, (source, 0)) as client:
        client.sendall(raw)
        chunks = []
        while chunk := client.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _half_sent(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        with contextlib.suppress(OSError):  # the server may have closed it at once
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        opened.append(client)
    return opened


def test_probes_and_metrics_answer_with_status_and_length(
    server: http_server.MetricsServer,
) -> None:
    port = server.address[1]
    healthz = _request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert healthz.startswith(b"HTTP/1.1 200 OK\r\n") and healthz.endswith(b"\r\n\r\nok\n")
    readyz = _request(port, b"GET /readyz HTTP/1.0\r\n\r\n")
    assert readyz.startswith(b"HTTP/1.1 503 ") and b"not serving yet" in readyz
    scraped = _request(port, b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n\r\n")
    head, _, body = scraped.partition(b"\r\n\r\n")
    assert b"enflame_gcu_build_info" in body
    assert f"Content-Length: {len(body)}".encode() in head
    assert _request(port, b"HEAD /healthz HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n")
    assert _request(port, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert _request(port, b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert _request(port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_half_sent_requests_cost_no_thread_and_do_not_lock_out_the_probe(
    server: http_server.MetricsServer,
) -> None:
    """Before: one thread per connection, kept for ever (3,000 connections, 3,009 threads)."""
    port = server.address[1]
    threads = threading.active_count()
    opened = _half_sent(port, 300)
    try:
        time.sleep(0.5)
        assert threading.active_count() <= threads + 1
        # One peer holds at most its share, past its rate the rest is closed at accept; the
        # others (the kubelet: another address) get in.
        assert server.open_connections <= http_server.Limits().per_client
        assert server.refused > 0
        answer = _request(port, b"GET /healthz HTTP/1.1\r\n\r\n", source="127.0.0.2")
        assert answer.startswith(b"HTTP/1.1 200 OK")
        # A second later the flooding peer's own fresh request gets in again: its rate allows
        # one more, and its oldest idle connection makes room.
        time.sleep(1.0)
        answer = _request(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK")
    finally:
        for client in opened:
            client.close()


def test_a_request_head_must_arrive_in_time_however_slowly_it_drips(
    exported: metrics.Metrics,
) -> None:
    limits = http_server.Limits(head_timeout=1.0)
    served = http_server.start(exported, 0, "127.0.0.1", limits)
    try:
        with socket.create_connection(("127.0.0.1", served.address[1]), timeout=10) as client:
            started = time.monotonic()
            closed = False
            for _ in range(40):  # a byte every 0.1 s: each read is quick, the whole is not
                try:
                    client.sendall(b"X")
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            if not closed:
                client.settimeout(5)
                closed = client.recv(1) == b""
            assert closed and time.monotonic() - started < 3.5
    finally:
        served.stop()


def test_an_oversized_request_head_is_refused_with_431(
    server: http_server.MetricsServer,
) -> None:
    big = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert _request(server.address[1], big).startswith(b"HTTP/1.1 431 ")


def test_a_port_in_use_is_a_config_error_naming_it(exported: metrics.Metrics) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}: .*already listens"):
            http_server.start(exported, port, "127.0.0.1")


def test_the_plugin_exits_with_one_line_when_its_metrics_port_is_taken(tmp_path: Path) -> None:
    """Before: an OSError traceback out of asyncio.run."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "enflame_gcu.device_plugin.main",
                f"--host-root={tmp_path}",
                f"--metrics-port={port}",
                "--metrics-bind-address=127.0.0.1",
                f"--plugin-dir={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"cannot serve the metrics port on 127.0.0.1:{port}" in result.stderr


class _Blocking:
    """A collector whose families take until released (a scrape of a very large node)."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def describe(self) -> Iterator[object]:
        return iter(())  # registering it must not collect

    def collect(self) -> Iterator[object]:
        self.inside.set()
        self.release.wait(30)
        return iter(())


def test_a_scrape_being_built_does_not_hold_up_the_probe(exported: metrics.Metrics) -> None:
    """Before: the exposition was built on the server's loop, so /healthz waited for it (about
    1 s on a 64-card node with telemetry, and half the kubelet's probes failed)."""
    blocking = _Blocking()
    exported.registry.register(blocking)  # type: ignore[arg-type]
    served = http_server.start(exported, 0, "127.0.0.1")
    port = served.address[1]
    scraped: list[bytes] = []
    scraper = threading.Thread(
        target=lambda: scraped.append(_request(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
    )
    try:
        scraper.start()
        assert blocking.inside.wait(10)
        probe = _request(port, b"GET /healthz HTTP/1.1\r\n\r\n", "127.0.0.2")
        assert probe.startswith(b"HTTP/1.1 200 OK\r\n")
        assert not scraped  # the scrape is still being built beside it
    finally:
        blocking.release.set()
        scraper.join(30)
        served.stop()
    assert scraped and scraped[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"enflame_gcu_build_info" in scraped[0]


def test_the_card_families_are_encoded_once_per_change(
    exported: metrics.Metrics, server: http_server.MetricsServer, make_node: MakeNode
) -> None:
    """Ten scrapes of an unchanged node build the card families once, not ten times; a new
    holder builds them again, a PodResources read with the same content does not."""
    root = make_node("vendor-8card")
    inventory = devices.discover(root)
    exported.retain(["enflame.com/gcu"])
    exported.set_node(inventory, health.check(root, inventory.cards))
    exported.set_holdings([])
    built = []
    collect = exported.cards.collect

    def counted() -> Iterator[object]:
        built.append(1)
        return collect()

    exported.cards.collect = counted  # type: ignore[method-assign,assignment]
    port = server.address[1]

    def scrape() -> bytes:
        answer = _request(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
        return answer

    first = [scrape() for _ in range(10)]
    assert len(built) == 1  # was 10: every scrape built and encoded every family
    assert b'enflame_gcu_card_healthy{card="gcu0"' in first[-1]
    assert b"enflame_gcu_cards_allocated 0.0" in first[-1]
    held = holders.Holding("ml", "p", "main", "enflame.com/gcu", ("gcu3",))
    exported.set_holdings([held])
    changed = scrape()
    assert len(built) == 2
    assert b"enflame_gcu_cards_allocated 1.0" in changed
    exported.set_holdings([held])  # the next read: the same holders
    scrape()
    assert len(built) == 2
    # OpenMetrics: the cached families and the rest in one document with one EOF at its end.
    open_metrics = _request(
        port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n"
    )
    body = open_metrics.partition(b"\r\n\r\n")[2]
    assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
    assert b"enflame_gcu_cards_allocated 1.0" in body and b"enflame_gcu_build_info" in body
