"""The objects each component is made of, as the API wants them (plain dicts).

The DaemonSets carry the same containers as ``deploy/yaml`` (tests compare them); what differs
is placement and updates: each selects the nodes the operator labelled
``enflame.com/gcu.deploy.<component>=true`` (so the toolkit's readiness can gate the plugin per
node) and uses ``updateStrategy: OnDelete`` (so the operator, not the DaemonSet controller,
decides which node is upgraded when).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from enflame_gcu.gcu_operator import names
from enflame_gcu.gcu_operator import resource as rs

Obj = dict[str, Any]
METRICS_PORT = 9402
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MAX = 63
# The RuntimeClass of node mode runtimeclass (deploy/yaml/enflame-runtimeclass.yaml: the same
# name and handler), and the DRA DeviceClass a validator's claim asks a whole GCU of.
RUNTIME_CLASS = "enflame"
DRA_DEVICE_CLASS = "gcu.enflame.com"
# Keys of desired() that are not components: objects the validator (and the workloads) need.
RUNTIME_CLASS_KEY = "runtimeClass"
VALIDATOR_CLAIM_KEY = "validatorClaim"
PLUGIN_POLICY_KEY = "devicePluginNetworkPolicy"
# The device plugin's account for node state, and the RBAC that lets it write its Lease (in its
# namespace: a Role) and patch its Node (the gcushare annotation: a ClusterRole).
PLUGIN_ACCOUNT_KEY = "devicePluginServiceAccount"
PLUGIN_LEASE_ROLE_KEY = "devicePluginNodeStateLeaseRole"
PLUGIN_LEASE_BINDING_KEY = "devicePluginNodeStateLeaseBinding"
PLUGIN_ROLE_KEY = "devicePluginNodeStateRole"
PLUGIN_BINDING_KEY = "devicePluginNodeStateBinding"
PLUGIN_RBAC_KEYS = (
    PLUGIN_ACCOUNT_KEY,
    PLUGIN_LEASE_ROLE_KEY,
    PLUGIN_LEASE_BINDING_KEY,
    PLUGIN_ROLE_KEY,
    PLUGIN_BINDING_KEY,
)
# The chart's rbac-node-state.yaml Role: the node-state Leases of the plugin's namespace (RBAC
# cannot name them before they exist; the chart's admission policy keeps each to its node).
PLUGIN_LEASE_RULES = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "patch", "delete"],
    }
]
EXTRA_KEYS = (RUNTIME_CLASS_KEY, VALIDATOR_CLAIM_KEY, PLUGIN_POLICY_KEY, *PLUGIN_RBAC_KEYS)
# On a component's DaemonSet: the pod template it held before its last change (JSON), and on
# the pods the operator makes from it: a node whose new pod failed runs that version again.
PREVIOUS_TEMPLATE = "enflame.com/gcu.previous-template"
FALLBACK_LABEL = "enflame.com/gcu.fallback"
# The node label value that keeps a component's DaemonSet off a node running its fallback pod
# (the DaemonSet selects "true").
FALLBACK_DEPLOY = "previous"
# The label the API server (1.21+) sets on every Namespace to its name; a tenant cannot set it
# on a namespace of another name, as it can label its own pods "prometheus".
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def scraper_peers(namespace: str) -> list[Obj]:
    """Who may reach the device plugin's metrics port: Prometheus pods in ``namespace`` only
    (issue 48: a pod anywhere could label itself Prometheus)."""
    return [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]


TOLERATIONS = [
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"key": "enflame.com/gcu", "operator": "Exists", "effect": "NoSchedule"},
]
# A validator pod on a DRA node goes through the scheduler, which keeps pods off a cordoned node
# unless they tolerate its taint: a drain rollout cordons the node it validates.
CORDON_TOLERATION = {
    "key": "node.kubernetes.io/unschedulable",
    "operator": "Exists",
    "effect": "NoSchedule",
}
# Checks what a GCU container must see: the cards the plugin granted, as device nodes.
VALIDATOR_SCRIPT = """set -eu
test -n "${ENFLAME_VISIBLE_DEVICES:-}" || { echo "ENFLAME_VISIBLE_DEVICES is not set"; exit 1; }
test -c /dev/gcuctl || { echo "/dev/gcuctl is missing"; exit 1; }
for i in $(echo "$ENFLAME_VISIBLE_DEVICES" | tr , ' '); do
  test -c "/dev/gcu$i" || { echo "/dev/gcu$i is missing"; exit 1; }
