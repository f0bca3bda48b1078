"""The chart ships the webhook off by default; turned on, its objects are valid for 1.34+, the
API server reaches it only for pod CREATEs in the chosen namespaces with failurePolicy Ignore,
and the certificate Helm makes is one the API server accepts for the Service's name (checked by
serving real HTTPS with it). The static manifest (deploy/dra/enflame-dra-webhook.yaml, with
cert-manager) says the same as the chart."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
from typing import Any

import pytest
import tomlkit

from enflame_gcu.dra_plugin import config
from enflame_gcu.dra_webhook import cluster, main, server
from tests.conftest import PROJECT_ROOT
from tests.deploy import helm_render
from tests.dra_plugin import slices_helpers as helpers
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_webhook.conftest import admission_review, pod

pytestmark = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
ON = {"namespaceOverride": "gcu-system", "dra": {"enabled": True, "webhook": {"enabled": True}}}


def _by_kind(rendered: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in rendered.get("dra-webhook.yaml", [])}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _by_kind(helm_render.render(str(tmp_path_factory.mktemp("on")), ON))


def test_off_by_default(tmp_path: Any) -> None:
    assert _by_kind(helm_render.render(str(tmp_path), {"dra": {"enabled": True}})) == {}


def test_the_objects_are_valid_for_kubernetes_1_34_and_newer(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert sorted(rendered) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "MutatingWebhookConfiguration",
        "Secret", "Service", "ServiceAccount",
    ]  # fmt: skip
    for document in rendered.values():
        for version in helpers.VERSIONS:
            helpers.validate(document, version)


def test_the_api_server_calls_it_only_where_it_is_safe(
    rendered: dict[str, dict[str, Any]],
) -> None:
    (hook,) = rendered["MutatingWebhookConfiguration"]["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
         "resources": ["pods"], "scope": "Namespaced"},
    ]  # fmt: skip
    assert hook["namespaceSelector"] == {"matchLabels": {"gcu.enflame.com/switch-local": "true"}}
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "gcu.enflame.com/switch-local", "operator": "NotIn", "values": ["false"]}
    ]
    assert 1 <= hook["timeoutSeconds"] <= 10
    service = hook["clientConfig"]["service"]
    assert service["path"] == "/mutate"
    assert service["name"] == rendered["Service"]["metadata"]["name"]
    rules = rendered["ClusterRole"]["rules"]
    assert rules == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
         "verbs": ["get", "create"]},
    ]  # fmt: skip


def test_every_namespace_when_asked(tmp_path: Any) -> None:
    values = {"dra": {"enabled": True, "webhook": {"enabled": True, "namespaceSelector": {}}}}
    (hook,) = _by_kind(helm_render.render(str(tmp_path), values))["MutatingWebhookConfiguration"][
        "webhooks"
    ]
    assert hook["namespaceSelector"] == {}


def test_the_deployment_runs_the_program_with_flags_it_has(
    rendered: dict[str, dict[str, Any]],
) -> None:
    (container,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    with open(os.path.join(PROJECT_ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        scripts = tomlkit.load(handle)["project"]["scripts"]
    assert scripts[container["command"][0]] == "enflame_gcu.dra_webhook.main:main"
    args = main.build_parser({}).parse_args(container["args"])
    assert args.port == container["ports"][0]["containerPort"]
    assert args.tls_cert_file.startswith(container["volumeMounts"][0]["mountPath"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_certificate_is_one_the_api_server_accepts_for_the_service(
    rendered: dict[str, dict[str, Any]], tmp_path: Any
) -> None:
    secret = rendered["Secret"]["data"]
    (hook,) = rendered["MutatingWebhookConfiguration"]["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["ca.crt"]
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(base64.b64decode(secret[name]))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    service = hook["clientConfig"]["service"]
    host = f"{service['name']}.{service['namespace']}.svc"  # the name the API server checks
    with FakeApiServer() as api:
        api.device_classes.update(helpers.device_classes())
        client = cluster.connect(api.kubeconfig(str(tmp_path / "kubeconfig")))
        running = server.WebhookServer(("127.0.0.1", 0), cluster.Cluster(client), context)
        running.start()
        try:
            trust = ssl.create_default_context(
                cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
            )
            connection = http.client.HTTPSConnection(
                "127.0.0.1", running.port, context=trust, timeout=10
            )
            # Connect by address, check the certificate against the Service's DNS name.
            connection.sock = trust.wrap_socket(
                socket.create_connection(("127.0.0.1", running.port), 10),
                server_hostname=host,
            )
            body = json.dumps(admission_review(pod(2))).encode()
            connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())["response"]
            assert answer["patchType"] == "JSONPatch"
            connection.close()
        finally:
            running.stop()
            client.close()


STATIC = os.path.join(helpers.DRA_DEPLOY, "enflame-dra-webhook.yaml")


def test_the_static_manifest_matches_the_chart(rendered: dict[str, dict[str, Any]]) -> None:
    static = {doc["kind"] + "/" + doc["metadata"]["name"]: doc for doc in helpers.load_yaml(STATIC)}
    kinds = {key.split("/")[0] for key in static}
    assert kinds == set(rendered) - {"Secret"} | {"Issuer", "Certificate"}
    by_kind = {
        key.split("/")[0]: doc
        for key, doc in static.items()
        if "cert-manager" not in doc["apiVersion"]
    }
    for kind, document in by_kind.items():
        for version in helpers.VERSIONS:
            helpers.validate(document, version)
        if kind == "ClusterRole":
            assert document["rules"] == rendered[kind]["rules"]
    (hook,) = by_kind["MutatingWebhookConfiguration"]["webhooks"]
    (chart_hook,) = rendered["MutatingWebhookConfiguration"]["webhooks"]
    assert {k: v for k, v in hook.items() if k != "clientConfig"} == {
        k: v for k, v in chart_hook.items() if k != "clientConfig"
    }
    (container,) = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    (chart_container,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    for field in ("command", "args", "ports", "readinessProbe", "livenessProbe", "volumeMounts",
                  "securityContext"):  # fmt: skip
        assert container[field] == chart_container[field], field
    # cert-manager signs the Service's names and injects its CA into the caBundle.
    service = hook["clientConfig"]["service"]
    certificate = static["Certificate/enflame-dra-webhook"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    annotation = by_kind["MutatingWebhookConfiguration"]["metadata"]["annotations"]
    assert annotation["cert-manager.io/inject-ca-from"] == "kube-system/enflame-dra-webhook"
    volume = by_kind["Deployment"]["spec"]["template"]["spec"]["volumes"][0]["secret"]
    assert volume["secretName"] == certificate["spec"]["secretName"]


def _device_order(tmp_path: Any, dra: dict[str, Any]) -> list[str]:
    rendered = helm_render.render(str(tmp_path), {"dra": {"enabled": True, **dra}})
    (daemonset,) = [d for d in rendered["daemonset-dra-plugin.yaml"] if d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return [a for a in container["args"] if a.startswith("--device-order")]


@pytest.mark.parametrize(
    ("dra", "expected"),
    [
        ({}, "topology"),
        ({"webhook": {"enabled": True}}, "topology"),
        # The plain path alone: its claims carry no constraint, and minor order serves them
        # better than topology order (docs/benchmarks.md, bench_dra_extended).
        ({"extendedResource": True}, "index"),
        ({"extendedResource": True, "webhook": {"enabled": True}}, "topology"),
        ({"extendedResource": True, "deviceOrder": "topology"}, "topology"),
        ({"deviceOrder": "index"}, "index"),
    ],
)
def test_the_driver_publishes_in_the_order_its_claims_are_served_best_by(
    tmp_path: Any, dra: dict[str, Any], expected: str
) -> None:
    # topology is the driver's own default (as the operator's DaemonSet runs it): no flag.
    flags = ["--device-order=index"] if expected == "index" else []
    assert _device_order(tmp_path, dra) == flags
    assert config.parse(["--node-name=n1"], environ={}).device_order == "topology"


def test_a_device_order_the_driver_does_not_know_is_refused(tmp_path: Any) -> None:
    with pytest.raises(AssertionError, match="deviceOrder"):
        helm_render.render(str(tmp_path), {"dra": {"enabled": True, "deviceOrder": "busiest"}})
