"""The Helm chart: a strict values schema, defaults equal to the manifests, helm lint/template."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import textwrap
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kv

from tests.conftest import PROJECT_ROOT
from tests.deploy.helpers import CHART_DIR, YAML_DIR, load_all, load_one

PLUGIN_DEFAULT_DIR = "/var/lib/kubelet/device-plugins"


def values() -> dict[str, Any]:
    return load_one(os.path.join(CHART_DIR, "values.yaml"))


def schema() -> dict[str, Any]:
    with open(os.path.join(CHART_DIR, "values.schema.json"), encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def chart() -> dict[str, Any]:
    return load_one(os.path.join(CHART_DIR, "Chart.yaml"))


def template(name: str) -> str:
    with open(os.path.join(CHART_DIR, "templates", name), encoding="utf-8") as handle:
        return handle.read()


def validator() -> jsonschema.protocols.Validator:
    checker = jsonschema.validators.validator_for(schema())
    checker.check_schema(schema())
    return checker(schema())


def test_default_values_satisfy_the_schema() -> None:
    validator().validate(values())


def _with(path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(values())
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    node[last] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("devicePlugin.deviceListStrategy", ["nvml"]),
        ("devicePlugin.deviceListStrategy", "envvar"),
        ("devicePlugin.healthInterval", "5"),
        ("nodeMode", "strict"),
        ("nodeMode", ""),
        ("runtimeClass.name", "Enflame"),
        ("runtimeClass.handler", "enflame"),
        ("toolkit.setAsDefault", True),
        ("devicePlugin.healthInterval", 0),
        ("devicePlugin.passDeviceSpecs", "yes"),
        ("devicePlugin.resourceName", "gcu"),
        ("devicePlugin.resourceName", "kubernetes.io/gcu"),
        ("devicePlugin.pluginDir", "var/lib/kubelet"),
        ("devicePlugin.unknownFlag", True),
        ("devicePlugin.logLevel", "verbose"),
        ("sharing.policy", "spread"),
        ("sharing.slicesPerCard", 0),
        ("sharing.cards", ["gcu0"]),
        ("sharing.extra", 1),
        ("toolkit.enabled", "true"),
        ("toolkit.terminationGracePeriodSeconds", 5),
        ("image.pullPolicy", "Sometimes"),
        ("image.registry", "example.com"),
        ("nodeSelection.anyOfLabels", [{"key": "a"}]),
        ("tolerations", [{"key": "a", "operator": "Maybe"}]),
        ("unknownTopLevel", {}),
    ],
)
def test_schema_rejects_bad_values(path: str, value: Any) -> None:
    assert not validator().is_valid(_with(path, value))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("devicePlugin.deviceListStrategy", ["volume-mounts", "cdi-cri"]),
        ("devicePlugin.deviceListStrategy", []),
        ("nodeMode", "runtimeclass"),
        ("nodeMode", "cdi"),
        ("runtimeClass.create", True),
        ("sharing.cards", [0, 3, "0000:9c:00.0"]),
        ("sharing.policy", "distributed"),
        ("nodeSelection.anyOfLabels", [{"key": "node-role/gcu", "value": ""}]),
    ],
)
def test_schema_accepts_good_values(path: str, value: Any) -> None:
    validator().validate(_with(path, value))


# --- defaults equal the static manifests -----------------------------------------------------
#
# No helm binary can be installed here, so the chart's templates cannot be rendered in this
# suite (test_helm_* below do it wherever helm exists). Instead the defaults in values.yaml are
# compared, field by field, with the static manifests, and the templates are checked to emit
# each of those fields from exactly these values.


def _patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return found + [p for value in node.values() for p in _patterns(value)]
    if isinstance(node, list):
        return [p for value in node for p in _patterns(value)]
    return []


# Constructs Python's re accepts but Go's RE2 (what helm validates values.schema.json with)
# rejects; one of them once made the whole schema unusable: real `helm lint` refused it.
NOT_IN_RE2 = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]")


def test_schema_patterns_use_only_what_helms_regex_engine_accepts() -> None:
    patterns = _patterns(schema())
    assert patterns, "the schema has no patterns: this test checks nothing"
    assert [p for p in patterns if NOT_IN_RE2.search(p)] == []
    assert NOT_IN_RE2.search("^(?!kubernetes\\.io/)x$")  # the guard itself can fail


def plugin_args(vals: dict[str, Any]) -> list[str]:
    """The argument list daemonset-device-plugin.yaml renders (kept in step with the template)."""
    plugin = vals["devicePlugin"]
    args = [
        "--host-root=/host",
        f"--resource-name={plugin['resourceName']}",
        f"--node-mode={vals['nodeMode']}",
    ]
    if plugin["deviceListStrategy"]:
        args.append(f"--device-list-strategy={','.join(plugin['deviceListStrategy'])}")
    args.append(f"--health-interval={plugin['healthInterval']}")
    if plugin["passDeviceSpecs"]:
        args.append("--pass-device-specs")
    if plugin.get("failOnInitError"):
        args.append("--fail-on-init-error")
    if plugin.get("logLevel"):
        args.append(f"--log-level={plugin['logLevel']}")
    if plugin["pluginDir"] != PLUGIN_DEFAULT_DIR:
        args.append(f"--plugin-dir={plugin['pluginDir']}")
    kinds = ["gcu"]
    if vals["vgcu"]["enabled"]:
        kinds.append("vgcu")
    if vals["sharing"]["enabled"]:
        kinds.append("shared-gcu")
    if kinds != ["gcu"]:
        args.append(f"--resources={','.join(kinds)}")
    if vals["sharing"]["enabled"]:
        args.append("--config-file=/etc/enflame-device-plugin/config.yaml")
    metrics = vals["metrics"]
    if metrics["port"]:
        bind = metrics["bindAddress"]
        args.append(f"--http-address={f'[{bind}]' if ':' in bind else bind}:{metrics['port']}")
        if not metrics["podResources"]:
            args.append("--pod-resources-interval=0")
        telemetry = metrics["telemetry"]
        if telemetry["enabled"]:
            args.append(f"--telemetry-interval={telemetry['interval']}")
            args.append(f"--telemetry-timeout={telemetry['timeout']}")
            if telemetry["isolation"] == "process":
                args.append("--telemetry-isolation=process")
        else:
            args.append("--telemetry-interval=0")
    if vals["nodeLabels"]["enabled"]:
        args.append("--feature-file=/host/nfd/enflame-gcu")
    return args


def test_template_emits_every_plugin_flag_the_values_control() -> None:
    text = template("daemonset-device-plugin.yaml")
    everything_on = _with("devicePlugin.passDeviceSpecs", True)
    everything_on["devicePlugin"].update(failOnInitError=True, logLevel="debug", pluginDir="/x")
    everything_on["devicePlugin"]["deviceListStrategy"] = ["envvar"]
    everything_on["vgcu"]["enabled"] = everything_on["sharing"]["enabled"] = True
    everything_on["metrics"].update(bindAddress="127.0.0.1", podResources=False)
    for arg in plugin_args(everything_on):
        flag = arg.split("=", 1)[0]
        assert re.search(rf"^\s+- {re.escape(flag)}\b", text, re.MULTILINE), flag


def static_container(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = load_one(os.path.join(YAML_DIR, name))
    spec = doc["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def node_terms(vals: dict[str, Any]) -> list[dict[str, Any]]:
    """The device plugin's node terms: a GCU label, and never a node labelled for DRA."""
    not_dra = {"key": vals["dra"]["modeLabel"], "operator": "NotIn", "values": ["dra"]}
    return [
        {
            "matchExpressions": [
                {"key": label["key"], "operator": "In", "values": [label["value"]]},
                not_dra,
            ]
        }
        for label in vals["nodeSelection"]["anyOfLabels"]
    ]


