"""Per-DaemonSet knobs and API guards (issue 23), in the schema and rendered by Helm's engine."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy import helm_render
from tests.deploy.helpers import CHART_DIR

pytestmark = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
PLUGIN = "daemonset-device-plugin.yaml"
TOOLKIT = "daemonset-container-toolkit.yaml"
DRA = "daemonset-dra-plugin.yaml"
VOLUME = {"name": "extra", "hostPath": {"path": "/opt/extra", "type": "Directory"}}
MOUNT = {"name": "extra", "mountPath": "/extra", "readOnly": True}


def _pod(rendered: dict[str, list[Any]], template: str) -> dict[str, Any]:
    spec: dict[str, Any] = helm_render.daemonset(rendered, template)["spec"]["template"]["spec"]
    return spec


def test_each_daemonset_takes_its_own_scheduling_volumes_and_host_network(
    tmp_path: os.PathLike[str],
) -> None:
    own = [{"key": "pool", "operator": "Equal", "value": "toolkit", "effect": "NoSchedule"}]
    rendered = helm_render.render(
        str(tmp_path),
        {
            "toolkit": {
                "enabled": True,
                "tolerations": own,
                "nodeSelector": {"pool": "gcu"},
                "env": [{"name": "CONTAINERD_NAMESPACE", "value": "k8s.io"}],
                "extraVolumes": [VOLUME],
                "extraVolumeMounts": [MOUNT],
            },
            "devicePlugin": {"hostNetwork": True, "tolerations": [], "affinity": {}},
            "dra": {"enabled": True, "extraVolumes": [VOLUME], "extraVolumeMounts": [MOUNT]},
            "apiVersions": ["resource.k8s.io/v1"],
        },
    )
    toolkit, plugin, dra = (_pod(rendered, t) for t in (TOOLKIT, PLUGIN, DRA))
    assert toolkit["tolerations"] == own and toolkit["nodeSelector"] == {"pool": "gcu"}
    assert {"name": "CONTAINERD_NAMESPACE", "value": "k8s.io"} in toolkit["containers"][0]["env"]
    for pod in (toolkit, dra):
        assert pod["volumes"][0] == VOLUME and pod["containers"][0]["volumeMounts"][0] == MOUNT
    # [] and {} mean none of its own for this DaemonSet (nodeSelection still places it); the
    # chart-wide values stay for the others.
    assert "tolerations" not in plugin and list(plugin["affinity"]) == ["nodeAffinity"]
    assert plugin["hostNetwork"] is True and plugin["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert [t["key"] for t in dra["tolerations"]] == ["CriticalAddonsOnly", "enflame.com/gcu"]
    assert "hostNetwork" not in toolkit and "hostNetwork" not in dra
    terms = dra["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][-1]["values"] == ["dra"]


def test_defaults_render_no_extra_knob(tmp_path: os.PathLike[str]) -> None:
    plugin = _pod(helm_render.render(str(tmp_path), {}), PLUGIN)
    assert "hostNetwork" not in plugin
    assert plugin["volumes"][0]["name"] == "device-plugin"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"devicePlugin": {"hostNetwork": "yes"}}, "hostNetwork"),
        ({"toolkit": {"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}}, "mountPath"),
        ({"toolkit": {"env": [{"value": "no name"}]}}, "name"),
        ({"dra": {"tolerations": [{"operator": "Maybe"}]}}, "tolerations"),
        ({"apiVersions": ["not an api"]}, "apiVersions"),
    ],
)
def test_the_schema_refuses_bad_knobs(
    tmp_path: os.PathLike[str], overrides: dict[str, Any], problem: str
) -> None:
    assert problem in helm_render.lint_errors(str(tmp_path), overrides)


@pytest.mark.parametrize(
    ("overrides", "api"),
    [
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, "monitoring.coreos.com/v1"),
        ({"metrics": {"podMonitor": {"enabled": True}}}, "monitoring.coreos.com/v1"),
    ],
)
def test_objects_of_an_api_the_cluster_lacks_fail_the_install_by_name(
    tmp_path: os.PathLike[str], overrides: dict[str, Any], api: str
) -> None:
    # Helm's lint knows the built-in APIs of its Kubernetes version only (1.37 for Helm's library
    # 0.1.32): no Prometheus Operator CRDs. In lint mode Helm logs a template's fail
    # ("[INFO] Fail: ...") where an install stops with it.
    said = f"needs the API {api}, which this cluster does not serve"
    assert said in _lint_output(os.path.join(str(tmp_path), "a"), overrides)
    assert said not in _lint_output(
        os.path.join(str(tmp_path), "b"), {**overrides, "apiVersions": [api]}
    )


def _lint_output(workdir: str, overrides: dict[str, Any]) -> str:
    """What Helm's lint of the chart with ``overrides`` printed (its log included)."""
    os.makedirs(workdir)
    target = os.path.join(workdir, "enflame-gcu")
    shutil.copytree(CHART_DIR, target)
    with open(os.path.join(target, "values.yaml"), encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    with open(os.path.join(target, "values.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(helm_render.merged(values, overrides), handle, sort_keys=False)
    result = subprocess.run(
        [helm_render.HELM_SDK, helm_render.HELM_LINT, target],
        capture_output=True, text=True, check=True, timeout=180,
    )  # fmt: skip
    return result.stdout + result.stderr


def test_the_dra_objects_ask_for_resource_k8s_io_v1(tmp_path: os.PathLike[str]) -> None:
    # Lint's Kubernetes (1.37) serves resource.k8s.io/v1, so the DeviceClasses render; a
    # cluster before 1.34 (v1beta1/v1beta2 only) gets the guard's message instead.
    output = _lint_output(os.path.join(str(tmp_path), "a"), {"dra": {"enabled": True}})
    assert "needs the API" not in output
    with open(
        os.path.join(CHART_DIR, "templates", "deviceclasses-dra.yaml"), encoding="utf-8"
    ) as f:
        assert '"api" "resource.k8s.io/v1" "for" "dra.deviceClasses"' in f.read()
