"""The static manifests under deploy/yaml: schema-valid, secure, consistent with each other."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from kubernetes_validate import utils as kv

from tests.deploy.helpers import PLUGIN_IMAGE, TOOLKIT_IMAGE, YAML_DIR, load_one, manifest_files

OLDEST = "1.25.0"
NEWEST = kv.latest_version()
EXTENSIONS_MANIFEST = "extensions-v1beta1-enflame-device-plugin.yaml"
PLUGIN_MANIFESTS = [
    "enflame-device-plugin.yaml",
    "enflame-device-plugin-compat-with-cpumanager.yaml",
    "enflame-vdevice-plugin.yaml",
    "enflame-device-plugin-pcie-switch-affinity.yaml",
    EXTENSIONS_MANIFEST,
]
PRIVILEGED_MANIFESTS = {
    "enflame-device-plugin-compat-with-cpumanager.yaml",
    "enflame-container-toolkit.yaml",
}
EXPECTED_FILES = {
    *PLUGIN_MANIFESTS,
    "enflame-container-toolkit.yaml",
    "examples/namespace.yaml",
    "examples/pod-gcu-example.yaml",
    "examples/pod-vgcu-example.yaml",
    "examples/pod-shared-gcu-example.yaml",
    "enflame-runtimeclass.yaml",
    "enflame-device-plugin-networkpolicy.yaml",
    "examples/pod-gcu-runtimeclass-example.yaml",
    "enflame-gcu-nodefeaturerule.yaml",
}
# Not a built-in API: tests/deploy/test_nfd_node_selection.py checks it.
CRD_MANIFESTS = {"enflame-gcu-nodefeaturerule.yaml"}
PLUGIN_HOST_PATHS = {
    # volume name: (host path, mount path, read-only)
    "device-plugin": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins", False),
    "host-sys": ("/sys", "/host/sys", True),
    "host-dev": ("/dev", "/host/dev", True),
    # the node mode the installer recorded (node_modes.MODE_FILE)
    "node-mode": ("/etc/enflame-gcu", "/host/etc/enflame-gcu", True),
    # the plugin's own records (drs-gcu's DRS instances), where no kubelet cleans
    "plugin-state": ("/var/lib/enflame-gcu", "/host/var/lib/enflame-gcu", False),
}
# Observability: the PodResources socket (metrics name the holding pod) and NFD's features.d
# (node labels kept current).
OBSERVE_HOST_PATHS = {
    "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources", True),
    "nfd-features": (
        "/etc/kubernetes/node-feature-discovery/features.d",
        "/host/nfd",
        False,
    ),
}


def manifest(name: str) -> dict[str, Any]:
    return load_one(os.path.join(YAML_DIR, name))


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]
    return spec["template"]["spec"] if "template" in spec else spec


def only_container(doc: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def host_paths(doc: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    spec = pod_spec(doc)
    mounts = {m["name"]: m for m in only_container(doc).get("volumeMounts", [])}
    result = {}
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            mount = mounts[volume["name"]]
            result[volume["name"]] = (
                volume["hostPath"]["path"],
                mount["mountPath"],
                bool(mount.get("readOnly", False)),
            )
    return result


def test_the_vendor_file_set_is_complete() -> None:
    assert set(manifest_files()) == EXPECTED_FILES


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("name", sorted(EXPECTED_FILES - {EXTENSIONS_MANIFEST} - CRD_MANIFESTS))
def test_manifest_validates_strictly(name: str, version: str) -> None:
    doc = manifest(name)
    # Raises ValidationError (with the offending path) on any unknown or mistyped field.
    kv.validate(doc, version, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    """Guards the test above: strict mode must reject fields the schema does not know."""
    doc = manifest("enflame-device-plugin.yaml")
    only_container(doc)["securityContext"]["privilegd"] = False
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, OLDEST, strict=True)


def test_validator_ships_schemas_from_oldest_to_newest() -> None:
    versions = kv.all_versions()
    assert versions[0] == OLDEST
    assert versions[-1] == NEWEST


@pytest.mark.parametrize("name", sorted(EXPECTED_FILES))
def test_privileged_only_where_it_must_be(name: str) -> None:
    doc = manifest(name)
    has_pods = doc["kind"] not in ("Namespace", "RuntimeClass")
    for container in pod_spec(doc).get("containers", []) if has_pods else []:
        context = container.get("securityContext", {})
        if name in PRIVILEGED_MANIFESTS:
            assert context.get("privileged") is True
        elif doc["kind"] == "DaemonSet":
            assert context["privileged"] is False
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True
        else:
            assert not context.get("privileged", False)


@pytest.mark.parametrize("name", PLUGIN_MANIFESTS)
def test_plugin_host_paths_are_exactly_the_needed_ones(name: str) -> None:
    doc = manifest(name)
    assert host_paths(doc) == {**PLUGIN_HOST_PATHS, **OBSERVE_HOST_PATHS}
    assert "--host-root=/host" in only_container(doc)["args"]
    spec = pod_spec(doc)
    assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", [*PLUGIN_MANIFESTS, "enflame-container-toolkit.yaml"])
def test_daemonsets_run_only_on_gcu_nodes_as_critical_addons(name: str) -> None:
    doc = manifest(name)
    assert doc["kind"] == "DaemonSet"
    assert doc["metadata"]["namespace"] == "kube-system"
    spec = pod_spec(doc)
    assert spec["priorityClassName"] == "system-node-critical"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    labels = [
        "feature.node.kubernetes.io/pci-1200_1e36.present",  # NFD's stock class_vendor form
        "feature.node.kubernetes.io/pci-1e36.present",  # deviceLabelFields: [vendor]
        "enflame.com/gcu.present",  # the NodeFeatureRule's, or set by hand
    ]
    # The device plugin never runs where the DRA driver serves GCUs (the toolkit runs on both).
    not_dra = [{"key": "enflame.com/gcu.mode", "operator": "NotIn", "values": ["dra"]}]
    assert terms == [
        {
            "matchExpressions": [
                {"key": key, "operator": "In", "values": ["true"]},
                *(not_dra if name in PLUGIN_MANIFESTS else []),
            ]
        }
        for key in labels
    ]
    keys = {t["key"] for t in spec["tolerations"]}
    assert {"CriticalAddonsOnly", "enflame.com/gcu"} <= keys
    selector = doc["spec"]["selector"]["matchLabels"]
    assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()


def test_every_image_is_the_projects_at_one_tag() -> None:
    tags = set()
    for name in PLUGIN_MANIFESTS:
        repository, tag = only_container(manifest(name))["image"].rsplit(":", 1)
        assert repository == PLUGIN_IMAGE
        tags.add(tag)
    toolkit = only_container(manifest("enflame-container-toolkit.yaml"))
    repository, tag = toolkit["image"].rsplit(":", 1)
    assert repository == TOOLKIT_IMAGE
    tags.add(tag)
    assert len(tags) == 1


def test_variants_differ_from_the_base_only_as_intended() -> None:
    base = manifest("enflame-device-plugin.yaml")

    compat = manifest("enflame-device-plugin-compat-with-cpumanager.yaml")
    expected = copy.deepcopy(base)
    container = only_container(expected)
    container["args"].append("--pass-device-specs")
    container["securityContext"] = {
        "privileged": True,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
    }
    assert compat == expected

    assert manifest("enflame-device-plugin-pcie-switch-affinity.yaml") == base

    vgcu = manifest("enflame-vdevice-plugin.yaml")
    args = only_container(vgcu)["args"]
    assert "--resources=vgcu" in args
    assert not any(a.startswith("--resource-name") for a in args)
    assert vgcu["metadata"]["name"] != base["metadata"]["name"]
    assert pod_spec(vgcu)["securityContext"] == pod_spec(base)["securityContext"]
    assert only_container(vgcu)["securityContext"] == only_container(base)["securityContext"]


def test_pcie_switch_affinity_file_explains_why_it_needs_no_rbac() -> None:
    name = "enflame-device-plugin-pcie-switch-affinity.yaml"
    with open(os.path.join(YAML_DIR, name), encoding="utf-8") as handle:
        text = handle.read()
    assert "No ServiceAccount, ClusterRole or binding" in text
    assert manifest(name)["kind"] == "DaemonSet"  # load_one: the file holds this one object only
    assert pod_spec(manifest(name))["automountServiceAccountToken"] is False


def test_toolkit_installer_has_what_undoing_needs() -> None:
    doc = manifest("enflame-container-toolkit.yaml")
    spec = pod_spec(doc)
    container = only_container(doc)
    assert container["command"][:5] == ["enflame-ctk", "install", "--host-root", "/host", "--wait"]
    assert "--restart-engine" in container["command"]
    mode = container["command"].index("--mode")
    assert container["command"][mode + 1] == "auto"
    assert "--set-as-default" not in container["command"]
    assert host_paths(doc) == {"host-root": ("/", "/host", False)}
    assert spec["hostPID"] is True
    assert spec["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize(
    ("name", "resource", "count"),
    [
        ("examples/pod-gcu-example.yaml", "enflame.com/gcu", 1),
        ("examples/pod-vgcu-example.yaml", "enflame.com/vgcu", 1),
        ("examples/pod-shared-gcu-example.yaml", "enflame.com/shared-gcu", 2),
        ("examples/pod-gcu-runtimeclass-example.yaml", "enflame.com/gcu", 1),
    ],
)
def test_example_pods_request_their_resource_in_the_enflame_namespace(
    name: str, resource: str, count: int
) -> None:
    doc = manifest(name)
    assert doc["metadata"]["namespace"] == manifest("examples/namespace.yaml")["metadata"]["name"]
    assert doc["metadata"]["namespace"] == "enflame"
    container = only_container(doc)
    assert container["resources"]["limits"] == {resource: count}
    assert "ls " in " ".join(container["command"])
    # Their shell ignores SIGTERM as PID 1: a short grace period, or every delete waits 30 s.
    assert doc["spec"]["terminationGracePeriodSeconds"] <= 5


# --- Kubernetes < 1.16: extensions/v1beta1 ----------------------------------------------------
#
# kubernetes-validate ships no schemas before 1.25, and extensions/v1beta1 DaemonSets were removed
# in 1.16, so this manifest is checked structurally instead:
#   1. its pod template equals the apps/v1 manifest's, after removing the fields added after 1.15
#      (POST_115_FIELDS) and adding their pre-1.19 replacement (the seccomp annotation);
#   2. every key in it belongs to the 1.15 field set of its object type (FIELDS_115, transcribed
#      from the Kubernetes 1.15 API reference for exactly the object types this manifest uses),
#      so a field that a 1.15 apiserver would reject cannot slip in.

POST_115_FIELDS = [("spec", "template", "spec", "securityContext")]  # seccompProfile: 1.19
SECCOMP_ANNOTATION = {"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"}


def _fields(names: str) -> set[str]:
    """A field set written as whitespace-separated names."""
    return set(names.split())


OBJECT_META = {"name", "namespace", "labels", "annotations"}
FIELDS_115: dict[str, set[str]] = {
    "DaemonSet": _fields("apiVersion kind metadata spec"),
    "DaemonSetSpec": _fields(
        """
        minReadySeconds revisionHistoryLimit selector template templateGeneration
        updateStrategy
        """
    ),
    "LabelSelector": _fields("matchLabels matchExpressions"),
    "DaemonSetUpdateStrategy": _fields("type rollingUpdate"),
    "PodTemplateSpec": _fields("metadata spec"),
    "PodSpec": _fields(
        """
        activeDeadlineSeconds affinity automountServiceAccountToken containers
        dnsConfig dnsPolicy enableServiceLinks hostAliases hostIPC hostNetwork hostPID
        hostname imagePullSecrets initContainers nodeName nodeSelector
        preemptionPolicy priority priorityClassName readinessGates restartPolicy
        runtimeClassName schedulerName securityContext serviceAccount
        serviceAccountName shareProcessNamespace subdomain
        terminationGracePeriodSeconds tolerations volumes
        """
    ),
    "PodSecurityContext": _fields(
        """
        fsGroup runAsGroup runAsNonRoot runAsUser seLinuxOptions supplementalGroups
        sysctls
        """
    ),
    "Affinity": _fields("nodeAffinity podAffinity podAntiAffinity"),
    "NodeAffinity": _fields(
        """
        requiredDuringSchedulingIgnoredDuringExecution
        preferredDuringSchedulingIgnoredDuringExecution
        """
    ),
    "NodeSelector": _fields("nodeSelectorTerms"),
    "NodeSelectorTerm": _fields("matchExpressions matchFields"),
    "NodeSelectorRequirement": _fields("key operator values"),
    "Toleration": _fields("effect key operator tolerationSeconds value"),
    "Container": _fields(
        """
        args command env envFrom image imagePullPolicy lifecycle livenessProbe name
        ports readinessProbe resources securityContext stdin stdinOnce
        terminationMessagePath terminationMessagePolicy tty volumeDevices volumeMounts
        workingDir
        """
    ),
    "EnvVar": _fields("name value valueFrom"),
    "SecurityContext": _fields(
        """
        allowPrivilegeEscalation capabilities privileged procMount
        readOnlyRootFilesystem runAsGroup runAsNonRoot runAsUser seLinuxOptions
        windowsOptions
        """
    ),
    "Capabilities": _fields("add drop"),
    "ResourceRequirements": _fields("limits requests"),
    "VolumeMount": _fields(
        """
        mountPath mountPropagation name readOnly subPath subPathExpr
        """
    ),
    "Volume": _fields("name hostPath configMap emptyDir secret projected"),
    "HostPathVolumeSource": _fields("path type"),
}
# Where each object type sits: key -> type of the value (lists hold items of that type).
CHILD_TYPES: dict[str, dict[str, str]] = {
    "DaemonSet": {"spec": "DaemonSetSpec"},
    "DaemonSetSpec": {
        "selector": "LabelSelector",
        "template": "PodTemplateSpec",
        "updateStrategy": "DaemonSetUpdateStrategy",
    },
    "PodTemplateSpec": {"spec": "PodSpec"},
    "PodSpec": {
        "securityContext": "PodSecurityContext",
        "affinity": "Affinity",
        "tolerations": "Toleration",
        "containers": "Container",
        "volumes": "Volume",
    },
    "Affinity": {"nodeAffinity": "NodeAffinity"},
    "NodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "NodeSelector"},
    "NodeSelector": {"nodeSelectorTerms": "NodeSelectorTerm"},
    "NodeSelectorTerm": {"matchExpressions": "NodeSelectorRequirement"},
    "Container": {
        "env": "EnvVar",
        "securityContext": "SecurityContext",
        "resources": "ResourceRequirements",
        "volumeMounts": "VolumeMount",
    },
    "SecurityContext": {"capabilities": "Capabilities"},
    "Volume": {"hostPath": "HostPathVolumeSource"},
}


def fields_outside_115(value: Any, kind: str, path: str) -> list[str]:
    """Every key under ``value`` (an object of type ``kind``) that Kubernetes 1.15 lacks."""
    items = value if isinstance(value, list) else [value]
    bad = []
    for index, item in enumerate(items):
        where = f"{path}[{index}]" if isinstance(value, list) else path
        if not isinstance(item, dict):
            bad.append(f"{where}: expected an object of type {kind}")
            continue
        for key, child in item.items():
            if key == "metadata":
                bad += [f"{where}.metadata.{k}" for k in child if k not in OBJECT_META]
            elif key not in FIELDS_115[kind]:
                bad.append(f"{where}.{key}")
            elif key in CHILD_TYPES.get(kind, {}):
                bad += fields_outside_115(child, CHILD_TYPES[kind][key], f"{where}.{key}")
    return bad


def test_extensions_v1beta1_manifest_is_the_apps_v1_one_for_old_clusters() -> None:
    old = manifest(EXTENSIONS_MANIFEST)
    new = manifest("enflame-device-plugin.yaml")
    assert old["apiVersion"] == "extensions/v1beta1"
    assert old["kind"] == "DaemonSet"

    expected = copy.deepcopy(new)
    expected["apiVersion"] = "extensions/v1beta1"
    for path in POST_115_FIELDS:
        parent = expected
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    expected["spec"]["template"]["metadata"]["annotations"] = SECCOMP_ANNOTATION
    assert old == expected


def test_extensions_v1beta1_manifest_uses_only_fields_kubernetes_115_knows() -> None:
    assert fields_outside_115(manifest(EXTENSIONS_MANIFEST), "DaemonSet", "") == []


def test_the_115_field_check_rejects_newer_fields() -> None:
    """Guards the check above: the apps/v1 manifest's seccompProfile (1.19) must be flagged."""
    bad = fields_outside_115(manifest("enflame-device-plugin.yaml"), "DaemonSet", "")
    assert bad == [".spec.template.spec.securityContext.seccompProfile"]