done
echo "ok: ENFLAME_VISIBLE_DEVICES=$ENFLAME_VISIBLE_DEVICES"
"""


def owner_reference(resource: Mapping[str, Any]) -> Obj:
    """The owner reference every object we create carries (the GcuResource is the controller)."""
    meta = resource["metadata"]
    return {
        "apiVersion": resource["apiVersion"],
        "kind": rs.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(resource: Mapping[str, Any], key: str, app: str) -> dict[str, str]:
    """Labels of a component's objects and pods."""
    return {
        names.APP_NAME: app,
        names.PART_OF: "enflame-gcu",
        names.MANAGED_BY: names.OPERATOR,
        names.RESOURCE_LABEL: str(resource["metadata"]["uid"]),
        names.COMPONENT_LABEL: key,
    }


def template_hash(template: Mapping[str, Any]) -> str:
    """A short digest of a pod template: pods carrying another one are outdated."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _env(component: rs.Component, base: list[Obj]) -> list[Obj]:
    return base + [{"name": k, "value": v} for k, v in component.env]


def _toolkit_container(component: rs.Component, spec: rs.ResourceSpec) -> Obj:
    return {
        "name": "enflame-container-toolkit",
        "image": component.image,
        "imagePullPolicy": component.pull_policy,
        "command": [
            "enflame-ctk",
            "install",
            "--host-root",
            "/host",
            "--wait",
            "--mode",
            spec.node_mode,
            "--restart-engine",
            "--ready-file",
            "/run/enflame/ready",
            *component.args,
        ],
        **({"env": _env(component, [])} if component.env else {}),
        "readinessProbe": {
            "exec": {"command": ["test", "-f", "/run/enflame/ready"]},
            "initialDelaySeconds": 2,
            "periodSeconds": 5,
        },
        "securityContext": {"privileged": True},
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": "host-root", "mountPath": "/host"}],
    }


def _unprivileged_daemon() -> Obj:
    """The security context and resources the chart gives the device plugin and the DRA driver
    (a fresh copy each time: the objects are edited and compared later)."""
    return {
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }


def _plugin_container(component: rs.Component, spec: rs.ResourceSpec) -> Obj:
    """The device plugin's container as the chart's daemonset-device-plugin.yaml renders it with
    the extender on (node state) and metrics.telemetry as spec.devicePlugin.telemetry says
    (tests/gcu_operator/test_manifests.py compares the two)."""
    options = spec.plugin
    telemetry = options.telemetry
    args = [
        "--host-root=/host",
        "--resource-name=enflame.com/gcu",
        f"--node-mode={spec.node_mode}",
        "--health-interval=5",
        f"--http-address=:{METRICS_PORT}",
    ]
    if telemetry is not None:
        args += [
            f"--telemetry-interval={telemetry.interval}",
            f"--telemetry-timeout={telemetry.timeout}",
        ]
        if telemetry.isolation == "process":
            args.append("--telemetry-isolation=process")
    else:
        # Off unless asked for: the plugin's own default would look for libefml.
        args.append("--telemetry-interval=0")
    mounts = [
        {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True},
        {"name": "host-dev", "mountPath": "/host/dev", "readOnly": True},
        {"name": "node-mode", "mountPath": "/host/etc/enflame-gcu", "readOnly": True},
        # The plugin's own records (drs-gcu's DRS instances), where no kubelet cleans.
        {"name": "plugin-state", "mountPath": "/host/var/lib/enflame-gcu"},
        {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True},
    ]
    if spec.wants(rs.GFD):
        # The vendor's GFD becomes our labels: the plugin keeps NFD's feature file current.
        args.append("--feature-file=/host/nfd/enflame-gcu")
        mounts.append({"name": "nfd-features", "mountPath": "/host/nfd"})
    if options.node_state:
        # The scheduler extender reads the node state this keeps current on its node's Lease
        # in the plugin's namespace.
        args.append("--node-state")
    if telemetry is not None:
        mounts.append(
            {"name": "host-libefml", "mountPath": f"/host{telemetry.library_dir}", "readOnly": True}
        )
        if telemetry.efsmi_dir:
            # libefml.so is often a link into the vendor's install (gcu-exporter mounts both).
            mounts.append(
                {"name": "host-efsmi", "mountPath": f"/host{telemetry.efsmi_dir}", "readOnly": True}
            )
    # The plugin reads /dev through /host/dev and never opens a card, unless libefml does.
    env: list[Obj] = [
        {"name": "ENFLAME_VISIBLE_DEVICES", "value": "void" if telemetry is None else "all"}
    ]
    if options.node_state or telemetry is not None:
        # The node-state Lease's name, telemetry's Hostname label.
        env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    return {
        "name": "enflame-device-plugin",
        "image": component.image,
        "imagePullPolicy": component.pull_policy,
        "args": args + list(component.args),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "env": _env(component, env),
        **_unprivileged_daemon(),
        "volumeMounts": mounts,
    }


def _host_path(name: str, path: str, kind: str) -> Obj:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _plugin_volumes(spec: rs.ResourceSpec) -> list[Obj]:
    volumes = [
        _host_path("device-plugin", "/var/lib/kubelet/device-plugins", "Directory"),
        _host_path("host-sys", "/sys", "Directory"),
        _host_path("host-dev", "/dev", "Directory"),
        _host_path("node-mode", "/etc/enflame-gcu", "DirectoryOrCreate"),
        _host_path("plugin-state", "/var/lib/enflame-gcu", "DirectoryOrCreate"),
        _host_path("pod-resources", "/var/lib/kubelet/pod-resources", "DirectoryOrCreate"),
    ]
    if spec.wants(rs.GFD):
        volumes.append(
            _host_path(
                "nfd-features",
                "/etc/kubernetes/node-feature-discovery/features.d",
                "DirectoryOrCreate",
            )
        )
    telemetry = spec.plugin.telemetry
    if telemetry is not None:
        volumes.append(_host_path("host-libefml", telemetry.library_dir, "Directory"))
        if telemetry.efsmi_dir:
            volumes.append(_host_path("host-efsmi", telemetry.efsmi_dir, "DirectoryOrCreate"))
    return volumes


def plugin_account(resource: Mapping[str, Any], plugin: rs.Component) -> Obj:
    """The device plugin's ServiceAccount (node state: its Lease, and its Node's gcushare
    annotation)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": plugin.name,
            "namespace": plugin.namespace,
            "labels": labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin"),
            "ownerReferences": [owner_reference(resource)],
        },
    }


