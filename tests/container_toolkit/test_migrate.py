"""``enflame-ctk migrate`` on simulated nodes seeded with what topscloud leaves (issue 40)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tomlkit

from enflame_gcu import node_modes
from enflame_gcu.container_toolkit import doctor, engines, installer, migrate
from enflame_gcu.container_toolkit.cli import main
from tests.conftest import PROJECT_ROOT, MakeNode
from tests.container_toolkit import installer_fixtures as fx
from tests.container_toolkit import topscloud_files as vendor

CRI = ("plugins", "io.containerd.grpc.v1.cri", "containerd")
INSTALL_SH = os.path.join(PROJECT_ROOT, "deploy", "install.sh")
DEV_ENV = os.path.dirname(os.path.dirname(sys.executable))


def _read(root: str, path: str) -> str:
    with open(os.path.join(root, path.lstrip("/")), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture
def node(make_node: MakeNode) -> str:
    root = make_node("vendor-8card")
    vendor.seed(root, crio=True)
    return root


def test_the_issue_loop_unconfigure_found_nothing_to_undo_on_the_vendors_entries(
    node: str,
) -> None:
    """Before migrate: the vendor's default runtime cannot be taken out by unconfigure."""
    change = engines.unconfigure("containerd", host_root=node)
    assert not change.changed and "nothing to undo" in change.describe()