def test_plugin_defaults_equal_the_static_manifest() -> None:
    vals = values()
    spec, container = static_container("enflame-device-plugin.yaml")
    app_version = chart()["appVersion"]
    reference = vals["global"]["image"]
    tag = vals["image"]["tag"] or reference["tag"] or app_version
    repository = vals["image"]["repository"] or f"{reference['registry']}/enflame-gcu-device-plugin"
    assert container["image"] == f"{repository}:{tag}"
    assert container["imagePullPolicy"] == vals["image"]["pullPolicy"]
    assert container["args"] == plugin_args(vals)
    assert container["securityContext"] == vals["devicePlugin"]["securityContext"]
    assert container["resources"] == vals["devicePlugin"]["resources"]
    assert spec["priorityClassName"] == vals["priorityClassName"]
    assert spec["tolerations"] == vals["tolerations"]
    affinity = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["nodeSelectorTerms"] == node_terms(vals)
    plugin_volume = next(v for v in spec["volumes"] if v["name"] == "device-plugin")
    assert plugin_volume["hostPath"]["path"] == vals["devicePlugin"]["pluginDir"]
    assert vals["devicePlugin"]["enabled"] is True
    assert not vals["vgcu"]["enabled"] and not vals["sharing"]["enabled"]


def test_plugin_template_holds_the_static_manifests_fixed_parts() -> None:
    """Volumes, mounts, env and pod security context are literal in the template: same text."""
    text = template("daemonset-device-plugin.yaml")
    spec, container = static_container("enflame-device-plugin.yaml")
    templated = {
        PLUGIN_DEFAULT_DIR: "{{ $plugin.pluginDir }}",
        values()["metrics"]["podResourcesDir"]: "{{ $metrics.podResourcesDir }}",
        values()["nodeLabels"]["featuresDir"]: "{{ $labels.featuresDir }}",
    }
    for volume in spec["volumes"]:
        assert f"- name: {volume['name']}" in text
        path = volume["hostPath"]["path"]
        expected = templated.get(path, path)
        assert f"path: {expected}\n            type: {volume['hostPath']['type']}" in text
    for mount in container["volumeMounts"]:
        if mount["mountPath"] == PLUGIN_DEFAULT_DIR:
            continue
        writable = f"mountPath: {mount['mountPath']}\n"
        assert (
            writable + "              readOnly: true" if mount.get("readOnly") else writable
        ) in text
    # The probes and the port: the template's block, its one value filled in, equals the file's.
    block = text.split("          ports:\n", 1)[1].split("          {{- end }}\n          env:", 1)[
        0
    ]
    block = "ports:\n" + textwrap.dedent(block).replace(
        "{{ $metrics.port }}", str(values()["metrics"]["port"])
    )
    probes = {name: container[name] for name in ("ports", "livenessProbe", "readinessProbe")}
    assert yaml.safe_load(block) == probes
    for env in container["env"]:
        assert f"- name: {env['name']}\n              value: {env['value']}" in text
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert values()["podSecurityContext"] == spec["securityContext"]
    assert "{{- with .Values.podSecurityContext }}" in text
    assert spec["automountServiceAccountToken"] is False
    assert "automountServiceAccountToken: false" in text