def plugin_role_name(plugin: rs.Component) -> str:
    """The Role, ClusterRole and their bindings of the plugin's node state (the chart's
    suffix)."""
    return f"{plugin.name}-node-state"


def plugin_lease_role(resource: Mapping[str, Any], plugin: rs.Component) -> Obj:
    """The chart's rbac-node-state.yaml Role: create, get, patch and delete Leases in the
    plugin's namespace (its node's node-state Lease), nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": plugin_role_name(plugin),
            "namespace": plugin.namespace,
            "labels": labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin"),
            "ownerReferences": [owner_reference(resource)],
        },
        "rules": json.loads(json.dumps(PLUGIN_LEASE_RULES)),
    }


def plugin_lease_role_binding(resource: Mapping[str, Any], plugin: rs.Component) -> Obj:
    """Binds plugin_lease_role to plugin_account, in the plugin's namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": plugin_role_name(plugin),
            "namespace": plugin.namespace,
            "labels": labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin"),
            "ownerReferences": [owner_reference(resource)],
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": plugin_role_name(plugin),
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": plugin.name, "namespace": plugin.namespace}
        ],
    }


def plugin_role(resource: Mapping[str, Any], plugin: rs.Component) -> Obj:
    """The chart's rbac-node-state.yaml ClusterRole: get and patch Nodes (its own, for the
    gcushare annotation), nothing else (never nodes/status)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": plugin_role_name(plugin),
            "labels": labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin"),
            "ownerReferences": [owner_reference(resource)],
        },
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
    }


def plugin_role_binding(resource: Mapping[str, Any], plugin: rs.Component) -> Obj:
    """Binds plugin_role to plugin_account."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": plugin_role_name(plugin),
            "labels": labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin"),
            "ownerReferences": [owner_reference(resource)],
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": plugin_role_name(plugin),
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": plugin.name, "namespace": plugin.namespace}
        ],
    }


