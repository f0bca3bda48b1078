"""The create flow on a simulated node: edits, untouched bundles, processed specs, errors."""

from __future__ import annotations

import json
import logging
import os

import pytest

from enflame_gcu import edits, naming
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import create, oci
from tests.shim.conftest import MakeBundle
from tests.shim.schemas import assert_valid_oci

ENV = naming.VISIBLE_DEVICES_ENV
LOG = logging.getLogger("test")


def read(bundle: str) -> bytes:
    with open(oci.spec_path(bundle), "rb") as handle:
        return handle.read()


def spec_of(bundle: str) -> dict[str, object]:
    return json.loads(read(bundle))  # type: ignore[no-any-return]


def paths(bundle: str) -> list[str]:
    return [d["path"] for d in spec_of(bundle)["linux"]["devices"]]  # type: ignore[index]


def test_two_cards_get_nodes_rules_env_and_marker(
    make_bundle: MakeBundle, node_config: runtime_config.RuntimeConfig
) -> None:
    bundle = make_bundle(env=[f"{ENV}=0,1"])
    outcome = create.edit_bundle(bundle, node_config, LOG)
    assert outcome == f"gave gcu0, gcu1 (requested by {ENV}='0,1')"
    spec = spec_of(bundle)
    assert paths(bundle) == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
    assert f"{ENV}=0,1" in spec["process"]["env"]  # type: ignore[index]
    assert spec["annotations"] == {naming.PROCESSED_ANNOTATION: "0,1"}
    assert spec["x-unknown-top-field"] == [1, 2, 3]
    assert spec["linux"]["x-unknown-linux-field"] == {"kept": True}  # type: ignore[index]
    assert_valid_oci(spec)


def test_all_gets_eight_cards_and_gcuctl(
    make_bundle: MakeBundle, node_config: runtime_config.RuntimeConfig
) -> None:
    bundle = make_bundle(env=[f"{ENV}=all"])
    create.edit_bundle(bundle, node_config, LOG)
    assert paths(bundle) == [f"/dev/gcu{n}" for n in range(8)] + ["/dev/gcuctl"]
    assert_valid_oci(spec_of(bundle))


@pytest.mark.parametrize("env", [[], [f"{ENV}=void"], [f"{ENV}="]])
def test_unset_void_and_empty_leave_the_file_byte_identical(
    make_bundle: MakeBundle, node_config: runtime_config.RuntimeConfig, env: list[str]
) -> None:
    bundle = make_bundle(env=env)
    before = read(bundle)
    stat_before = os.stat(oci.spec_path(bundle))
    assert create.edit_bundle(bundle, node_config, LOG) == "no GCU requested; spec left untouched"
    assert read(bundle) == before
    assert os.stat(oci.spec_path(bundle)).st_ino == stat_before.st_ino


def test_none_adds_driver_mounts_and_env_but_no_devices(
    make_bundle: MakeBundle, vendor_node: str
) -> None:
    config = runtime_config.RuntimeConfig(
        root=vendor_node, mounts=(("/usr/bin/efsmi", "/usr/bin/efsmi"),), env=(("EF_X", "1"),)
    )
    bundle = make_bundle(env=[f"{ENV}=none"])
    assert create.edit_bundle(bundle, config, LOG) == f"gave no cards (requested by {ENV}=none)"
    spec = spec_of(bundle)
    assert "devices" not in spec["linux"]  # type: ignore[operator]
    assert "/usr/bin/efsmi" in [m["destination"] for m in spec["mounts"]]  # type: ignore[attr-defined]
    assert {f"{ENV}=none", "EF_X=1"} <= set(spec["process"]["env"])  # type: ignore[index]
    assert_valid_oci(spec)


def test_processed_spec_is_not_edited_twice(
    make_bundle: MakeBundle, node_config: runtime_config.RuntimeConfig
) -> None:
    bundle = make_bundle(env=[f"{ENV}=2"])
    create.edit_bundle(bundle, node_config, LOG)
    once = read(bundle)
    assert "already processed" in create.edit_bundle(bundle, node_config, LOG)
    assert read(bundle) == once