def test_toolkit_defaults_equal_the_static_manifest() -> None:
    vals = values()["toolkit"]
    reference = values()["global"]["image"]
    spec, container = static_container("enflame-container-toolkit.yaml")
    tag = vals["image"]["tag"] or reference["tag"] or chart()["appVersion"]
    repository = (
        vals["image"]["repository"] or f"{reference['registry']}/enflame-gcu-container-toolkit"
    )
    assert container["image"] == f"{repository}:{tag}"
    assert spec["terminationGracePeriodSeconds"] == vals["terminationGracePeriodSeconds"]
    assert container["resources"] == vals["resources"]
    assert spec["tolerations"] == values()["tolerations"]
    text = template("daemonset-container-toolkit.yaml")
    rendered = ["enflame-ctk", "install", "--host-root", "/host", "--wait"]
    rendered += ["--mode", values()["nodeMode"]]
    rendered += ["--restart-engine"] * vals["restartEngine"]
    rendered += ["--ready-file", "/run/enflame/ready"]
    assert container["command"] == rendered
    probe = {"exec": {"command": ["test", "-f", "/run/enflame/ready"]}}
    assert container["readinessProbe"]["exec"] == probe["exec"]
    assert 'command: ["test", "-f", "/run/enflame/ready"]' in text
    assert "            - {{ .Values.nodeMode }}\n" in text
    for word in rendered:
        if word != values()["nodeMode"]:
            assert f"            - {word}\n" in text, word
    assert "hostPID: true" in text and "privileged: true" in text
    assert "path: /\n            type: Directory" in text


