"""A real runc container started from an enflame.com/vgcu Allocate answer sees exactly its vGCUs.

The plugin's vGCU resource chooses and answers in this process (the same functions its gRPC
service calls); the emulated kubelet + containerd feed the answer to our runtime and real runc,
so the runtime's and the CDI generator's vGCU support is exercised end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu import devices, naming
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import runner, service
from enflame_gcu.device_plugin import state as plugin_state
from tests.conftest import MakeNode
from tests.e2e import kubelet_emulation
from tests.e2e.conftest import Node, gcu_nodes

pytestmark = pytest.mark.runc


@pytest.fixture
def vendor_node(make_node: MakeNode) -> str:
    """Here the e2e ``node`` fixture runs on the two-card vGCU machine instead."""
    return make_node("vgcu-2card")


def allocate(root: str, strategies: tuple[str, ...]) -> tuple[list[str], Any]:
    """The vGCU policy's pick of 2 with vgcu0 in use, and Allocate's container response."""
    config = plugin_config.PluginConfig(
        host_root=root, resources=("vgcu",), device_list_strategy=strategies
    )
    snapshot = runner.NodeResources(config).states["vgcu"].snapshot
    available = [d for d in snapshot.healthy_ids() if d != "vgcu0"]
    ids = snapshot.policy.choose(available, [], 2)
    return ids, service.container_response(plugin_state.grants(snapshot, [ids], config)[0])


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts", "cdi-cri"])
def test_container_sees_exactly_its_vgcus(node: Node, strategy: str) -> None:
    ids, response = allocate(node.root, (strategy,))
    assert ids == ["vgcu1", "vgcu2"]  # the same card
    strict = strategy != "envvar"
    if strict:  # only the plugin's mounts/CDI names count, not the image's env
        node.ignore_envvar_when_unprivileged()
    specs = [named.spec for named in cdi.build_specs(devices.discover(node.root))]
    assert [spec["kind"] for spec in specs] == ["enflame.com/gcu", "enflame.com/vgcu"]

    def edit(spec: dict[str, Any]) -> None:
        kubelet_emulation.apply_response(spec, response, node.root, specs)

    bundle = node.bundle(
        ["ls", "/dev"],
        env=[f"{naming.VISIBLE_DEVICES_ENV}=all"] if strict else None,
        edit=edit,
    )
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    assert gcu_nodes(result.stdout) == ["gcuctl", "vgcu1", "vgcu2"]
