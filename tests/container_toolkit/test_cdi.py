"""CDI specs: generate (same nodes as Allocate and the runtime), list, validate; schema-checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

from enflame_gcu import devices, edits
from enflame_gcu.container_toolkit import cdi, cdi_validate, cli
from enflame_gcu.shim import prepared_edits
from tests.shim.schemas import CDI_DIR, assert_valid_cdi

# The PCI addresses of the vendor 8-card machine's gcu0..gcu7 (SPEC section 2).
VENDOR_BDFS = [
    "0000:11:00.0",
    "0000:12:00.0",
    "0000:15:00.0",
    "0000:19:00.0",
    "0000:9c:00.0",
    "0000:9d:00.0",
    "0000:a0:00.0",
    "0000:a4:00.0",
]


def generate(vendor_node: str, output: str, *extra: str) -> int:
    return cli.main(["cdi", "generate", "--host-root", vendor_node, "--output", output, *extra])


@pytest.fixture
def no_runtime_config(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    """Point the runtime config at an empty file so the host's real config is not read."""
    path = os.path.join(str(tmp_path), "empty.toml")
    open(path, "w").close()
    monkeypatch.setenv("ENFLAME_CONTAINER_RUNTIME_CONFIG", path)


def load_spec(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data: dict[str, Any] = yaml.safe_load(handle)
    return data


@pytest.mark.usefixtures("no_runtime_config")
def test_generate_writes_a_valid_spec_with_minors_all_and_common_gcuctl(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    out = os.path.join(str(tmp_path), "cdi")
    assert generate(vendor_node, out) == 0
    assert os.listdir(out) == ["enflame.com-gcu.yaml"]
    spec = load_spec(os.path.join(out, "enflame.com-gcu.yaml"))
    assert_valid_cdi(spec)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "enflame.com/gcu"
    # By minor, by PCI address (SPEC's reference machine, gcu0..gcu7), and all.
    assert [d["name"] for d in spec["devices"]] == [str(n) for n in range(8)] + VENDOR_BDFS + [
        "all"
    ]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for minor, bdf in enumerate(VENDOR_BDFS):
        assert by_name[bdf] == by_name[str(minor)], bdf
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/gcuctl"]
    zero = spec["devices"][0]["containerEdits"]
    assert zero["deviceNodes"] == [
        {
            "path": "/dev/gcu0",
            "hostPath": "/dev/gcu0",
            "type": "c",
            "major": 238,
            "minor": 0,
            "permissions": "rwm",
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
    ]
    every = spec["devices"][-1]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in every] == [f"/dev/gcu{n}" for n in range(8)]
    assert os.stat(os.path.join(out, "enflame.com-gcu.yaml")).st_mode & 0o777 == 0o644


@pytest.mark.usefixtures("no_runtime_config")
def test_cdi_injects_exactly_what_the_runtime_injects(vendor_node: str) -> None:
    inventory = devices.discover(vendor_node)
    (named,) = cdi.build_specs(inventory)
    for names in (["gcu3"], ["gcu0", "gcu5"]):
        from_cdi = list(named.spec["containerEdits"]["deviceNodes"])
        for name in names:
            device = next(d for d in named.spec["devices"] if d["name"] == name[3:])
            from_cdi += device["containerEdits"]["deviceNodes"]
        runtime_nodes = edits.for_devices(inventory, names).to_cdi()["deviceNodes"]
        assert sorted(from_cdi, key=lambda n: n["path"]) == sorted(
            runtime_nodes, key=lambda n: n["path"]
        )


def test_config_mounts_and_env_go_into_the_common_edits(
    vendor_node: str, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = os.path.join(str(tmp_path), "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write('mounts = ["/usr/bin/efsmi"]\nenv = ["EF_X=1"]\n')
    monkeypatch.setenv("ENFLAME_CONTAINER_RUNTIME_CONFIG", config)
    out = os.path.join(str(tmp_path), "cdi")
    assert generate(vendor_node, out, "--format", "json") == 0
    with open(os.path.join(out, "enflame.com-gcu.json"), encoding="utf-8") as handle:
        spec = json.load(handle)
    assert_valid_cdi(spec)
    assert spec["containerEdits"]["env"] == ["EF_X=1"]
    assert spec["containerEdits"]["mounts"][0]["containerPath"] == "/usr/bin/efsmi"
    assert spec["cdiVersion"] == "0.5.0"


@pytest.mark.usefixtures("no_runtime_config")
def test_vgcus_get_their_own_kind(make_node: Any, tmp_path: os.PathLike[str]) -> None:
    root = make_node("vgcu-2card")
    specs = cdi.build_specs(devices.discover(root))
    assert [named.spec["kind"] for named in specs] == ["enflame.com/gcu", "enflame.com/vgcu"]
    for named in specs:
        assert_valid_cdi(named.spec)
    vgcu = specs[1].spec
    assert all(d["name"].isdigit() for d in vgcu["devices"])
    assert [n["path"] for n in vgcu["containerEdits"]["deviceNodes"]] == ["/dev/gcuctl"]


@pytest.mark.usefixtures("no_runtime_config")
def test_generate_to_stdout(vendor_node: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate(vendor_node, "-") == 0
    spec = yaml.safe_load(capsys.readouterr().out)
    assert_valid_cdi(spec)


@pytest.mark.usefixtures("no_runtime_config")
def test_generate_without_gcuctl_fails_clearly(
    vendor_node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    os.unlink(os.path.join(vendor_node, "dev", "gcuctl"))
    assert generate(vendor_node, "-") == 1
    assert "/dev/gcuctl is missing" in capsys.readouterr().err


@pytest.mark.usefixtures("no_runtime_config")
def test_list_names_every_device(
    vendor_node: str, tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = os.path.join(str(tmp_path), "cdi")
    generate(vendor_node, out)
    capsys.readouterr()
    assert cli.main(["cdi", "list", "--spec-dir", out, "--spec-dir", "/nonexistent"]) == 0
    names = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [f"enflame.com/gcu={n}" for n in [*range(8), *VENDOR_BDFS, "all"]]


@pytest.mark.usefixtures("no_runtime_config")
def test_list_with_nothing_found_fails(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cdi", "list", "--spec-dir", str(tmp_path)]) == 1
    assert "no CDI devices found" in capsys.readouterr().err


@pytest.mark.usefixtures("no_runtime_config")
def test_validate_accepts_generated_specs(
    vendor_node: str, tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = os.path.join(str(tmp_path), "cdi")
    generate(vendor_node, out)
    path = os.path.join(out, "enflame.com-gcu.yaml")
    if not os.path.isdir(CDI_DIR):
        pytest.skip(f"schema folder {CDI_DIR} is absent")
    assert cli.main(["cdi", "validate", path, "--schema-dir", CDI_DIR]) == 0
    assert "valid (schema and semantic checks)" in capsys.readouterr().out


def good_spec() -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": "enflame.com/gcu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {"deviceNodes": [{"path": "/dev/gcu0", "hostPath": "/dev/gcu0"}]},
            }
        ],
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.update(cdiVersion="0.4.0"), "too low for the fields used (needs 0.5.0)"),
        (lambda s: s.update(cdiVersion="9.9.9"), "cdiVersion '9.9.9' is unknown"),
        (lambda s: s.update(kind="gcu"), "must look like vendor.com/class"),
        (lambda s: s.update(kind="enflame/gcu"), "must be a domain name"),
        (lambda s: s["devices"].append(s["devices"][0]), "defined twice"),
        (lambda s: s["devices"][0].update(name="-x"), "device name '-x' is invalid"),
        (lambda s: s["devices"][0].update(containerEdits={}), "has no containerEdits"),
        (
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(path="dev/x"),
            "must be absolute",
        ),
        (
            lambda s: s["devices"][0]["containerEdits"].update(env=["NOVALUE"]),
            "must be KEY=VALUE",
        ),
        (lambda s: s.update(devices=[]), "defines no devices"),
    ],
)
def test_semantic_problems_are_found(change: Any, problem: str) -> None:
    spec = good_spec()
    assert cdi_validate.semantic_problems(spec) == []
    change(spec)
    assert any(problem in found for found in cdi_validate.semantic_problems(spec))


def test_schema_problems_are_found() -> None:
    if not os.path.isdir(CDI_DIR):
        pytest.skip(f"schema folder {CDI_DIR} is absent")
    spec = good_spec()
    del spec["devices"][0]["containerEdits"]
    problems = cdi_validate.schema_problems(spec, CDI_DIR)
    assert problems == ["schema: devices/0: 'containerEdits' is a required property"]


def test_validate_command_reports_problems_and_fails(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(str(tmp_path), "bad.json")
    spec = good_spec()
    spec["cdiVersion"] = "0.3.0"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    assert cli.main(["cdi", "validate", path]) == 1
    assert "too low for the fields used" in capsys.readouterr().err


def test_required_version_rises_with_the_fields_used() -> None:
    spec = good_spec()
    assert cdi.required_version(spec) == "0.5.0"
    del spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"]
    assert cdi.required_version(spec) == "0.3.0"
    spec["devices"][0]["containerEdits"]["mounts"] = [
        {"hostPath": "/a", "containerPath": "/a", "type": "bind"}
    ]
    assert cdi.required_version(spec) == "0.4.0"
    spec["annotations"] = {"a": "b"}
    assert cdi.required_version(spec) == "0.6.0"


def test_prepared_edits_hold_the_cdi_renderings_and_the_root(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    path = os.path.join(str(tmp_path), "run", "prepared-edits.json")
    inventory = devices.discover(vendor_node)
    assert cdi.refresh_prepared_edits(path, inventory, root="/")
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    assert document["enflamePreparedEdits"] == prepared_edits.FORMAT_VERSION
    assert document["root"] == "/"
    # Exactly the specs `cdi generate` writes (without config mounts/env), each schema-valid.
    assert document["specs"] == [named.spec for named in cdi.build_specs(inventory)]
    for spec in document["specs"]:
        assert_valid_cdi(spec)
    # Per card, the sysfs inputs of discovery's verdict, read under the discovery root.
    assert sorted(document["sysfs"]) == sorted(card.name for card in inventory.cards)
    card = inventory.cards[0]
    assert document["sysfs"][card.name] == {
        "bdf": card.bdf,
        "driverDir": card.driver_dir,
        "state": prepared_edits.sysfs_state(vendor_node, card.bdf, card.driver_dir, card.name),
    }
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_prepared_edits_are_removed_on_a_node_without_usable_gcus(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    path = os.path.join(str(tmp_path), "prepared-edits.json")
    assert cdi.refresh_prepared_edits(path, devices.discover(vendor_node))
    os.unlink(os.path.join(vendor_node, "dev", "gcuctl"))
    assert not cdi.refresh_prepared_edits(path, devices.discover(vendor_node))
    assert not os.path.exists(path)
    assert not cdi.refresh_prepared_edits(path, devices.discover(vendor_node))  # idempotent


def test_generate_writes_the_prepared_edits_for_the_configs_root(
    vendor_node: str,
    tmp_path: os.PathLike[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prepared = os.path.join(str(tmp_path), "prepared-edits.json")
    config = os.path.join(str(tmp_path), "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"root = {json.dumps(vendor_node)}\nprepared-edits = {json.dumps(prepared)}\n")
    monkeypatch.setenv("ENFLAME_CONTAINER_RUNTIME_CONFIG", config)
    out = os.path.join(str(tmp_path), "cdi")
    assert cli.main(["cdi", "generate", "--output", out, "--prepared-edits", "config"]) == 0
    assert f"enflame-ctk: wrote {prepared}" in capsys.readouterr().err
    with open(prepared, encoding="utf-8") as handle:
        document = json.load(handle)
    assert document["root"] == vendor_node
    assert document["specs"] == [load_spec(os.path.join(out, "enflame.com-gcu.yaml"))]


def test_the_package_ships_the_cdi_schema_unchanged() -> None:
    if not os.path.isdir(CDI_DIR):
        pytest.skip(f"schema folder {CDI_DIR} is absent")
    for name, shipped in cdi_validate.SCHEMA_FILES.items():
        theirs = os.path.join(CDI_DIR, name)
        with open(theirs, "rb") as a, open(os.path.join(cdi_validate.DATA_DIR, shipped), "rb") as b:
            assert b.read() == a.read(), f"{shipped} differs from {theirs}"
    spec = good_spec()
    del spec["devices"][0]["containerEdits"]
    assert cdi_validate.schema_problems(spec, cdi_validate.default_schema_dir()) == [
        "schema: devices/0: 'containerEdits' is a required property"
    ]


def test_validate_checks_the_schema_outside_a_source_checkout(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    # The package alone, as a wheel installs it: no ../shared beside it.
    site = os.path.join(str(tmp_path), "site")
    shutil.copytree(
        os.path.dirname(os.path.dirname(cdi_validate.__file__)),
        os.path.join(site, "enflame_gcu"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    out = os.path.join(str(tmp_path), "cdi")
    generate(vendor_node, out)
    good = os.path.join(out, "enflame.com-gcu.yaml")
    bad = os.path.join(str(tmp_path), "bad.json")
    spec = good_spec()
    spec["devices"][0]["containerEdits"] = {"deviceNodes": "not a list"}
    with open(bad, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)

    def validate(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "enflame_gcu.container_toolkit.cli", "cdi", "validate", path],
            capture_output=True, text=True, check=False, cwd=str(tmp_path),
            env={**os.environ, "PYTHONPATH": site}, timeout=120,
        )  # fmt: skip

    result = validate(good)
    assert result.returncode == 0, result.stderr
    assert "valid (schema and semantic checks)" in result.stdout
    result = validate(bad)
    assert result.returncode == 1
    assert "schema: devices/0/containerEdits/deviceNodes: 'not a list' is not of type" in (
        result.stderr
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["devices"][0]["containerEdits"].update(deviceNodes="not a list"),
        lambda s: s["devices"][0]["containerEdits"].update(mounts=["/x"]),
        lambda s: s["devices"].append("not a mapping"),
        lambda s: s.update(containerEdits={"env": "A=1"}),
    ],
)
def test_a_spec_of_the_wrong_shape_is_a_problem_not_a_crash(change: Any) -> None:
    spec = good_spec()
    change(spec)
    assert cdi_validate.validate(spec, None)  # named problems, no exception


@pytest.mark.usefixtures("no_runtime_config")
def test_list_warns_when_two_spec_files_define_the_same_device(
    vendor_node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # What following §3 and the old §11 of the guide both did: /var/run/cdi and /etc/cdi.
    for directory in ("etc/cdi", "var/run/cdi"):
        assert generate(vendor_node, os.path.join(vendor_node, directory)) == 0
    capsys.readouterr()
    assert cli.main(["cdi", "list", "--host-root", vendor_node]) == 0
    captured = capsys.readouterr()
    # every device twice (17 names: 8 minors, 8 PCI addresses, all; 2 files)
    assert len(captured.out.splitlines()) == 34
    warnings = [line for line in captured.err.splitlines() if "spec files" in line]
    assert len(warnings) == 17
    assert "enflame.com/gcu=0 is defined by 2 spec files" in warnings[0]
    assert cli.main(["cdi", "list", "--host-root", vendor_node, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["duplicates"]["enflame.com/gcu=0"]) == 2


@pytest.mark.usefixtures("no_runtime_config")
def test_list_says_nothing_more_with_one_spec_file(
    vendor_node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cdi", "generate", "--host-root", vendor_node]) == 0
    capsys.readouterr()
    assert cli.main(["cdi", "list", "--host-root", vendor_node, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["duplicates"] == {}
    assert "spec files" not in captured.err
