"""PodResources ``List``: the kubelet names the pod and container that holds each card."""

from __future__ import annotations

import pytest

from tests.kubelet import harness

pytestmark = pytest.mark.kubelet


def test_list_names_the_pod_holding_each_card(node: harness.Node) -> None:
    node.up()
    node.pods.run("two-a", 2)
    node.pods.run("two-b", 2)
    node.pods.create(harness.pod_manifest("no-gcu", [harness.container()]))
    node.pods.wait_running("no-gcu")
    holder = {
        device: f"{held.namespace}/{held.pod}/{held.container}"
        for held in node.holdings()
        if held.resource == harness.RESOURCE
        for device in held.device_ids
    }
    suffix = f"-{harness.NODE_NAME}/main"
    assert holder == {
        "gcu0": f"default/two-a{suffix}",
        "gcu1": f"default/two-a{suffix}",
        "gcu4": f"default/two-b{suffix}",
        "gcu5": f"default/two-b{suffix}",
    }
    # After a pod goes, List stops naming it.
    node.pods.delete("two-a")
    remaining = {d for held in node.holdings() for d in held.device_ids}
    assert remaining == {"gcu4", "gcu5"}
