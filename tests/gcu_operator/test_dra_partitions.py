"""DRS partitions through the operator (issue 47, point 13): ``spec.dra.drs`` and
``spec.dra.efsmi`` give the DRA driver's DaemonSet what the chart's dra.drs and dra.efsmi give
it (Helm's own rendering compared); a bad selection is refused by the CRD and, past it,
reported with DRS left off."""

from __future__ import annotations

import re
from typing import Any

import pytest

from enflame_gcu.gcu_operator import components, crd
from enflame_gcu.gcu_operator import resource as rs
from tests.deploy import helm_render

needs_helm = pytest.mark.skipif(helm_render.helm_missing(), reason=helm_render.NO_HELM_SDK)
ACCOUNT = "test-release-enflame-gcu-dra-plugin"  # lint's release name


def _ours(dra: dict[str, Any]) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "apiVersion": f"{rs.GROUP}/v1",
        "kind": "GcuResource",
        "metadata": {"name": "gcu", "uid": "u-1"},
        "spec": {"dra": dra},
    }
    return components.desired(resource, rs.parse(resource["spec"]), True, ACCOUNT)[rs.DRA]


@needs_helm
@pytest.mark.parametrize("selection", ["all", "gcu0,S60"])
def test_drs_partitions_are_the_charts(tmp_path: Any, selection: str) -> None:
    values = {"dra": {"enabled": True, "drs": selection, "efsmi": "/usr/local/efsmi/bin/efsmi"}}
    rendered = helm_render.render(str(tmp_path), values)
    chart = helm_render.daemonset(rendered, "daemonset-dra-plugin.yaml")
    mine = _ours({"drs": selection, "efsmi": "/usr/local/efsmi/bin/efsmi"})
    chart_pod, our_pod = chart["spec"]["template"]["spec"], mine["spec"]["template"]["spec"]
    skip = {"image", "imagePullPolicy"}
    chart_container = {k: v for k, v in chart_pod["containers"][0].items() if k not in skip}
    our_container = {k: v for k, v in our_pod["containers"][0].items() if k not in skip}
    assert our_container == chart_container
    assert our_pod["volumes"] == chart_pod["volumes"]
    assert f"--drs={selection}" in our_container["args"]
    assert our_container["securityContext"]["privileged"] is True


def test_without_drs_the_driver_stays_unprivileged() -> None:
    container = _ours({})["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["privileged"] is False
    assert not [a for a in container["args"] if a.startswith("--drs")]


@pytest.mark.parametrize(
    ("dra", "field"),
    [
        ({"drs": "gcu0,$(rm -rf /)"}, "spec.dra.drs"),
        ({"drs": 3}, "spec.dra.drs"),
        ({"drs": "all", "efsmi": "efsmi"}, "spec.dra.efsmi"),
        ({"drs": "all", "efsmi": "/usr/../bin/sh"}, "spec.dra.efsmi"),
    ],
)
def test_a_bad_drs_value_is_reported_and_leaves_drs_off(dra: dict[str, Any], field: str) -> None:
    spec = rs.parse({"dra": dra})
    assert spec.dra == rs.DraOptions()
    assert [u.field for u in spec.unsupported] == [field]
    container = _ours(dra)["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["privileged"] is False


def test_the_crd_takes_a_drs_selection_in_both_groups() -> None:
    for group in (rs.GROUP, rs.LEGACY_GROUP):
        schema = crd.crd(group)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        fields = schema["properties"]["spec"]["properties"]["dra"]["properties"]
        pattern = re.compile(fields["drs"]["pattern"])
        for good in ("", "all", "gcu3", "gcu0,gcu1", "S60, S"):
            assert pattern.search(good), good
        for bad in ("gcu0;reboot", "all,", "$(x)"):
            assert not pattern.search(bad), bad
        assert "efsmi" in fields