@pytest.mark.parametrize(
    ("env", "step", "detail"),
    [
        ("9", "resolving the requested GCUs", "asks for '9', which is not on this node"),
        ("gpu1", "reading the requested GCUs", "'gpu1' is not a device id"),
    ],
)
def test_errors_name_the_step_and_leave_the_bundle_untouched(
    make_bundle: MakeBundle,
    node_config: runtime_config.RuntimeConfig,
    env: str,
    step: str,
    detail: str,
) -> None:
    bundle = make_bundle(env=[f"{ENV}={env}"])
    before = read(bundle)
    with pytest.raises(create.StepError) as caught:
        create.edit_bundle(bundle, node_config, LOG)
    assert str(caught.value).startswith(f"{step}: ")
    assert detail in str(caught.value)
    assert read(bundle) == before
    assert os.listdir(bundle) == ["config.json"]


def test_missing_gcuctl_fails_building_the_edits(
    make_bundle: MakeBundle, node_config: runtime_config.RuntimeConfig
) -> None:
    os.unlink(os.path.join(node_config.root, "dev/gcuctl"))
    bundle = make_bundle(env=[f"{ENV}=0"])
    with pytest.raises(create.StepError, match="building the container edits: /dev/gcuctl"):
        create.edit_bundle(bundle, node_config, LOG)


def test_unprivileged_env_ignored_when_option_is_false(
    make_bundle: MakeBundle, vendor_node: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = runtime_config.RuntimeConfig(root=vendor_node, accept_envvar_when_unprivileged=False)
    bundle = make_bundle(env=[f"{ENV}=all"])
    before = read(bundle)
    with caplog.at_level(logging.WARNING, logger="test"):
        assert "no GCU requested" in create.edit_bundle(bundle, config, LOG)
    assert read(bundle) == before
    assert "lacks CAP_SYS_ADMIN" in caplog.text
    privileged = make_bundle(env=[f"{ENV}=all"], privileged=True)
    create.edit_bundle(privileged, config, LOG)
    assert len(paths(privileged)) == 9


def test_volume_mount_request_rewrites_the_env_to_the_cards(
    make_bundle: MakeBundle, vendor_node: str
) -> None:
    config = runtime_config.RuntimeConfig(root=vendor_node, accept_envvar_when_unprivileged=False)
    listed = edits.device_list(["gcu4", "gcu5"], ["volume-mounts"])
    mounts = [
        {
            "destination": m.container_path,
            "type": "bind",
            "source": m.host_path,
            "options": ["rbind", "ro" if m.read_only else "rw"],
        }
        for m in listed.edits.mounts
    ]
    bundle = make_bundle(env=[f"{k}={v}" for k, v in listed.edits.env], mounts=mounts)
    create.edit_bundle(bundle, config, LOG)
    assert paths(bundle) == ["/dev/gcu4", "/dev/gcu5", "/dev/gcuctl"]
    assert f"{ENV}=4,5" in spec_of(bundle)["process"]["env"]  # type: ignore[index]
    assert_valid_oci(spec_of(bundle))


def test_cdi_annotation_request(make_bundle: MakeBundle, vendor_node: str) -> None:
    config = runtime_config.RuntimeConfig(root=vendor_node, accept_envvar_when_unprivileged=False)
    listed = edits.device_list(["gcu6"], ["cdi-annotations"])
    bundle = make_bundle(annotations=dict(listed.edits.annotations))
    create.edit_bundle(bundle, config, LOG)
    assert paths(bundle) == ["/dev/gcu6", "/dev/gcuctl"]
    annotations = spec_of(bundle)["annotations"]
    assert annotations[naming.CDI_ANNOTATION_KEY] == "enflame.com/gcu=6"  # type: ignore[index]
    assert_valid_oci(spec_of(bundle))
