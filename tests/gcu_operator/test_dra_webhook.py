"""enflame-dra-webhook through the operator (issue 51, point 2): ``spec.dra.webhook.enabled``
makes the webhook's objects (owned, reconciled, removed), the same as
deploy/dra/enflame-dra-webhook.yaml; refused, with nothing made, where the cluster serves no
resource.k8s.io/v1 or no cert-manager.io/v1."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml

from enflame_gcu.gcu_operator import api, crd, runner, webhook
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import REPO, converge, ours, set_spec, status

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
STATIC = REPO / "deploy" / "dra" / "enflame-dra-webhook.yaml"
NS = "kube-system"
# Every object the webhook is made of: (kind, namespaced?, name).
MADE = [
    (api.SERVICE_ACCOUNT, webhook.NAME),
    (api.CLUSTER_ROLE, webhook.NAME),
    (api.CLUSTER_ROLE_BINDING, webhook.NAME),
    (api.ISSUER, webhook.SELF_SIGNED),
    (api.CERTIFICATE, webhook.CA),
    (api.ISSUER, webhook.CA),
    (api.CERTIFICATE, webhook.NAME),
    (api.SERVICE, webhook.NAME),
    (api.DEPLOYMENT, webhook.NAME),
    (api.MUTATING_WEBHOOK, webhook.NAME),
]
WEBHOOK_KINDS = {"Deployment", "MutatingWebhookConfiguration", "Certificate", "Issuer"}


def _find(fake: FakeApi, kind: api.Kind, name: str) -> dict[str, Any] | None:
    return fake.find(kind, name, NS if kind.namespaced else None)


def _start(
    spec: dict[str, Any], *, dra: bool = True, cert_manager: bool = True
) -> tuple[FakeApi, FakeCluster, runner.Operator, dict[str, Any]]:
    fake = FakeApi(dra_served=dra, cert_manager_served=cert_manager)
    cluster = FakeCluster(fake, ["node-a"])
    resource = ours(dra=spec)
    fake.put(api.GCU_RESOURCE, resource)
    return fake, cluster, runner.Operator(fake, clock=lambda: fake.now), resource


def _uid(fake: FakeApi) -> str:
    found = fake.find(api.GCU_RESOURCE, "gcu")
    assert found is not None
    return str(found["metadata"]["uid"])


def test_enabled_makes_every_object_owned_by_the_resource() -> None:
    fake, cluster, operator, _ = _start({"webhook": {"enabled": True}})
    converge(operator, cluster)
    uid = _uid(fake)
    for kind, name in MADE:
        obj = _find(fake, kind, name)
        assert obj is not None, (kind.kind, name)
        refs = obj["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == [uid] and refs[0]["controller"] is True
    registration = _find(fake, api.MUTATING_WEBHOOK, webhook.NAME)
    assert registration is not None
    hook = registration["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {"matchLabels": {"gcu.enflame.com/switch-local": "true"}}
    assert hook["clientConfig"]["service"] == {
        "name": webhook.NAME,
        "namespace": NS,
        "path": "/mutate",
        "port": 443,
    }
    assert registration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NS}/{webhook.NAME}"
    )
    deployment = _find(fake, api.DEPLOYMENT, webhook.NAME)
    driver = fake.find(api.DAEMONSET, "enflame-dra-plugin", NS)
    assert deployment is not None and driver is not None
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # The image the operator gives the DRA driver; the webhook's own command.
    assert container["image"] == driver["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["enflame-dra-webhook"]
    assert status(fake, ours())["phase"] == "Running", status(fake, ours())["conditions"]


def test_a_namespace_selector_is_passed_on() -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
    fake, cluster, operator, _ = _start(
        {"webhook": {"enabled": True, "namespaceSelector": selector}}
    )
    converge(operator, cluster)
    registration = _find(fake, api.MUTATING_WEBHOOK, webhook.NAME)
    assert registration is not None
    assert registration["webhooks"][0]["namespaceSelector"] == selector


def test_hand_edits_are_put_back_and_the_injected_ca_bundle_is_kept() -> None:
    fake, cluster, operator, _ = _start({"webhook": {"enabled": True}})
    converge(operator, cluster)
    registration = _find(fake, api.MUTATING_WEBHOOK, webhook.NAME)
    assert registration is not None
    registration["webhooks"][0]["clientConfig"]["caBundle"] = "Q0EtZnJvbS1jZXJ0LW1hbmFnZXI="
    fake.replace(api.MUTATING_WEBHOOK, registration)
    rewrites = fake.calls.count(("replace", "MutatingWebhookConfiguration"))
    converge(operator, cluster)
    # cert-manager's injection is no difference: nothing rewritten.
    assert fake.calls.count(("replace", "MutatingWebhookConfiguration")) == rewrites
    kept = _find(fake, api.MUTATING_WEBHOOK, webhook.NAME)
    assert kept is not None
    edited = copy.deepcopy(kept)
    edited["webhooks"][0]["failurePolicy"] = "Fail"
    fake.replace(api.MUTATING_WEBHOOK, edited)
    deployment = _find(fake, api.DEPLOYMENT, webhook.NAME)
    assert deployment is not None
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    fake.replace(api.DEPLOYMENT, deployment)
    converge(operator, cluster)
    back = _find(fake, api.MUTATING_WEBHOOK, webhook.NAME)
    assert back is not None
    assert back["webhooks"][0]["failurePolicy"] == "Ignore"
    assert back["webhooks"][0]["clientConfig"]["caBundle"] == "Q0EtZnJvbS1jZXJ0LW1hbmFnZXI="
    restored = _find(fake, api.DEPLOYMENT, webhook.NAME)
    assert restored is not None
    assert restored["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:latest"


def test_turning_it_off_removes_it_and_nothing_else() -> None:
    fake, cluster, operator, resource = _start({"webhook": {"enabled": True}})
    converge(operator, cluster)
    assert all(_find(fake, kind, name) is not None for kind, name in MADE)
    set_spec(fake, resource, ["dra", "webhook", "enabled"], False)
    converge(operator, cluster)
    for kind, name in MADE:
        assert _find(fake, kind, name) is None, (kind.kind, name)
    assert fake.find(api.DAEMONSET, "enflame-dra-plugin", NS) is not None


def test_deleting_the_resource_removes_it() -> None:
    fake, cluster, operator, _ = _start({"webhook": {"enabled": True}})
    converge(operator, cluster)
    assert all(_find(fake, kind, name) is not None for kind, name in MADE)
    fake.delete(api.GCU_RESOURCE, "gcu")
    converge(operator, cluster)
    assert fake.find(api.GCU_RESOURCE, "gcu") is None
    for kind, name in MADE:
        assert _find(fake, kind, name) is None, (kind.kind, name)


@pytest.mark.parametrize(
    ("dra", "cert_manager", "named"),
    [
        (False, True, "resource.k8s.io/v1"),
        (False, False, "resource.k8s.io/v1"),
        (True, False, "cert-manager.io/v1"),
    ],
)
def test_refused_where_the_cluster_cannot_run_it(dra: bool, cert_manager: bool, named: str) -> None:
    fake, cluster, operator, _ = _start(
        {"webhook": {"enabled": True}}, dra=dra, cert_manager=cert_manager
    )
    converge(operator, cluster)
    st = status(fake, ours())
    assert st["phase"] == "Failed"
    message = st["conditions"][0]["message"]
    assert "spec.dra.webhook.enabled" in message and named in message, message
    created = {k for verb, k in fake.calls if verb == "create"}
    assert not created & WEBHOOK_KINDS, created
    for kind, name in MADE:
        assert _find(fake, kind, name) is None, (kind.kind, name)


def test_cert_manager_installed_later_is_seen() -> None:
    fake, cluster, operator, _ = _start({"webhook": {"enabled": True}}, cert_manager=False)
    converge(operator, cluster)
    assert _find(fake, api.MUTATING_WEBHOOK, webhook.NAME) is None
    fake.cert_manager_served = True
    converge(operator, cluster)
    assert _find(fake, api.MUTATING_WEBHOOK, webhook.NAME) is not None
    assert status(fake, ours())["phase"] == "Running"


def test_off_by_default_and_a_bad_value_is_reported() -> None:
    fake, cluster, operator, _ = _start({})
    converge(operator, cluster)
    assert not {k for verb, k in fake.calls if verb == "create"} & WEBHOOK_KINDS
    bad = rs.parse({"dra": {"webhook": {"enabled": "yes"}}})
    assert not bad.dra.webhook
    assert [u.field for u in bad.unsupported] == ["spec.dra.webhook.enabled"]


def _kubectl(schema: Any) -> Any:
    """The schema with unknown fields refused (as kubectl validates)."""
    if isinstance(schema, list):
        return [_kubectl(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _kubectl(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def test_the_crd_accepts_the_field_and_refuses_bad_values() -> None:
    schema = _kubectl(crd.spec_schema())
    good = {"dra": {"webhook": {"enabled": True, "namespaceSelector": {"matchLabels": {"a": "b"}}}}}
    jsonschema.validate(good, schema)
    for bad in (
        {"dra": {"webhook": {"enabled": "yes"}}},
        {"dra": {"webhook": {"enable": True}}},
        {"dra": {"webhook": {"namespaceSelector": {"matchExpressions": [{"key": "a"}]}}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def _static() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(STATIC.read_text())}


def test_the_objects_are_the_static_manifests() -> None:
    resource = ours(dra={"webhook": {"enabled": True}})
    resource["metadata"]["uid"] = "u-1"
    mine = webhook.objects(resource, rs.parse(resource["spec"]))
    static = _static()
    assert {(o["kind"], o["metadata"]["name"]) for o in mine.values()} == set(static)
    for obj in mine.values():
        theirs = static[(obj["kind"], obj["metadata"]["name"])]
        for field in ("rules", "roleRef", "subjects", "webhooks"):
            assert obj.get(field) == theirs.get(field), (obj["kind"], field)
        if obj["kind"] in ("Issuer", "Certificate"):
            assert obj["spec"] == theirs["spec"]
        if obj["kind"] == "Deployment":
            ours_pod = obj["spec"]["template"]["spec"]
            their_pod = theirs["spec"]["template"]["spec"]
            skip = {"image"}
            assert [
                {k: v for k, v in c.items() if k not in skip} for c in ours_pod["containers"]
            ] == [{k: v for k, v in c.items() if k not in skip} for c in their_pod["containers"]]
            assert ours_pod["volumes"] == their_pod["volumes"]
            assert ours_pod["securityContext"] == their_pod["securityContext"]
    assert (
        mine[webhook.REGISTRATION_KEY]["metadata"]["annotations"]
        == (static[("MutatingWebhookConfiguration", webhook.NAME)]["metadata"]["annotations"])
    )


@needs_helm
def test_the_charts_operator_may_make_rewrite_and_delete_them_only(tmp_path: Any) -> None:
    """The chart's operator RBAC allows every call the webhook's objects need, holds the rules
    the webhook's ClusterRole grants (RBAC's escalation check), and names what it may rewrite."""
    from tests.gcu_operator.test_operator_chart import RELEASE_NS, WRITES, Rbac, _docs, _rendered

    # Off by default: the standing grant (any MutatingWebhookConfiguration created, claim
    # templates in every namespace) only for those who let a GcuResource deploy the webhook.
    default = Rbac(_docs(_rendered(tmp_path / "default")))
    for kind, where in ((api.MUTATING_WEBHOOK, ""), (api.RESOURCE_CLAIM_TEMPLATE, "some-team")):
        assert not default.allows("create", kind, "", where), kind.kind
    assert not default.allows("create", api.DEPLOYMENT, webhook.NAME, RELEASE_NS)
    # But every pass reads whether the webhook's objects exist: those reads stay.
    for kind in (api.MUTATING_WEBHOOK, api.DEPLOYMENT, api.CERTIFICATE, api.ISSUER):
        for verb in ("get", "list", "watch"):
            assert default.allows(
                verb, kind, "", "" if kind is api.MUTATING_WEBHOOK else RELEASE_NS
            )
    rbac = Rbac(_docs(_rendered(tmp_path / "on", draWebhook=True)))
    resource = ours(dra={"webhook": {"enabled": True}})
    resource["metadata"]["uid"] = "u-1"
    runner.default_namespace(resource, RELEASE_NS)
    made = webhook.objects(resource, rs.parse(resource["spec"]))
    for obj in made.values():
        kind, meta = api.BY_KIND[obj["kind"]], obj["metadata"]
        where = meta.get("namespace") or ""
        assert where in ("", RELEASE_NS)
        for verb in ("get", "list", "watch", "create", "update", "delete"):
            assert rbac.allows(verb, kind, meta["name"], where), (verb, obj["kind"], meta["name"])
    for rule in webhook.RULES:
        for resource_name in rule["resources"]:
            kind = (
                api.DEVICE_CLASS
                if resource_name == "deviceclasses"
                else api.RESOURCE_CLAIM_TEMPLATE
            )
            for verb in rule["verbs"]:
                assert rbac.allows(verb, kind, "", "some-team"), (verb, resource_name)
    for kind, name, where in (
        (api.MUTATING_WEBHOOK, "someone-elses", ""),
        (api.DEPLOYMENT, "coredns", "kube-system"),
        (api.DEPLOYMENT, "someone-elses", RELEASE_NS),
        (api.CERTIFICATE, "someone-elses", RELEASE_NS),
        (api.ISSUER, "someone-elses", RELEASE_NS),
    ):
        for verb in WRITES:
            assert not rbac.allows(verb, kind, name, where), (verb, kind.kind, name)