# The DRA driver's port for /healthz, /readyz and /metrics (the chart's dra.httpPort).
DRA_HTTP_PORT = 8082
# The chart's name for the driver's ServiceAccount is <release>-dra-plugin; the chart passes
# it (--dra-service-account); deploy/dra/ names it so.
DRA_SERVICE_ACCOUNT = "enflame-dra-plugin"


def _dra_container(component: rs.Component, spec: rs.ResourceSpec) -> Obj:
    """The DRA driver's container as the chart's daemonset-dra-plugin.yaml renders it with its
    default values and dra.drs / dra.efsmi as spec.dra says (tests/gcu_operator/test_manifests.py
    compares the two)."""
    partitions = spec.dra.drs
    # DRS partitions: efsmi (from the host's /usr/local/efsmi) creates and destroys instances,
    # and it opens the cards, so the container then runs privileged, as the chart's does.
    drs_args = [f"--drs={partitions}", f"--efsmi={spec.dra.efsmi}"] if partitions else []
    daemon = _unprivileged_daemon()
    if partitions:
        daemon["securityContext"]["privileged"] = True
    drs_mounts = (
        [{"name": "efsmi", "mountPath": "/usr/local/efsmi", "readOnly": True}] if partitions else []
    )
    return {
        "name": "enflame-dra-plugin",
        "image": component.image,
        "imagePullPolicy": component.pull_policy,
        "command": ["enflame-dra-plugin"],
        "args": [
            "--host-root=/host",
            "--cdi-dir=/var/run/cdi",
            "--shared-slices=0",
            "--unhealthy=taint",
            "--health-interval=5",
            # The pod's own address only, as the chart binds it (never every address).
            f"--http-address=$(POD_IP):{DRA_HTTP_PORT}",
            *drs_args,
            *component.args,
        ],
        "ports": [{"name": "http", "containerPort": DRA_HTTP_PORT}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "env": _env(
            component,
            [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "ENFLAME_VISIBLE_DEVICES", "value": "void"},
            ],
        ),
        **daemon,
        "volumeMounts": [
            {"name": "plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
            {"name": "plugin-data", "mountPath": "/var/lib/kubelet/plugins/gcu.enflame.com"},
            {"name": "cdi", "mountPath": "/var/run/cdi"},
            {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True},
            {"name": "host-dev", "mountPath": "/host/dev", "readOnly": True},
            # PodResources: cards device-plugin pods still hold are not offered to DRA.
            {
                "name": "pod-resources",
                "mountPath": "/var/lib/kubelet/pod-resources",
                "readOnly": True,
            },
            *drs_mounts,
        ],
    }


def _dra_volumes(spec: rs.ResourceSpec) -> list[Obj]:
    return [
        _host_path("plugins-registry", "/var/lib/kubelet/plugins_registry", "Directory"),
        _host_path("plugin-data", "/var/lib/kubelet/plugins/gcu.enflame.com", "DirectoryOrCreate"),
        _host_path("cdi", "/var/run/cdi", "DirectoryOrCreate"),
        _host_path("host-sys", "/sys", "Directory"),
        _host_path("host-dev", "/dev", "Directory"),
        _host_path("pod-resources", "/var/lib/kubelet/pod-resources", "DirectoryOrCreate"),
        *([_host_path("efsmi", "/usr/local/efsmi", "Directory")] if spec.dra.drs else []),
    ]


def _daemonset(
    resource: Mapping[str, Any],
    component: rs.Component,
    app: str,
    pod_spec: Obj,
) -> Obj:
    own = labels(resource, component.key, app)
    selector = {names.APP_NAME: app, names.RESOURCE_LABEL: own[names.RESOURCE_LABEL]}
    # The user's selector narrows where the component runs; the operator's own deploy label
    # comes last, so no user key can replace it (rs.parse drops such keys and reports them).
    node_selector = {
        **dict(component.node_selector),
        names.deploy_label(component.key): "true",
        # Only the nodes where this resource owns the component (the first to want it there).
        names.owner_label(component.key): str(resource["metadata"]["uid"]),
    }
    pod_spec = {
        "priorityClassName": "system-node-critical",
        "automountServiceAccountToken": False,
        "nodeSelector": node_selector,
        "tolerations": [*TOLERATIONS, *(dict(t) for t in component.tolerations)],
        **({"affinity": dict(component.affinity)} if component.affinity else {}),
        **pod_spec,
    }
    template: Obj = {"metadata": {"labels": own}, "spec": pod_spec}
    template["metadata"]["annotations"] = {names.TEMPLATE_HASH: template_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": component.name,
            "namespace": component.namespace,
            "labels": own,
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": {
            "selector": {"matchLabels": selector},
            # The operator rolls nodes itself: validated one batch at a time, stoppable.
            "updateStrategy": {"type": "OnDelete"},
            "template": template,
        },
    }


