"""The ``enflame-dra-webhook`` program: flags and ENFLAME_* variables, HTTPS only, a clean stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

from enflame_gcu.dra_webhook import main
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_webhook.conftest import Webhook, admission_review, apply_patch, pod


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_without_tls_files_it_refuses_to_start(capsys: Any) -> None:
    assert main.main(["--http-address", "127.0.0.1:0"]) == 2
    assert "--tls-cert-file" in capsys.readouterr().err


def test_a_bad_number_is_refused_naming_the_flag(pki: str, capsys: Any) -> None:
    tls = ["--tls-cert-file", os.path.join(pki, "tls.crt"),
           "--tls-key-file", os.path.join(pki, "tls.key")]  # fmt: skip
    for flag, value, said in (
        ("--api-timeout", "soon", "invalid --api-timeout: 'soon' is not a number"),
        ("--api-timeout", "60", "invalid --api-timeout: 60 is outside 0.1..30"),
        ("--max-body", "10", "invalid --max-body: 10 is outside 4096.."),
    ):
        assert main.main([*tls, "--http-address", "127.0.0.1:0", flag, value]) == 2, flag
        assert said in capsys.readouterr().err, flag


def test_flags_come_from_enflame_variables() -> None:
    environ = {"ENFLAME_DEVICE_CLASS": "other.example.com", "ENFLAME_HTTP_ADDRESS": ":9443"}
    args = main.build_parser(environ).parse_args([])
    assert (args.device_class, args.port, args.bind_address) == ("other.example.com", 9443, "")
    assert main.build_parser(environ).parse_args(["--device-class", "x"]).device_class == "x"


def _install(pki: str, directory: Any, suffix: str) -> None:
    """Swap the served pair at once, as a Secret's volume does."""
    for name in ("tls.crt", "tls.key"):
        staged = directory / f".{name}"
        shutil.copy(os.path.join(pki, name.replace("tls", f"tls{suffix}")), staged)
        os.replace(staged, directory / name)


def test_the_program_rewrites_a_pod_follows_a_renewed_certificate_and_stops_on_sigterm(
    api: FakeApiServer, pki: str, tmp_path: Any
) -> None:
    port = _free_port()
    served = tmp_path / "tls"
    served.mkdir()
    _install(pki, served, "")
    env = dict(os.environ, ENFLAME_TLS_CERT_FILE=str(served / "tls.crt"),
               ENFLAME_TLS_KEY_FILE=str(served / "tls.key"))  # fmt: skip
    command = [sys.executable, "-m", "enflame_gcu.dra_webhook.main",
               "--http-address", f"127.0.0.1:{port}",
               "--kubeconfig", api.kubeconfig(str(tmp_path / "kubeconfig"))]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        caller = Webhook(api, type("Port", (), {"port": port})(), pki)
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body = caller.post(json.dumps(admission_review(pod(2))).encode())
                break
            except OSError:
                assert time.monotonic() < deadline, "the webhook never answered"
                time.sleep(0.1)
        assert status == 200
        patched = apply_patch(pod(2), json.loads(body)["response"])
        assert patched["spec"]["resourceClaims"][0]["name"] == "enflame-gcu-c0"
        # A renewed certificate (another CA here) is served without a restart.
        _install(pki, served, "2")
        deadline = time.monotonic() + 10
        while True:
            try:
                status, _ = caller.post(json.dumps(admission_review(pod(2))).encode(), ca="ca2.crt")
                break
            except ssl.SSLError:
                assert time.monotonic() < deadline, "the renewed certificate was never served"
                time.sleep(0.2)
        assert status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
