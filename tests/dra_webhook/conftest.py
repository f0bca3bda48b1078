"""The webhook over real HTTPS on loopback, in front of the strict DRA stand-in API server."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from enflame_gcu.dra_webhook import cluster, server
from tests.dra_plugin import slices_helpers
from tests.dra_plugin.fake_apiserver import FakeApiServer


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA and a server certificate for 127.0.0.1 it signed (openssl)."""
    where = str(tmp_path_factory.mktemp("webhook-pki"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    with open(os.path.join(where, "ip.ext"), "w", encoding="utf-8") as ext:
        ext.write("subjectAltName=IP:127.0.0.1\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for suffix in ("", "2"):  # the second pair: a renewed certificate from another CA
        ca, tls = f"ca{suffix}", f"tls{suffix}"
        run("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
            "-subj", f"/CN={ca}")  # fmt: skip
        run("req", *key, "-keyout", f"{tls}.key", "-out", f"{tls}.csr", "-subj", "/CN=webhook")
        sign = ["-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial"]
        run("x509", "-req", "-in", f"{tls}.csr", *sign, "-out", f"{tls}.crt", "-days", "2",
            "-extfile", "ip.ext")  # fmt: skip
    return where


@dataclass
class Webhook:
    """The running webhook, the API server behind it, and how to call it."""

    api: FakeApiServer
    server: server.WebhookServer
    pki: str

    def post(self, body: bytes, path: str = "/mutate", ca: str = "ca.crt") -> tuple[int, bytes]:
        """One HTTPS POST as the API server makes it (it checks the CA bundle)."""
        context = ssl.create_default_context(cafile=os.path.join(self.pki, ca))
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.server.port, context=context, timeout=10
        )
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def review(self, pod: dict[str, Any], **request: Any) -> dict[str, Any]:
        """The webhook's answer (the ``response``) to an AdmissionReview of ``pod``."""
        status, body = self.post(json.dumps(admission_review(pod, **request)).encode())
        assert status == 200, body
        document = json.loads(body)
        assert document["apiVersion"] == "admission.k8s.io/v1"
        assert document["kind"] == "AdmissionReview"
        answer: dict[str, Any] = document["response"]
        assert answer["allowed"] is True  # never refuses a pod
        return answer


def admission_review(pod: dict[str, Any], **request: Any) -> dict[str, Any]:
    """An AdmissionReview for a pod CREATE, shaped as kube-apiserver sends it."""
    fields = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"].get("name", ""),
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    fields.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": fields}


def pod(*cards: int | str, **extra: Any) -> dict[str, Any]:
    """A pod written for the device plugin: one container per entry asking that many cards."""
    containers = [
        {
            "name": f"c{i}",
            "image": "ubuntu:22.04",
            "resources": {"limits": {"enflame.com/gcu": str(n), "cpu": "1"}},
        }
        for i, n in enumerate(cards)
    ]
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"containers": containers},
    }
    document["spec"].update(extra)
    return document


def _walk(document: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for part in parts[:-1]:
        document = document[int(part)] if isinstance(document, list) else document[part]
    last = parts[-1]
    return document, (len(document) if last == "-" else int(last)) if isinstance(
        document, list
    ) else last


def apply_patch(document: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The pod after the answer's JSONPatch (RFC 6902 add and remove, as the server applies)."""
    result = copy.deepcopy(document)
    if "patch" not in answer:
        return result
    assert answer["patchType"] == "JSONPatch"
    for operation in json.loads(base64.b64decode(answer["patch"])):
        parent, key = _walk(result, operation["path"])
        if operation["op"] == "remove":
            del parent[key]
        elif operation["op"] == "add":
            if isinstance(parent, list):
                parent.insert(int(key), operation["value"])
            else:
                parent[key] = operation["value"]
        else:
            raise AssertionError(f"unexpected op {operation}")
    return result


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """The strict 1.36 stand-in, with the driver's DeviceClasses installed."""
    with FakeApiServer() as fake:
        fake.device_classes.update(copy.deepcopy(slices_helpers.device_classes()))
        yield fake


@pytest.fixture
def webhook(api: FakeApiServer, pki: str, tmp_path: Any) -> Iterator[Webhook]:
    """The webhook serving HTTPS on loopback, its API client pointed at ``api``."""
    client = cluster.connect(api.kubeconfig(str(tmp_path / "kubeconfig")), timeout=2)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(os.path.join(pki, "tls.crt"), os.path.join(pki, "tls.key"))
    running = server.WebhookServer(
        ("127.0.0.1", 0), cluster.Cluster(client, remember=0), context, max_body=64 << 10
    )
    running.start()
    yield Webhook(api, running, pki)
    running.stop()
    client.close()