def _exporter_service(
    resource: Mapping[str, Any], component: rs.Component, plugin: rs.Component
) -> Obj:
    own = labels(resource, component.key, component.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": component.name,
            "namespace": plugin.namespace,
            "labels": own,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT),
            },
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": {
            "selector": {
                names.APP_NAME: "enflame-device-plugin",
                names.RESOURCE_LABEL: own[names.RESOURCE_LABEL],
            },
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def plugin_network_policy(
    resource: Mapping[str, Any], plugin: rs.Component, scraper_namespace: str = ""
) -> Obj:
    """The chart's NetworkPolicy for the device plugin's pods: only the metrics port, only from
    Prometheus in ``scraper_namespace``; none given, no rule, so nothing is admitted (the
    kubelet's probes come from the node, which a NetworkPolicy never blocks)."""
    rules = (
        [
            {
                "ports": [{"port": METRICS_PORT, "protocol": "TCP"}],
                "from": scraper_peers(scraper_namespace),
            }
        ]
        if scraper_namespace
        else []
    )
    own = labels(resource, rs.DEVICE_PLUGIN, "enflame-device-plugin")
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": plugin.name,
            "namespace": plugin.namespace,
            "labels": own,
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {
                    names.APP_NAME: "enflame-device-plugin",
                    names.RESOURCE_LABEL: own[names.RESOURCE_LABEL],
                }
            },
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def runtime_class(resource: Mapping[str, Any]) -> Obj:
    """RuntimeClass ``enflame`` (node mode runtimeclass: only pods naming it get GCUs)."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {
            "name": RUNTIME_CLASS,
            # Removed with the toolkit, which configures the runtime it names.
            "labels": labels(resource, rs.TOOLKIT, "enflame-runtimeclass"),
            "ownerReferences": [owner_reference(resource)],
        },
        "handler": RUNTIME_CLASS,
    }


def validator_claim(resource: Mapping[str, Any], component: rs.Component) -> Obj:
    """The ResourceClaimTemplate a validator pod on a DRA node takes one whole GCU through."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": component.name,
            "namespace": component.namespace,
            "labels": labels(resource, rs.VALIDATOR, component.name),
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gcu",
                            "exactly": {
                                "deviceClassName": DRA_DEVICE_CLASS,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ]
                }
            }
        },
    }


