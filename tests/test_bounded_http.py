"""The one bounded HTTP server behind the plugin's metrics port, the DRA driver's HTTP port and
the scheduler extender: flat threads under idle floods, total request deadlines, size limits,
room for the real caller, and HTTPS with client certificates. Loopback only."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from enflame_gcu import bounded_http
from enflame_gcu.dra_plugin import observability
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, server

pytestmark = pytest.mark.xdist_group("bounded_http")  # the pki fixture runs openssl once
PRIORITIZE = json.dumps(
    {
        "Pod": {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": []}},
        "NodeNames": ["a"],
    }
).encode()


def idle(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(client)
    return held


def closed_within(client: socket.socket, seconds: float) -> bool:
    client.settimeout(seconds)
    try:
        while client.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


@pytest.fixture
def driver_port() -> Iterator[bounded_http.BoundedServer]:
    served = observability.start(observability.DriverMetrics(), "127.0.0.1:0")
    yield served
    served.stop()


def test_the_drivers_port_holds_idle_connections_without_a_thread_each(
    driver_port: bounded_http.BoundedServer,
) -> None:
    before = threading.active_count()
    held = idle(driver_port.port, 300)
    try:
        time.sleep(0.5)
        assert threading.active_count() == before  # was one thread per connection
        assert driver_port.open_connections <= bounded_http.Limits().per_client
        status, _ = _get(driver_port.port, "/healthz")
        assert status == 200
    finally:
        for client in held:
            client.close()


def test_the_drivers_port_refuses_a_large_head_without_reading_it(
    driver_port: bounded_http.BoundedServer,
) -> None:
    client = socket.create_connection(("127.0.0.1", driver_port.port), timeout=5)
    try:
        client.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 64 * 1024)
        answer = client.recv(200)
        assert answer.startswith(b"HTTP/1.1 431 ")
    finally:
        client.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def extender(**options: object) -> server.ExtenderServer:
    cache = extender_cache.ClusterCache()
    served = server.ExtenderServer(("127.0.0.1", 0), decisions.Decisions(cache), **options)  # type: ignore[arg-type]
    served.start()
    return served


def test_idle_connections_do_not_lock_the_scheduler_out() -> None:
    served = extender()
    held = idle(served.port, 100)  # more than the server holds: the oldest idle make room
    try:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        connection.request("POST", "/prioritize", PRIORITIZE)
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        for client in held:
            client.close()
        served.stop()


def test_a_body_that_never_arrives_is_dropped_at_the_request_deadline() -> None:
    served = extender(request_timeout=0.5)
    client = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    try:
        client.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}")
        started = time.monotonic()
        assert closed_within(client, 5)
        assert time.monotonic() - started < 3  # was 30 s per recv, per worker
    finally:
        client.close()
        served.stop()


def test_a_head_dripped_a_byte_at_a_time_gets_no_more_time() -> None:
    served = extender(request_timeout=0.6)
    client = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    started = time.monotonic()
    try:
        for byte in b"POST /filter HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaa":
            try:
                client.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
        assert closed_within(client, 5)
        assert time.monotonic() - started < 4
    finally:
        client.close()
        served.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl."""
    where = str(tmp_path_factory.mktemp("pki"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=test-ca")  # fmt: skip
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        with open(os.path.join(where, f"{name}.ext"), "w", encoding="utf-8") as ext:
            ext.write("subjectAltName=IP:127.0.0.1\n")
        sign = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"]
        run(*sign, "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
            f"{name}.ext")  # fmt: skip
    return {name: os.path.join(where, name) for name in os.listdir(where)}


def test_https_answers_only_clients_with_a_certificate_of_the_ca(pki: dict[str, str]) -> None:
    context = bounded_http.tls_context(pki["server.crt"], pki["server.key"], pki["ca.crt"])
    served = extender(ssl_context=context)
    try:
        client_context = ssl.create_default_context(cafile=pki["ca.crt"])
        client_context.load_cert_chain(pki["client.crt"], pki["client.key"])
        connection = http.client.HTTPSConnection(
            "127.0.0.1", served.port, timeout=5, context=client_context
        )
        connection.request("POST", "/prioritize", PRIORITIZE)
        assert connection.getresponse().status == 200
        connection.close()
        anonymous = ssl.create_default_context(cafile=pki["ca.crt"])
        connection = http.client.HTTPSConnection(
            "127.0.0.1", served.port, timeout=5, context=anonymous
        )
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            connection.request("POST", "/prioritize", PRIORITIZE)
            connection.getresponse()
        connection.close()
    finally:
        served.stop()


def test_a_bad_tls_file_is_a_config_error_naming_it(tmp_path: object) -> None:
    from enflame_gcu.errors import ConfigError

    with pytest.raises(ConfigError, match=r"missing\.crt"):
        bounded_http.tls_context("missing.crt", "missing.key")


def _raw(port: int, data: bytes) -> bytes:
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        client.sendall(data)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer
    finally:
        client.close()


@pytest.mark.parametrize("length", ["²", "١٢", "1_0", "+5", " "])
def test_a_malformed_content_length_is_a_400_and_one_log_line(
    length: str, caplog: pytest.LogCaptureFixture
) -> None:
    def answer(request: bounded_http.Request) -> bounded_http.Response:
        return bounded_http.Response(200, request.body)

    limits = bounded_http.Limits(body_bytes=64, methods=("GET", "POST"))
    served = bounded_http.serve(answer, "127.0.0.1", 0, limits)
    caplog.set_level("DEBUG", logger="enflame_gcu.bounded_http")
    try:
        head = f"POST /x HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
        reply = _raw(served.port, head + b"ab")
        assert reply.startswith(b"HTTP/1.1 400 "), reply
        assert b"malformed Content-Length" in reply
        # The server goes on: a well-formed request after it is answered.
        assert _raw(served.port, b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nok").endswith(b"ok")
    finally:
        served.stop()
    records = [r for r in caplog.records if r.name == "enflame_gcu.bounded_http"]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].exc_info is None  # no traceback
    assert "malformed Content-Length" in records[0].getMessage()


def test_an_offloaded_answer_being_built_does_not_hold_up_the_others() -> None:
    """A scrape that takes long to build (here: until released) is built off the loop, so
    the probe beside it is answered meanwhile; on the loop, the probe waited for it."""
    release = threading.Event()
    inside = threading.Event()

    def answer(request: bounded_http.Request) -> bounded_http.Response:
        if request.path == "/metrics":
            inside.set()
            release.wait(20)
            return bounded_http.Response(200, "scraped\n")
        return bounded_http.Response(200, "ok\n")

    served = bounded_http.serve(
        answer, "127.0.0.1", 0, offload=lambda request: request.path == "/metrics"
    )
    scraped: list[tuple[int, bytes]] = []
    scraper = threading.Thread(target=lambda: scraped.append(_get(served.port, "/metrics")))
    try:
        scraper.start()
        assert inside.wait(5)
        assert _get(served.port, "/healthz") == (200, b"ok\n")  # timed out before: the loop
        assert not scraped  # ... while the scrape is still being built
    finally:
        release.set()
        scraper.join(10)
        served.stop()
    assert scraped == [(200, b"scraped\n")]


def test_offloaded_requests_past_the_queue_get_503_and_the_rest_are_answered() -> None:
    release = threading.Event()

    def answer(request: bounded_http.Request) -> bounded_http.Response:
        release.wait(20)
        return bounded_http.Response(200, "done\n")

    limits = bounded_http.Limits(offloaded=2)
    served = bounded_http.serve(answer, "127.0.0.1", 0, limits, offload=lambda _: True)
    results: list[tuple[int, bytes]] = []
    first = [threading.Thread(target=lambda: results.append(_get(served.port, "/"))) for _ in "ab"]
    try:
        for thread in first:
            thread.start()
        deadline = time.monotonic() + 5
        while served._waiting < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, body = _get(served.port, "/")
        assert status == 503 and b"busy" in body
    finally:
        release.set()
        for thread in first:
            thread.join(10)
        served.stop()
    assert results == [(200, b"done\n")] * 2