def test_runtimeclass_template_matches_the_static_manifest() -> None:
    text = template("runtimeclass.yaml")
    static = load_one(os.path.join(YAML_DIR, "enflame-runtimeclass.yaml"))
    assert static["apiVersion"] == "node.k8s.io/v1" and static["kind"] == "RuntimeClass"
    assert static["metadata"]["name"] == values()["runtimeClass"]["name"] == "enflame"
    assert static["handler"] == "enflame"
    assert "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\n" in text
    assert "handler: enflame\n" in text
    assert text.startswith(
        '{{- if or (eq .Values.nodeMode "runtimeclass") .Values.runtimeClass.create }}'
    )


def test_chart_app_version_is_the_project_version() -> None:
    with open(os.path.join(CHART_DIR, "..", "..", "..", "pyproject.toml"), encoding="utf-8") as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.MULTILINE)
    assert version is not None
    assert chart()["appVersion"] == version.group(1)
    # The chart's own version moves with the package's too: make chart-package names the
    # file after it, and a chart 0.1.0 holding 0.2.0 images would be a second version scheme.
    assert chart()["version"] == version.group(1)
    assert chart()["name"] == "enflame-gcu"


def test_sharing_config_template_writes_a_versioned_config() -> None:
    text = template("configmap-plugin-config.yaml")
    body = text.split("config.yaml: |", 1)[1]
    assert "version: v1" in body
    for key in ("slicesPerCard", "policy", "cards"):
        pattern = rf"^\s+{key}: \{{\{{.*\.Values\.sharing\.{key}.*\}}\}}$"
        assert re.search(pattern, body, re.MULTILINE), key


# --- with a real helm ------------------------------------------------------------------------

HELM = shutil.which("helm")
NO_HELM = (
    "no helm binary on PATH (Debian 12 packages none; Helm's library runs from .venv-helm "
    "below); templates checked structurally above"
)


@pytest.mark.skipif(HELM is None, reason=NO_HELM)
def test_helm_lint() -> None:
    assert HELM is not None
    subprocess.run([HELM, "lint", "--strict", CHART_DIR], check=True)


