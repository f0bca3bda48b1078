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