def desired(
    resource: Mapping[str, Any],
    spec: rs.ResourceSpec,
    dra_served: bool = False,
    dra_service_account: str = DRA_SERVICE_ACCOUNT,
    *,
    scraper_namespace: str = "",
) -> dict[str, Obj]:
    """Every object the resource's components consist of, by component key (and EXTRA_KEYS)."""
    out: dict[str, Obj] = {}
    comps = spec.components
    if rs.TOOLKIT in comps:
        out[rs.TOOLKIT] = _daemonset(
            resource,
            comps[rs.TOOLKIT],
            "enflame-container-toolkit",
            {
                "hostPID": True,
                "terminationGracePeriodSeconds": 120,
                "containers": [_toolkit_container(comps[rs.TOOLKIT], spec)],
                "volumes": [_host_path("host-root", "/", "Directory")],
            },
        )
    if rs.DEVICE_PLUGIN in comps:
        plugin = comps[rs.DEVICE_PLUGIN]
        account: Obj = {}
        if spec.plugin.node_state:
            # The chart's extender setup: the plugin's own account, allowed its Lease (a Role in
            # its namespace) and get/patch on Nodes.
            account = {"serviceAccountName": plugin.name, "automountServiceAccountToken": True}
            out[PLUGIN_ACCOUNT_KEY] = plugin_account(resource, plugin)
            out[PLUGIN_LEASE_ROLE_KEY] = plugin_lease_role(resource, plugin)
            out[PLUGIN_LEASE_BINDING_KEY] = plugin_lease_role_binding(resource, plugin)
            out[PLUGIN_ROLE_KEY] = plugin_role(resource, plugin)
            out[PLUGIN_BINDING_KEY] = plugin_role_binding(resource, plugin)
        out[rs.DEVICE_PLUGIN] = _daemonset(
            resource,
            plugin,
            "enflame-device-plugin",
            {
                **account,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [_plugin_container(comps[rs.DEVICE_PLUGIN], spec)],
                "volumes": _plugin_volumes(spec),
            },
        )
    if rs.DRA in comps:
        out[rs.DRA] = _daemonset(
            resource,
            comps[rs.DRA],
            "enflame-dra-plugin",
            {
                "serviceAccountName": dra_service_account,
                "automountServiceAccountToken": True,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [_dra_container(comps[rs.DRA], spec)],
                "volumes": _dra_volumes(spec),
            },
        )
    if rs.EXPORTER in comps:
        out[rs.EXPORTER] = _exporter_service(resource, comps[rs.EXPORTER], comps[rs.DEVICE_PLUGIN])
    if rs.DEVICE_PLUGIN in comps:
        out[PLUGIN_POLICY_KEY] = plugin_network_policy(
            resource, comps[rs.DEVICE_PLUGIN], scraper_namespace
        )
    if spec.node_mode == "runtimeclass" and rs.TOOLKIT in comps:
        out[RUNTIME_CLASS_KEY] = runtime_class(resource)
    if rs.VALIDATOR in comps and rs.DRA in comps and dra_served:
        out[VALIDATOR_CLAIM_KEY] = validator_claim(resource, comps[rs.VALIDATOR])
    return out