@pytest.mark.skipif(HELM is None, reason=NO_HELM)
@pytest.mark.parametrize(
    "overrides",
    [[], ["--set", "toolkit.enabled=true,vgcu.enabled=true,sharing.enabled=true"]],
)
def test_helm_template_renders_valid_objects(overrides: list[str], tmp_path: Any) -> None:
    assert HELM is not None
    out = subprocess.run(
        [HELM, "template", "enflame-gcu", CHART_DIR, "-n", "kube-system", *overrides],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs
    for doc in docs:
        for version in ("1.25.0", kv.latest_version()):
            kv.validate(doc, version, strict=True)
    if not overrides:
        (plugin,) = [d for d in docs if d["kind"] == "DaemonSet"]
        static = load_all(os.path.join(YAML_DIR, "enflame-device-plugin.yaml"))[0]
        assert (
            plugin["spec"]["template"]["spec"]["containers"]
            == static["spec"]["template"]["spec"]["containers"]
        )


# --- with Helm's own Go library (helm-python-sdk, in .venv-helm from scripts/bootstrap.sh) --------

HELM_SDK = os.path.join(PROJECT_ROOT, ".venv-helm", "bin", "python")
NO_HELM_SDK = (
    ".venv-helm is missing: scripts/bootstrap.sh makes it (helm-python-sdk, Helm's Go library "
    "for Python) and says why when it could not"
)
# Under CI=true a missing Helm is a failure, not a skip.
HELM_MISSING = not os.path.exists(HELM_SDK) and os.environ.get("CI") != "true"
HELM_LINT = os.path.join(os.path.dirname(__file__), "helm_lint.py")


def _real_helm_lint(chart_dir: str) -> dict[str, Any]:
    result = subprocess.run(
        [HELM_SDK, HELM_LINT, chart_dir], capture_output=True, text=True, check=True, timeout=120
    )
    lint: dict[str, Any] = json.loads(result.stdout.splitlines()[0])
    return lint


def _chart_copy(tmp_path: Any, enabled: tuple[str, ...]) -> str:
    target = os.path.join(str(tmp_path), "enflame-gcu")
    shutil.copytree(CHART_DIR, target)
    path = os.path.join(target, "values.yaml")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    for section in enabled:
        text, count = re.subn(rf"(?m)^({section}:\n  enabled: )false$", r"\1true", text)
        assert count == 1, f"values.yaml has no '{section}.enabled: false' to switch on"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target


@pytest.mark.skipif(HELM_MISSING, reason=NO_HELM_SDK)
@pytest.mark.parametrize(
    "enabled",
    [(), ("vgcu",), ("sharing",), ("toolkit",), ("dra",), ("vgcu", "sharing", "toolkit", "dra")],
)
def test_real_helm_lint_accepts_every_variant(enabled: tuple[str, ...], tmp_path: Any) -> None:
    lint = _real_helm_lint(_chart_copy(tmp_path, enabled))
    assert lint["errors"] is None
    # Helm's severities: 1 info (e.g. "icon is recommended"), 2 warning, 3 error.
    assert [m for m in lint["messages"] if m["severity"] >= 2] == []


@pytest.mark.skipif(HELM_MISSING, reason=NO_HELM_SDK)
def test_real_helm_lint_catches_a_broken_chart(tmp_path: Any) -> None:
    """The harness can fail: a template error and an RE2-incompatible schema are both caught."""
    chart_dir = _chart_copy(tmp_path / "template", ())
    with open(os.path.join(chart_dir, "templates", "broken.yaml"), "w") as handle:
        handle.write("{{ .Values.nope.deeper }}\n")
    assert _real_helm_lint(chart_dir)["errors"]
    chart_dir = _chart_copy(tmp_path / "schema", ())
    schema_path = os.path.join(chart_dir, "values.schema.json")
    with open(schema_path, encoding="utf-8") as handle:
        broken = json.load(handle)
    broken["properties"]["nameOverride"]["pattern"] = "^(?!x)"
    with open(schema_path, "w", encoding="utf-8") as handle:
        json.dump(broken, handle)
    assert _real_helm_lint(chart_dir)["errors"]


# --- the chart's README lists every value ---------------------------------------------------


def test_chart_readme_lists_every_value_and_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "chart_readme", os.path.join(PROJECT_ROOT, "scripts", "chart_readme.py")
    )
    assert spec is not None and spec.loader is not None
    chart_readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart_readme)
    paths = chart_readme.leaves(schema(), schema())
    assert "image.repository" in paths and "devicePlugin.resourceName" in paths
    with open(os.path.join(CHART_DIR, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    listed = re.findall(r"^\| `([^`]+)` \|", readme, re.MULTILINE)
    assert listed == paths  # every value, in schema order, and nothing else
    assert not re.search(r"^\| `[^`]+` \| [^|]+ \|  \|$", readme, re.MULTILINE), "undescribed"
    assert chart_readme.main(["--check"]) == 0, "README.md is stale: python scripts/chart_readme.py"
