"""The ``cdi-annotations`` strategy through kubelet 1.20 and containerd 1.6.

The kubelet passes Allocate's annotations to CRI as container annotations; containerd 1.6 copies
a container annotation into the OCI spec only when the runtime's ``container_annotations``
names it. Without that, our runtime never saw the request and the pod got no cards;
``enflame-ctk runtime configure --cdi-annotations`` (which the tier's containerd is configured
with) writes it.
"""

from __future__ import annotations

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def _response(node: harness.Node, name: str) -> dict[str, object]:
    uid = node.pods.uid(name)
    (entry,) = [e for e in harness.checkpoint()["entries"] if e["pod_uid"] == uid]
    return harness.decode_response(entry["response"])


def test_cdi_annotations(node: harness.Node) -> None:
    node.up(plugin_args=["--device-list-strategy", "cdi-annotations"])
    report = node.pods.run("cdi", 2)
    response = _response(node, "cdi")
    annotation = response["annotations"]["cdi.k8s.io/enflame-gcu"]  # type: ignore[index]
    assert sorted(annotation.split(",")) == ["enflame.com/gcu=0", "enflame.com/gcu=1"]
    # containerd 1.6 passes a container annotation into the OCI spec only when the runtime's
    # container_annotations names it: `enflame-ctk runtime configure` must have said so.
    with open(node.containerd.config, encoding="utf-8") as handle:
        config = handle.read()
    assert 'container_annotations = ["cdi.k8s.io/*"]' in config, config
    assert report.nodes == ("gcu0", "gcu1", "gcuctl"), (
        f"{report.text}\ncontainerd config:\n{config}"
    )
    assert response["envs"] == {}
    assert sorted(report.visible.split(",")) == ["0", "1"]  # set by our runtime
