"""Each spec modifier does one thing; a chain names the failing step; results are valid OCI."""

from __future__ import annotations

import pytest

from enflame_gcu import devices, edits, naming
from enflame_gcu.errors import SpecError
from enflame_gcu.shim import modifiers
from tests.shim.conftest import make_spec
from tests.shim.schemas import assert_valid_oci


def nodes(vendor_node: str, *names: str) -> tuple[edits.DeviceNodeEdit, ...]:
    return edits.for_devices(devices.discover(vendor_node), list(names)).device_nodes


def test_device_nodes_adds_nodes_and_cgroup_rules(vendor_node: str) -> None:
    spec = make_spec()
    modifiers.DeviceNodes(nodes(vendor_node, "gcu0", "gcu1")).modify(spec)
    assert [(d["path"], d["major"], d["minor"]) for d in spec["linux"]["devices"]] == [
        ("/dev/gcu0", 238, 0),
        ("/dev/gcu1", 238, 1),
        ("/dev/gcuctl", 238, 255),
    ]
    assert all(d["fileMode"] == 0o666 and d["uid"] == 0 for d in spec["linux"]["devices"])
    rules = spec["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # the engine's deny-all stays first
    assert {(r["major"], r["minor"], r["access"]) for r in rules[1:]} == {
        (238, 0, "rwm"),
        (238, 1, "rwm"),
        (238, 255, "rwm"),
    }
    assert set(spec) - {"linux"} == set(make_spec()) - {"linux"}  # touched nothing else
    assert_valid_oci(spec)


def test_device_nodes_is_idempotent(vendor_node: str) -> None:
    spec = make_spec()
    modifier = modifiers.DeviceNodes(nodes(vendor_node, "gcu0"))
    modifier.modify(spec)
    modifier.modify(spec)
    assert len(spec["linux"]["devices"]) == 2
    assert len(spec["linux"]["resources"]["devices"]) == 3


def test_mounts_adds_read_only_binds_and_skips_taken_destinations() -> None:
    spec = make_spec(mounts=[{"destination": "/taken", "type": "bind", "source": "/x"}])
    modifiers.Mounts(
        (edits.MountEdit("/usr/bin/efsmi", "/usr/bin/efsmi"), edits.MountEdit("/y", "/taken"))
    ).modify(spec)
    added = [m for m in spec["mounts"] if m["destination"] == "/usr/bin/efsmi"]
    assert added == [
        {
            "destination": "/usr/bin/efsmi",
            "type": "bind",
            "source": "/usr/bin/efsmi",
            "options": ["rbind", "nosuid", "nodev", "ro"],
        }
    ]
    assert [m["source"] for m in spec["mounts"] if m["destination"] == "/taken"] == ["/x"]
    assert_valid_oci(spec)


def test_env_replaces_earlier_definitions() -> None:
    spec = make_spec(env=[f"{naming.VISIBLE_DEVICES_ENV}=all", "KEEP=1"])
    modifiers.Env(((naming.VISIBLE_DEVICES_ENV, "0,1"),)).modify(spec)
    env = spec["process"]["env"]
    assert f"{naming.VISIBLE_DEVICES_ENV}=0,1" in env
    assert f"{naming.VISIBLE_DEVICES_ENV}=all" not in env
    assert "KEEP=1" in env


def test_mark_processed_sets_the_annotation() -> None:
    spec = make_spec()
    assert not modifiers.is_processed(spec)
    modifiers.MarkProcessed("0,1").modify(spec)
    assert spec["annotations"][naming.PROCESSED_ANNOTATION] == "0,1"
    assert modifiers.is_processed(spec)
    assert_valid_oci(spec)


def test_chain_is_a_modifier_and_names_the_failing_step(vendor_node: str) -> None:
    inner = modifiers.chain([modifiers.MarkProcessed("x")])
    outer = modifiers.chain([inner, modifiers.DeviceNodes(nodes(vendor_node, "gcu0"))])
    spec = make_spec()
    outer.modify(spec)
    assert modifiers.is_processed(spec)
    assert len(spec["linux"]["devices"]) == 2
    broken = make_spec()
    broken["linux"]["resources"] = {"devices": "not-a-list"}
    with pytest.raises(SpecError, match="adding device nodes: the spec has an unexpected shape"):
        modifiers.chain([modifiers.DeviceNodes(nodes(vendor_node, "gcu0"))]).modify(broken)


def test_for_edits_builds_one_modifier_per_part(vendor_node: str) -> None:
    container_edits = edits.for_devices(
        devices.discover(vendor_node),
        ["gcu3"],
        mounts=[edits.MountEdit("/usr/bin/efsmi", "/usr/bin/efsmi")],
    )
    chain = modifiers.for_edits(container_edits, "3")
    assert [type(m).__name__ for m in chain.modifiers] == [
        "DeviceNodes",
        "Env",
        "Mounts",
        "MarkProcessed",
    ]
