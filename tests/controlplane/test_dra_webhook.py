"""The rewriting webhook called by a real kube-apiserver (1.20, no ``resource.k8s.io``) through
a MutatingWebhookConfiguration with a caBundle, over HTTPS.

That server silently drops ``spec.resourceClaims`` and ``resources.claims`` from a pod, so a
rewritten pod would lose its GCU request: the webhook sees that the DRA API is not served and
gives the pod back as written (``enflame.com/gcu`` kept, a warning to the user). The second
test shows the danger is real: a webhook told (by a stand-in API server) that DRA is there
rewrites the pod, and the real server stores it with no GCU request at all.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu.dra_webhook import cluster, server
from tests.controlplane import conftest
from tests.controlplane.harness import Harness
from tests.dra_plugin import slices_helpers
from tests.dra_plugin.fake_apiserver import FakeApiServer

pytestmark = [*conftest.MARKS, pytest.mark.xdist_group("controlplane-dra-webhook")]
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA and a serving certificate for 127.0.0.1 (the API server calls the webhook there)."""
    where = str(tmp_path_factory.mktemp("webhook-pki"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    with open(os.path.join(where, "ip.ext"), "w", encoding="utf-8") as ext:
        ext.write("subjectAltName=IP:127.0.0.1\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=ca"
    )
    run("req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=webhook")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "2", "-extfile", "ip.ext")  # fmt: skip
    return where


@contextlib.contextmanager
def webhook(harness: Harness, pki: str, kubeconfig: str, marker: str) -> Iterator[None]:
    """The webhook serving on loopback, registered for pods labelled ``h69-webhook=marker``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(os.path.join(pki, "tls.crt"), os.path.join(pki, "tls.key"))
    client = cluster.connect(kubeconfig, timeout=2)
    running = server.WebhookServer(("127.0.0.1", 0), cluster.Cluster(client, remember=0), context)
    running.start()
    with open(os.path.join(pki, "ca.crt"), "rb") as handle:
        bundle = base64.b64encode(handle.read()).decode()
    name = f"enflame-dra-webhook-{marker}"
    harness.plane.api("POST", MWC, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "switch-local.gcu.enflame.com",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "clientConfig": {"url": f"https://127.0.0.1:{running.port}/mutate",
                             "caBundle": bundle},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {"h69-webhook": marker}},
        }],
    })  # fmt: skip
    try:
        yield
    finally:
        harness.plane.request("DELETE", f"{MWC}/{name}")
        running.stop()
        client.close()


def _pod(name: str, marker: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"h69-webhook": marker}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox",
                 "resources": {"limits": {"enflame.com/gcu": "2"}}}
            ]
        },
    }  # fmt: skip


def _create_until_reviewed(
    harness: Harness, namespace: str, marker: str, said: str
) -> dict[str, Any]:
    """Create pods until one comes back with the webhook's mark (the API server picks up a new
    configuration within a second or so); that pod as stored."""
    deadline = time.monotonic() + 30
    for attempt in range(1000):
        name = f"train-{attempt}"
        result = harness.plane.kubectl(
            "create", "-n", namespace, "-f", "-", stdin=json.dumps(_pod(name, marker))
        )
        stored: dict[str, Any] = harness.plane.api(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        if said in result.stderr + json.dumps(stored.get("metadata", {}).get("annotations", {})):
            return stored | {"warnings": result.stderr}
        assert time.monotonic() < deadline, f"the webhook was never called: {result.stderr}"
        time.sleep(0.5)
    raise AssertionError("unreachable")


def test_a_server_without_dra_gets_the_pod_back_as_written(
    harness: Harness, namespace: str, pki: str
) -> None:
    with webhook(harness, pki, harness.plane.kubeconfig, "plain"):
        stored = _create_until_reviewed(harness, namespace, "plain", "enflame-dra-webhook")
    assert "does not serve DeviceClass gcu.enflame.com in resource.k8s.io/v1" in stored["warnings"]
    container = stored["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"enflame.com/gcu": "2"}
    assert "resourceClaims" not in stored["spec"]


def test_without_the_check_the_old_server_would_take_the_pods_cards(
    harness: Harness, namespace: str, pki: str, tmp_path: Any
) -> None:
    with FakeApiServer() as api:  # tells the webhook resource.k8s.io/v1 is served
        api.device_classes.update(slices_helpers.device_classes())
        kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
        with webhook(harness, pki, kubeconfig, "fooled"):
            stored = _create_until_reviewed(harness, namespace, "fooled", "enflame.com/gcu: main=2")
    # The 1.20 server kept the webhook's annotation but dropped every claim field.
    container = stored["spec"]["containers"][0]
    assert "enflame.com/gcu" not in (container.get("resources") or {}).get("limits", {})
    assert "claims" not in (container.get("resources") or {})
    assert "resourceClaims" not in stored["spec"]
