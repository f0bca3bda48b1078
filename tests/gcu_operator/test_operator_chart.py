"""Issue 47 points 9, 12 and 13 in the chart (rendered with Helm's own engine): the operator's
RBAC names what it may rewrite or delete, its pods admit no connection, and its uninstall hook
runs first and ends inside Helm's wait."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from enflame_gcu.gcu_operator import api, components, leader, main, runner
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR
from tests.gcu_operator import fake_api
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, vendor_example

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
# `helm uninstall --timeout`'s default: how long Helm waits for a hook (Helm 3: 5m0s).
HELM_DEFAULT_TIMEOUT = 300
RELEASE_NS = "enflame-gcu"
WRITES = ("update", "patch", "delete")


def _rendered(tmp_path: Any, **operator: Any) -> dict[str, list[Any]]:
    values = {
        "namespaceOverride": RELEASE_NS,
        "operator": {"enabled": True, **operator},
        "dra": {"enabled": True},
    }
    return helm_render.render(str(tmp_path), values)


def _docs(rendered: dict[str, list[Any]], template: str = "operator.yaml") -> list[Any]:
    return [d for d in rendered.get(template, []) if d]


class Rbac:
    """What Kubernetes' RBAC authorizer allows the operator's ServiceAccount, from the rendered
    roles: a rule matches a request by API group, resource and verb, and, when it lists
    resourceNames, only a request naming one of them (a create names none: such a rule never
    allows a create)."""

    def __init__(self, docs: list[Any]) -> None:
        self.cluster = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
        self.namespaced: dict[str, list[Any]] = {}
        for doc in docs:
            if doc["kind"] == "Role":
                self.namespaced.setdefault(doc["metadata"]["namespace"], []).extend(doc["rules"])
        bound = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding",)}
        assert {n for d in docs if d["kind"] == "Role" for n in [d["metadata"]["name"]]} <= bound

    @staticmethod
    def _match(rules: list[Any], group: str, resource: str, verb: str, name: str) -> bool:
        for rule in rules:
            if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
                continue
            if resource not in rule.get("resources", []) and "*" not in rule.get("resources", []):
                continue
            if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
                continue
            names = rule.get("resourceNames")
            if names and (verb == "create" or name not in names):
                continue
            return True
        return False

    def allows(self, verb: str, kind: api.Kind, name: str, namespace: str = "") -> bool:
        group = kind.group
        if self._match(self.cluster, group, kind.plural, verb, name):
            return True
        rules = self.namespaced.get(namespace, []) if kind.namespaced else []
        return self._match(rules, group, kind.plural, verb, name)


def _everything() -> dict[str, Any]:
    """A resource deploying every component (defaults), in the release namespace."""
    resource = {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "u-1"},
        "spec": {
            "containerToolkit": {},
            # Node state on: the plugin's ServiceAccount and its node-state RBAC are made too.
            "devicePlugin": {"nodeState": True},
            "gcuExporter": {},
            "gfd": {},
            "dra": {},
            "nodeMode": "runtimeclass",
        },
    }
    runner.default_namespace(resource, RELEASE_NS)
    return resource


# --- point 9: least privilege -------------------------------------------------------------------


@needs_helm
def test_the_operator_may_rewrite_and_delete_its_own_objects_only(tmp_path: Any) -> None:
    """Every object the operator makes it may update and delete; objects of the same kinds that
    are not its own (cluster-admin, the nodes' binding, kube-proxy, another RuntimeClass, the
    scheduler's Lease) it may neither rewrite nor delete. Only create is unnamed."""
    rbac = Rbac(_docs(_rendered(tmp_path)))
    resource = _everything()
    made = components.desired(resource, rs.parse(resource["spec"]), True, "dra")
    assert {o["kind"] for o in made.values()} >= {
        "DaemonSet",
        "Service",
        "ServiceAccount",
        "NetworkPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "RuntimeClass",
        "ResourceClaimTemplate",
    }
    for obj in made.values():
        kind = api.BY_KIND[obj["kind"]]
        meta = obj["metadata"]
        where = meta.get("namespace") or ""
        assert rbac.allows("create", kind, meta["name"], where), obj["kind"]
        for verb in ("update", "delete"):
            assert rbac.allows(verb, kind, meta["name"], where), (verb, obj["kind"], meta["name"])
    assert rbac.allows("update", api.LEASE, leader.LEASE_NAME, RELEASE_NS)
    not_ours = [
        (api.CLUSTER_ROLE, "cluster-admin", ""),
        (api.CLUSTER_ROLE_BINDING, "system:node", ""),
        (api.CLUSTER_ROLE_BINDING, "cluster-admin", ""),
        (api.RUNTIME_CLASS, "runc", ""),
        (api.DAEMONSET, "kube-proxy", "kube-system"),
        (api.DAEMONSET, "someone-elses", RELEASE_NS),
        (api.SERVICE, "kube-dns", "kube-system"),
        (api.SERVICE_ACCOUNT, "someone-elses", RELEASE_NS),
        (api.NETWORK_POLICY, "default-deny", RELEASE_NS),
        (api.ROLE, "someone-elses", RELEASE_NS),
        (api.ROLE_BINDING, "someone-elses", RELEASE_NS),
        (api.ROLE, "system:controller:bootstrap-signer", "kube-system"),
        (api.LEASE, "kube-scheduler", "kube-system"),
    ]
    for kind, name, where in not_ours:
        for verb in WRITES:
            assert not rbac.allows(verb, kind, name, where), (verb, kind.kind, name, where)
    # The Leases of a component namespace: only the plugin's lease verbs (patch and delete are
    # among them, and RBAC lets the operator grant them only if it holds them), never update.
    assert not rbac.allows("update", api.LEASE, "kube-scheduler", RELEASE_NS)
    # Nothing at all in kube-system by default: its accounts are not the operator's.
    for kind in (api.DAEMONSET, api.POD, api.SERVICE, api.SERVICE_ACCOUNT):
        assert not rbac.allows("create", kind, "x", "kube-system"), kind.kind
    # Neither bind nor escalate nor a wildcard anywhere.
    for rule in rbac.cluster + [r for rules in rbac.namespaced.values() for r in rules]:
        assert not {"bind", "escalate", "impersonate", "*"} & set(rule["verbs"]), rule


def _plugin_lease_rbac() -> tuple[dict[str, Any], dict[str, Any]]:
    resource = _everything()
    made = components.desired(resource, rs.parse(resource["spec"]), True, "dra")
    return made[components.PLUGIN_LEASE_ROLE_KEY], made[components.PLUGIN_LEASE_BINDING_KEY]


def _granted(rbac: Rbac, namespace: str) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) of the RBAC API and Leases the operator holds unnamed in
    ``namespace`` (what RBAC's escalation check counts), of the verbs there are."""
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    kinds = (api.LEASE, api.ROLE, api.ROLE_BINDING)
    return {
        (kind.group, kind.plural, verb)
        for kind in kinds
        for verb in verbs
        if rbac.allows(verb, kind, "", namespace)
    }


@needs_helm
@pytest.mark.parametrize("listed", [[], ["kube-system"]], ids=["release", "kube-system-listed"])
def test_the_operator_may_grant_the_plugins_lease_role_and_nothing_more(
    tmp_path: Any, listed: list[str]
) -> None:
    """Kubernetes refuses a Role, or a binding to one, that grants what its creator does not hold
    in that namespace (unless it has bind or escalate, which the operator must not): in each
    component namespace the operator holds exactly the plugin's lease verbs, may create Roles
    and RoleBindings, and may rewrite or delete only the ones named <component>-node-state."""
    rbac = Rbac(_docs(_rendered(tmp_path, componentNamespaces=listed)))
    role, binding = _plugin_lease_rbac()
    [rule] = role["rules"]
    wanted = {
        (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    for where in (RELEASE_NS, *listed):
        for obj in (role, binding):
            kind, name = api.BY_KIND[obj["kind"]], obj["metadata"]["name"]
            for verb in ("create", "update", "delete"):
                assert rbac.allows(verb, kind, name, where), (verb, obj["kind"], where)
            assert not rbac.allows("patch", kind, name, where), (obj["kind"], where)
        assert _granted(rbac, where) == wanted | _rbac_verbs("get", "list", "watch", "create")
    # Not a component namespace: Roles read (as everything is), nothing written, no Lease held.
    for where in ("default", *(() if listed else ("kube-system",))):
        assert _granted(rbac, where) == _rbac_verbs("get", "list", "watch"), where


def _rbac_verbs(*verbs: str) -> set[tuple[str, str, str]]:
    return {("rbac.authorization.k8s.io", r, v) for r in ("roles", "rolebindings") for v in verbs}


@needs_helm
def test_a_listed_component_namespace_gets_the_same_named_rules(tmp_path: Any) -> None:
    rbac = Rbac(_docs(_rendered(tmp_path, componentNamespaces=["kube-system"])))
    assert rbac.allows("create", api.POD, "x", "kube-system")
    assert rbac.allows("delete", api.DAEMONSET, "enflame-k8s-device-plugin", "kube-system")
    assert not rbac.allows("delete", api.DAEMONSET, "kube-proxy", "kube-system")


@needs_helm
def test_the_vendors_example_names_are_the_operators_to_rewrite(tmp_path: Any) -> None:
    """The vendor's 2.0 example renames the toolkit and the plugin (and names kube-system):
    with kube-system listed, the operator may update and delete every object it makes for it,
    or its upgrades and its removal would be refused."""
    rbac = Rbac(_docs(_rendered(tmp_path, componentNamespaces=["kube-system"])))
    resource = {**vendor_example(), "metadata": {"name": "vendor", "uid": "u-2"}}
    made = components.desired(resource, rs.parse(resource["spec"]), True, "dra")
    assert {o["metadata"]["name"] for o in made.values()} >= {"enflame-gcu-k8s-plugin"}
    for obj in made.values():
        kind = api.BY_KIND[obj["kind"]]
        meta = obj["metadata"]
        for verb in ("create", "update", "delete"):
            assert rbac.allows(verb, kind, meta["name"], meta.get("namespace") or ""), (
                verb,
                obj["kind"],
                meta["name"],
            )


def test_components_naming_no_namespace_go_to_the_operators_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fake_api, "NAMESPACES", fake_api.NAMESPACES | {RELEASE_NS})
    fake = FakeApi()
    cluster = FakeCluster(fake, ["node-a"])
    fake.put(api.GCU_RESOURCE, ours())
    operator = runner.Operator(
        fake,
        clock=lambda: fake.now,
        allowed_namespaces=frozenset({RELEASE_NS}),
        component_namespace=RELEASE_NS,
    )
    converge(operator, cluster)
    placed = {
        (o["kind"], o["metadata"]["namespace"])
        for kind in (api.DAEMONSET, api.POD, api.SERVICE_ACCOUNT)
        for o in fake.objects(kind)
        if (o["metadata"].get("labels") or {}).get("enflame.com/gcu.resource-uid")
    }
    assert placed and {where for _, where in placed} == {RELEASE_NS}, placed
    stored = fake.find(api.GCU_RESOURCE, "gcu")
    assert stored is not None
    assert "namespace" not in (stored["spec"].get("devicePlugin") or {})  # read, not rewritten
    args = main._parser().parse_args(["--namespace", RELEASE_NS])
    assert main.component_namespace(args) == RELEASE_NS


# --- point 12: the operator's NetworkPolicy -------------------------------------------------------


@needs_helm
def test_the_operators_pods_admit_no_connection(tmp_path: Any) -> None:
    docs = _docs(_rendered(tmp_path))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == []  # no rule: nothing admitted (the node always is)
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    on_host = _docs(_rendered(tmp_path / "host", hostNetwork=True))
    assert not [d for d in on_host if d["kind"] == "NetworkPolicy"]


# --- point 13: the uninstall hooks ----------------------------------------------------------------


def _hooks(rendered: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The pre-delete hooks in the order Helm runs them: by weight, then by name."""
    hooks = [
        d
        for docs in rendered.values()
        for d in docs
        if d and "pre-delete" in (d["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
    ]
    return sorted(
        hooks,
        key=lambda d: (
            int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")),
            d["metadata"]["name"],
        ),
    )


@needs_helm
def test_the_operators_removal_hook_runs_before_the_dra_cleanup(tmp_path: Any) -> None:
    """The DRA cleanup deletes the driver's ResourceSlices; run while the operator's DRA
    DaemonSet still runs, the driver publishes them again and they are left behind."""
    order = [d["metadata"]["name"] for d in _hooks(_rendered(tmp_path))]
    assert len(order) == 2, order
    assert order[0].endswith("-operator-remove") and order[1].endswith("-dra-cleanup"), order


@needs_helm
def test_the_removal_hook_ends_inside_helms_default_wait(tmp_path: Any) -> None:
    """Helm waits for a hook only `helm uninstall --timeout` (5 minutes by default): a Job that
    may run longer is reported by Helm as a timeout, not by the hook naming what is left."""
    [hook] = [h for h in _hooks(_rendered(tmp_path)) if h["metadata"]["name"].endswith("remove")]
    spec = hook["spec"]
    wait = next(
        float(a.partition("=")[2])
        for a in spec["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--timeout=")
    )
    assert wait < spec["activeDeadlineSeconds"] <= HELM_DEFAULT_TIMEOUT, (wait, spec)


# --- issue 48 point 6: the plugin's NetworkPolicy admits the scraper by namespace -----------------


def _plugin_policy(scraper_namespace: str) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "u-1"},
        "spec": {"devicePlugin": {}},
    }
    made = components.desired(
        resource, rs.parse(resource["spec"]), scraper_namespace=scraper_namespace
    )
    return dict(made[components.PLUGIN_POLICY_KEY]["spec"])


def test_the_plugins_policy_admits_prometheus_of_the_named_namespace_only() -> None:
    """A pod in any namespace could label itself Prometheus and read the plugin's metrics (the
    holders' names); the namespace is now matched by the label the API server sets to its name,
    which no tenant can put on a namespace of another name."""
    spec = _plugin_policy("monitoring")
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"port": components.METRICS_PORT, "protocol": "TCP"}]
    for peer in rule["from"]:
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
        }, peer


def test_the_plugins_policy_admits_nothing_until_the_namespace_is_set() -> None:
    # No rule at all: an ingress rule without "from" would admit every source.
    spec = _plugin_policy("")
    assert spec["policyTypes"] == ["Ingress"] and spec["ingress"] == []


def _schema_has_scraper_namespace() -> bool:
    with open(os.path.join(CHART_DIR, "values.schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)
    policy = schema["properties"]["metrics"]["properties"]["networkPolicy"]["properties"]
    return "scraperNamespace" in policy


@needs_helm
def test_the_operator_gets_no_scraper_namespace_by_default(tmp_path: Any) -> None:
    docs = _docs(_rendered(tmp_path))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scraper-namespace=" in args


@needs_helm
@pytest.mark.skipif(
    not _schema_has_scraper_namespace(),
    reason="metrics.networkPolicy.scraperNamespace is issue 48's chart value (branch h48b)",
)
def test_the_chart_passes_its_scraper_namespace_to_the_operator(tmp_path: Any) -> None:
    """One value for both: the chart's plugin policy and the operator's admit the same
    namespace."""
    values = {
        "namespaceOverride": RELEASE_NS,
        "operator": {"enabled": True},
        "metrics": {"networkPolicy": {"enabled": True, "scraperNamespace": "monitoring"}},
    }
    docs = _docs(helm_render.render(str(tmp_path), values))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = main._parser().parse_args([a.replace("$(POD_IP)", "10.0.0.1") for a in args])
    assert parsed.scraper_namespace == "monitoring"