def test_dry_run_shows_every_leftover_and_changes_nothing(
    node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = fx.snapshot(node)
    assert main(["migrate", "--host-root", node, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "adopt docker's topscloud entries in /etc/docker/daemon.json" in out
    assert 'default-runtime = "enflame"' in out  # daemon.json's own (JSON) spelling
    assert "adopt containerd's topscloud entries in /etc/containerd/config.toml" in out
    assert "adopt crio's topscloud entries in /etc/crio/crio.conf.d/99-enflame.toml" in out
    assert "set /etc/enflame-container-runtime/config.toml aside" in out
    assert "keep /var/log/enflame" in out
    assert fx.snapshot(node) == before


def test_migrate_adopts_so_unconfigure_removes_exactly_the_vendors_entries(node: str) -> None:
    configs = {
        "docker": "/etc/docker/daemon.json",
        "containerd": "/etc/containerd/config.toml",
        "crio": "/etc/crio/crio.conf.d/99-enflame.toml",
    }
    seeded = {engine: _read(node, path) for engine, path in configs.items()}
    assert main(["migrate", "--host-root", node]) == 0
    # Adopting writes no engine config: each is byte for byte the vendor's, and backed up.
    for engine, path in configs.items():
        assert _read(node, path) == seeded[engine]
        directory = os.path.dirname(os.path.join(node, path.lstrip("/")))
        if engine == "crio":
            directory = os.path.join(node, "etc/crio")
        backups = [n for n in os.listdir(directory) if ".enflame-backup-" in n]
        assert backups, engine
    assert os.path.exists(os.path.join(node, "etc/enflame-container-runtime/config.toml.topscloud"))
    assert not os.path.exists(os.path.join(node, "etc/enflame-container-runtime/config.toml"))
    # A second run finds nothing left.
    assert not migrate.survey(node).pending

    for engine in configs:
        assert engines.unconfigure(engine, host_root=node).changed, engine
    daemon = json.loads(_read(node, configs["docker"]))
    expected = json.loads(seeded["docker"])
    del expected["default-runtime"], expected["runtimes"]
    assert daemon == expected  # every other key of the vendor's template kept
    document = tomlkit.parse(_read(node, configs["containerd"])).unwrap()
    table = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert table["default_runtime_name"] == "runc"
    assert set(table["runtimes"]) == {"runc"}
    assert table["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert "# written by provisioning" in _read(node, configs["containerd"])
    assert not os.path.exists(os.path.join(node, configs["crio"].lstrip("/")))  # only theirs
    # The backup of the vendor's file outlives the undo: the one copy of topscloud's setup.
    [backup] = [n for n in os.listdir(os.path.join(node, "etc/docker")) if "backup" in n]
    assert _read(node, f"/etc/docker/{backup}") == seeded["docker"]


def test_an_entry_of_ours_is_not_adopted_again(make_node: MakeNode) -> None:
    root = make_node("vendor-8card")
    fx.fake_host(root, containerd=False)
    engines.configure("docker", host_root=root, options=engines.RuntimeOptions())
    assert migrate.survey(root).foreign == ()


def test_the_migrated_containerd_config_is_read_by_a_real_containerd(node: str) -> None:
    assert main(["migrate", "--host-root", node]) == 0
    engines.unconfigure("containerd", host_root=node)
    config = os.path.join(node, "etc/containerd/config.toml")
    dump = subprocess.run(
        ["containerd", "--config", config, "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    cri = tomlkit.parse(dump).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "runc"
    assert "enflame" not in cri["runtimes"]


def _doctor(root: str, name: str) -> doctor.Result:
    (result,) = [r for r in doctor.run(root) if r.name == name]
    return result


def _device_specs_node(make_node: MakeNode) -> str:
    """The issue's node: device-specs recorded, the vendor's enflame containerd's default."""
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    record = node_modes.Record("device-specs", "containerd", "1.6", "explicit", "test")
    fx.write(root, node_modes.MODE_FILE, record.to_json())
    return root


def test_doctor_fixes_the_vendors_default_with_migrate_first_and_the_fix_works(
    make_node: MakeNode,
) -> None:
    """Issue 40: doctor's fix was `runtime unconfigure`, which found nothing to undo."""
    root = _device_specs_node(make_node)
    mode = _doctor(root, "node-mode")
    assert mode.status == "fail"
    assert mode.fix.startswith(f"enflame-ctk migrate --host-root {root} && ")
    # Followed as printed, the node then passes.
    for command in mode.fix.split(" && "):
        assert main(command.split()[1:]) == 0, command
    assert _doctor(root, "node-mode").status == "pass"
    assert _doctor(root, "topscloud").status == "pass"


def test_doctor_names_a_half_migrated_node_and_the_one_command_that_finishes_it(
    make_node: MakeNode,
) -> None:
    root = _device_specs_node(make_node)
    result = _doctor(root, "topscloud")
    assert result.status == "fail" and "half migrated" in result.detail
    assert result.fix == f"enflame-ctk migrate --host-root {root}"
    assert main(result.fix.split()[1:]) == 0
    assert _doctor(root, "topscloud").status == "pass"


def test_doctor_on_a_topscloud_node_warns_with_the_dry_run(make_node: MakeNode) -> None:
    root = make_node("vendor-8card")
    vendor.seed(root)
    result = _doctor(root, "topscloud")
    assert result.status == "warn" and "a topscloud node" in result.detail
    assert result.fix.startswith(f"enflame-ctk migrate --dry-run --host-root {root}")


def test_install_after_migrate_takes_the_adopted_default_out_in_device_specs(
    make_node: MakeNode,
) -> None:
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    assert main(["migrate", "--host-root", root]) == 0
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "device-specs"
    document = tomlkit.parse(_read(root, "/etc/containerd/config.toml")).unwrap()
    table = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert table["default_runtime_name"] == "runc" and "enflame" not in table["runtimes"]
    assert any("migrate adopted" in line for line in outcome.lines)


def test_install_sh_migrate_moves_a_topscloud_kubernetes_node_to_device_specs(
    make_node: MakeNode,
) -> None:
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    done = subprocess.run(
        ["bash", INSTALL_SH, "--migrate", "--host-root", root, "--use-env", DEV_ENV],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "adopted containerd's topscloud entries" in done.stderr
    assert "node mode device-specs (auto)" in done.stderr
    document = tomlkit.parse(_read(root, "/etc/containerd/config.toml")).unwrap()
    table = document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert table["default_runtime_name"] == "runc" and "enflame" not in table["runtimes"]
    assert _doctor(root, "topscloud").status == "pass"