def validator_pod(
    resource: Mapping[str, Any],
    component: rs.Component,
    node: str,
    target: str,
    *,
    mode: str = "device-plugin",
    node_mode: str = "auto",
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> Obj:
    """A short pod on ``node`` that asks for one GCU and checks what it got.

    Device-plugin nodes: bound with ``nodeName``, one ``enflame.com/gcu`` asked as an extended
    resource. DRA nodes serve no such resource, and a claim is allocated only by the scheduler:
    the pod takes one GCU through the validator's ResourceClaimTemplate and is placed by node
    affinity. Node mode runtimeclass: only pods naming RuntimeClass ``enflame`` get GCUs.
    """
    container: Obj = {
        "name": "validator",
        "image": component.image,
        "imagePullPolicy": component.pull_policy,
        "command": ["sh", "-c", VALIDATOR_SCRIPT],
        "env": _env(component, []),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        # Its own, and the serving component's: it runs wherever that component does.
        "tolerations": [
            *TOLERATIONS,
            CORDON_TOLERATION,
            *(dict(t) for t in (*component.tolerations, *tolerations)),
        ],
    }
    if mode == "dra":
        container["resources"] = {"claims": [{"name": "gcu"}]}
        pod_spec["resourceClaims"] = [{"name": "gcu", "resourceClaimTemplateName": component.name}]
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
    else:
        container["resources"] = {"limits": {names.GCU_RESOURCE: "1"}}
        pod_spec["nodeName"] = node
    if node_mode == "runtimeclass":
        pod_spec["runtimeClassName"] = RUNTIME_CLASS
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": validator_name(component, node, target),
            "namespace": component.namespace,
            "labels": {
                **labels(resource, rs.VALIDATOR, component.name),
                **({names.VALIDATOR_NODE: node} if _label_value(node) else {}),
            },
            "annotations": {names.VALIDATES_ANNOTATION: target, names.VALIDATOR_NODE: node},
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": {**pod_spec, "containers": [container]},
    }


def _label_value(text: str) -> bool:
    return len(text) <= LABEL_VALUE_MAX and bool(LABEL_VALUE.match(text))


def validator_name(component: rs.Component, node: str, target: str) -> str:
    """The validator pod's name: one per node and per version of what it validates."""
    return f"{component.name}-{target[:8]}-{node}"[:253]


def previous_template(daemonset: Mapping[str, Any], current_hash: str) -> Obj | None:
    """The pod template ``daemonset`` held before it took the one of ``current_hash``: its own
    while it still differs (its replacement not yet written), else the one it recorded."""
    spec = daemonset.get("spec") or {}
    template = spec.get("template") or {}
    if _hash_of(template) not in ("", current_hash):
        return dict(template)
    text = ((daemonset.get("metadata") or {}).get("annotations") or {}).get(PREVIOUS_TEMPLATE)
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None  # not what we wrote: no previous version to go back to
    if not isinstance(found, dict) or _hash_of(found) in ("", current_hash):
        return None
    if not isinstance(found.get("spec"), dict) or not found["spec"].get("containers"):
        return None
    return found


def _hash_of(template: Mapping[str, Any]) -> str:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(names.TEMPLATE_HASH) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else ""


def is_fallback(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is one the operator made from a component's previous template."""
    return (pod.get("metadata", {}).get("labels") or {}).get(FALLBACK_LABEL) == "true"


def fallback_pod(
    resource: Mapping[str, Any],
    component: rs.Component,
    node: str,
    template: Mapping[str, Any],
    daemon_tolerations: Sequence[Mapping[str, Any]],
) -> Obj:
    """A pod of ``component``'s previous ``template`` bound to ``node``, as its DaemonSet made
    them (with the tolerations the DaemonSet controller adds), owned by the resource."""
    meta = template.get("metadata") or {}
    spec = json.loads(json.dumps(template["spec"]))
    # Bound by name: the node's deploy label now keeps the DaemonSet (and its selector) away.
    spec.pop("nodeSelector", None)
    spec.pop("affinity", None)
    spec["nodeName"] = node
    spec["tolerations"] = [*(spec.get("tolerations") or []), *(dict(t) for t in daemon_tolerations)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{component.name}-previous-{node}"[:253],
            "namespace": component.namespace,
            "labels": {**dict(meta.get("labels") or {}), FALLBACK_LABEL: "true"},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(resource)],
        },
        "spec": spec,
    }
