"""Every device-list strategy end to end: kubelet -> containerd 1.6 -> our runtime -> container.

``envvar`` and ``volume-mounts`` must give the pod exactly its cards (``cdi-annotations``:
test_cdi_annotations.py).
``cdi-cri`` cannot work here: Kubernetes 1.20's device plugin API has no ``cdi_devices`` field
(the kubelet drops it) and containerd 1.6 has no CDI; the user guide says so (both languages).
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import PROJECT_ROOT
from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def _response(node: harness.Node, name: str) -> dict[str, object]:
    uid = node.pods.uid(name)
    (entry,) = [e for e in harness.checkpoint()["entries"] if e["pod_uid"] == uid]
    return harness.decode_response(entry["response"])


def test_envvar(node: harness.Node) -> None:
    node.up(plugin_args=["--device-list-strategy", "envvar"])
    report = node.pods.run("env", 2)
    assert report.nodes == ("gcu0", "gcu1", "gcuctl"), report.text
    assert sorted(report.visible.split(",")) == ["0", "1"]
    assert _response(node, "env")["mounts"] == []


def test_volume_mounts(node: harness.Node) -> None:
    node.up(plugin_args=["--device-list-strategy", "volume-mounts"])
    report = node.pods.run("mounts", 2)
    assert report.nodes == ("gcu0", "gcu1", "gcuctl"), report.text
    assert report.mounts == ("gcu0", "gcu1")
    # The kubelet passed the mount dir as the env value; our runtime replaced it with the
    # cards it injected.
    response = _response(node, "mounts")
    assert response["envs"] == {"ENFLAME_VISIBLE_DEVICES": "/var/run/enflame-container-devices"}
    assert sorted(report.visible.split(",")) == ["0", "1"]
    mounts = response["mounts"]
    assert isinstance(mounts, list)
    assert sorted(mounts) == [
        ("/var/run/enflame-container-devices/gcu0", "/dev/null"),
        ("/var/run/enflame-container-devices/gcu1", "/dev/null"),
    ]


def test_cdi_cri_cannot_work_on_kubelet_1_20_and_the_guide_says_why(node: harness.Node) -> None:
    node.up(plugin_args=["--device-list-strategy", "cdi-cri"])
    report = node.pods.run("cdi-cri", 2)
    # The kubelet admitted the pod and checkpointed an answer without CDI names: it has no
    # such field, so the container gets nothing from us.
    response = _response(node, "cdi-cri")
    assert response["envs"] == {} and response["annotations"] == {}
    assert report.nodes == (), report.text
    for guide, kubelet_words in (
        ("user-guide.md", "older kubelets drop"),
        ("user-guide.zh-CN.md", "更早的 kubelet 会丢弃"),
    ):
        with open(os.path.join(PROJECT_ROOT, "docs", guide), encoding="utf-8") as handle:
            row = next(line for line in handle if line.startswith("| `cdi-cri`"))
        assert "Kubernetes 1.28+" in row and kubelet_words in row, row
        assert "containerd 1.7+" in row, row
