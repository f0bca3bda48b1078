"""The extender's HTTPS certificates follow their files: a rotated certificate or client CA is
used for the next handshake without a restart, and files that cannot be used keep the last good
ones (real TLS over loopback, certificates made by openssl)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, server, tls

# The module's certificates are made once (openssl): its tests stay on one xdist worker.
pytestmark = [pytest.mark.xdist_group("extender-tls")]
PRIORITIZE = json.dumps({"Pod": {"metadata": {"name": "p"}, "spec": {}}, "NodeNames": ["a"]})


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two CAs; per CA a server certificate for 127.0.0.1 and a client certificate."""
    where = str(tmp_path_factory.mktemp("pki"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    with open(os.path.join(where, "ip.ext"), "w", encoding="utf-8") as ext:
        ext.write("subjectAltName=IP:127.0.0.1\n")
    for ca in ("ca1", "ca2"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
            "-subj", f"/CN={ca}")  # fmt: skip
        for role in ("server", "client"):
            name = f"{role}-{ca}"
            key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")  # fmt: skip
            sign = ["-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial"]
            run("x509", "-req", "-in", f"{name}.csr", *sign, "-out", f"{name}.crt",
                "-days", "2", "-extfile", "ip.ext")  # fmt: skip
    return where


def install(pki: str, directory: str, source: str, target: str) -> None:
    """Replace ``target`` with a copy of ``source`` at once (as a Secret's volume swaps)."""
    staged = os.path.join(directory, f".{target}")
    shutil.copy(os.path.join(pki, source), staged)
    os.replace(staged, os.path.join(directory, target))


@pytest.fixture
def served(pki: str, tmp_path: object) -> Iterator[tuple[str, tls.ReloadingTLS, int]]:
    directory = str(tmp_path)
    for source, target in (("server-ca1.crt", "tls.crt"), ("server-ca1.key", "tls.key"),
                           ("ca1.crt", "ca.crt")):  # fmt: skip
        install(pki, directory, source, target)
    reloading = tls.ReloadingTLS(
        *(os.path.join(directory, name) for name in ("tls.crt", "tls.key", "ca.crt")),
        check_every=0,
    )
    http_server = server.ExtenderServer(
        ("127.0.0.1", 0),
        decisions.Decisions(extender_cache.ClusterCache()),
        ssl_context=reloading.context,
    )
    http_server.start()
    yield directory, reloading, http_server.port
    http_server.stop()


def call(pki: str, port: int, client: str, trust: str) -> str:
    """One HTTPS prioritize as ``client``, trusting ``trust``; the server certificate's CN."""
    context = ssl.create_default_context(cafile=os.path.join(pki, f"{trust}.crt"))
    context.load_cert_chain(os.path.join(pki, f"{client}.crt"), os.path.join(pki, f"{client}.key"))
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        connection.request("POST", "/prioritize", PRIORITIZE)
        assert connection.getresponse().status == 200
        assert connection.sock is not None
        peer: Any = connection.sock.getpeercert()
        return str(dict(item[0] for item in peer["subject"])["commonName"])
    finally:
        connection.close()


def test_a_rotated_certificate_and_client_ca_are_used_without_a_restart(
    pki: str, served: tuple[str, tls.ReloadingTLS, int]
) -> None:
    directory, reloading, port = served
    assert call(pki, port, "client-ca1", "ca1") == "server-ca1"
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        call(pki, port, "client-ca2", "ca1")  # not signed by the client CA in use
    for source, target in (("server-ca2.crt", "tls.crt"), ("server-ca2.key", "tls.key"),
                           ("ca2.crt", "ca.crt")):  # fmt: skip
        install(pki, directory, source, target)
    assert call(pki, port, "client-ca2", "ca2") == "server-ca2"
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        call(pki, port, "client-ca1", "ca2")  # the old client CA is no longer trusted
    assert reloading.reloads == 1


def test_files_that_cannot_be_used_keep_the_last_good_ones(
    pki: str, served: tuple[str, tls.ReloadingTLS, int], caplog: pytest.LogCaptureFixture
) -> None:
    directory, reloading, port = served
    install(pki, directory, "server-ca2.crt", "tls.crt")  # its key not there yet: a mismatch
    with caplog.at_level(logging.WARNING):
        assert call(pki, port, "client-ca1", "ca1") == "server-ca1"
        assert call(pki, port, "client-ca1", "ca1") == "server-ca1"
    warnings = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warnings) == 1 and "keeping the previous" in warnings[0].getMessage()
    with open(os.path.join(directory, "ca.crt"), "w", encoding="utf-8") as garbage:
        garbage.write("not a certificate\n")
    assert call(pki, port, "client-ca1", "ca1") == "server-ca1"
    assert reloading.reloads == 0
    install(pki, directory, "server-ca1.crt", "tls.crt")
    install(pki, directory, "ca1.crt", "ca.crt")
    assert call(pki, port, "client-ca1", "ca1") == "server-ca1"
