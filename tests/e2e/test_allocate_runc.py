"""The device plugin's Allocate under each device-list strategy, fed into a real container.

The plugin's own translation function builds the response; kubelet + containerd are emulated
(tests/e2e/kubelet_emulation.py); our runtime and the real runc start the container.
"""

from __future__ import annotations

from typing import Any

import pytest

from enflame_gcu import devices, naming
from enflame_gcu.container_toolkit import cdi
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import service
from enflame_gcu.device_plugin import state as plugin_state
from tests.e2e import kubelet_emulation
from tests.e2e.conftest import Node, gcu_nodes
from tests.shim.schemas import assert_valid_cdi, assert_valid_oci

pytestmark = pytest.mark.runc
ENV = naming.VISIBLE_DEVICES_ENV


def allocate(node: Node, strategies: tuple[str, ...], pass_device_specs: bool = False) -> Any:
    """Pick two cards with the plugin's policy, then build Allocate's container response."""
    snapshot = plugin_state.snapshot_for(devices.discover(node.root), "topology")
    ids = snapshot.policy.choose(snapshot.healthy_ids(), [], 2)
    assert ids == ["gcu0", "gcu1"]  # the manual's first 2-card pod (SPEC §2)
    config = plugin_config.PluginConfig(
        host_root=node.root,
        device_list_strategy=strategies,
        pass_device_specs=pass_device_specs,
    )
    return service.container_response(plugin_state.grants(snapshot, [ids], config)[0])


def run_pod(
    node: Node, response: Any, image_env: list[str] | None = None, strict: bool = False
) -> list[str]:
    """Start a container built from the response; return the GCU nodes it sees."""
    if strict:  # the SPEC §6.7 mode: only the plugin's volume-mount/CDI requests count
        node.ignore_envvar_when_unprivileged()
    specs = [named.spec for named in cdi.build_specs(devices.discover(node.root))]
    for spec in specs:
        assert_valid_cdi(spec)

    def edit(spec: dict[str, Any]) -> None:
        kubelet_emulation.apply_response(spec, response, node.root, specs)
        assert_valid_oci(spec)

    bundle = node.bundle(
        ["sh", "-c", "ls /dev; echo ---; cat /dev/gcu1 2>&1; true"], env=image_env, edit=edit
    )
    result = node.run(bundle)
    assert result.returncode == 0, result.stderr
    listing, _, probe = result.stdout.partition(b"---")
    assert b"No such device or address" in probe, probe  # gcu1 passes the device cgroup
    assert b"Operation not permitted" not in probe
    return gcu_nodes(listing)


TWO = ["gcu0", "gcu1", "gcuctl"]


def test_envvar_strategy(node: Node) -> None:
    response = allocate(node, ("envvar",))
    assert dict(response.envs) == {ENV: "0,1"}
    assert run_pod(node, response) == TWO


def test_envvar_with_device_specs(node: Node) -> None:
    response = allocate(node, ("envvar",), pass_device_specs=True)
    assert [d.container_path for d in response.devices] == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
    assert run_pod(node, response) == TWO


def test_volume_mounts_strategy_beats_an_image_asking_for_all(node: Node) -> None:
    response = allocate(node, ("volume-mounts",))
    assert [m.container_path for m in response.mounts] == [
        f"{naming.VOLUME_MOUNT_DIR}/gcu0",
        f"{naming.VOLUME_MOUNT_DIR}/gcu1",
    ]
    assert run_pod(node, response, image_env=[f"{ENV}=all"], strict=True) == TWO


def test_cdi_annotations_strategy_beats_an_image_asking_for_all(node: Node) -> None:
    response = allocate(node, ("cdi-annotations",))
    assert dict(response.annotations) == {
        naming.CDI_ANNOTATION_KEY: "enflame.com/gcu=0,enflame.com/gcu=1"
    }
    assert run_pod(node, response, image_env=[f"{ENV}=all"], strict=True) == TWO


def test_cdi_cri_strategy_injects_from_the_generated_cdi_spec(node: Node) -> None:
    response = allocate(node, ("cdi-cri",))
    assert [d.name for d in response.cdi_devices] == ["enflame.com/gcu=0", "enflame.com/gcu=1"]
    assert not response.envs
    assert run_pod(node, response, strict=True) == TWO


def test_combined_strategies(node: Node) -> None:
    response = allocate(node, ("envvar", "volume-mounts", "cdi-annotations"))
    assert run_pod(node, response) == TWO
