"""``enflame-ctk migrate`` on simulated nodes seeded with what topscloud leaves (issue 40)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
import tomlkit

from enflame_gcu import node_modes
from enflame_gcu._proto import api_pb2
from enflame_gcu.container_toolkit import doctor, engines, installer, migrate, migrate_plugin
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


NOBODY = 65534


@pytest.mark.parametrize("damage", ["mode 0777", "owned by nobody"])
def test_migrate_repairs_a_vendor_log_directory_others_could_aim_at_ld_so_preload(
    node: str, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48 item 1: whoever can write in /var/log/enflame links our root log anywhere."""
    logdir = os.path.join(node, "var/log/enflame")
    if damage == "mode 0777":
        os.chmod(logdir, 0o777)  # noqa: S103 - the hostile mode under test
    else:
        os.chown(logdir, NOBODY, NOBODY)
    before = fx.snapshot(node)
    assert main(["migrate", "--host-root", node, "--dry-run"]) == 0
    assert "make /var/log/enflame root's and writable by root alone" in capsys.readouterr().out
    assert fx.snapshot(node) == before
    assert main(["migrate", "--host-root", node]) == 0
    info = os.stat(logdir)
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755)
    assert "made /var/log/enflame root's, mode 0755" in capsys.readouterr().err
    assert not migrate.survey(node).pending


@pytest.mark.parametrize(
    "plant", ["nobody's link to /etc", "hard-linked log file", "log file symlink"]
)
def test_migrate_refuses_a_vendor_log_directory_it_cannot_repair_and_changes_nothing(
    node: str, plant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir = os.path.join(node, "var/log/enflame")
    preload = os.path.join(node, "etc/ld.so.preload")
    with open(preload, "w", encoding="utf-8"):
        pass
    logfile = os.path.join(logdir, "enflame-container-runtime.log")
    if plant == "nobody's link to /etc":
        os.rename(logdir, logdir + ".old")
        os.symlink("../../etc", logdir)
        os.chown(logdir, NOBODY, NOBODY, follow_symlinks=False)
    elif plant == "hard-linked log file":
        os.link(preload, logfile)
    else:
        os.symlink("/etc/ld.so.preload", logfile)
    before = fx.snapshot(node)
    assert main(["migrate", "--host-root", node]) != 0
    err = capsys.readouterr().err
    assert "our runtime would not log in /var/log/enflame" in err
    assert "nothing was changed" in err
    assert fx.snapshot(node) == before


VENDOR_RUNTIME = '#!/bin/sh\n# topscloud\'s enflame-container-runtime\nexec runc "$@"\n'


def _install_sh(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", INSTALL_SH, *args, "--host-root", root, "--use-env", DEV_ENV],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_install_sh_migrate_sets_the_vendors_runtime_aside_and_uninstall_puts_it_back(
    make_node: MakeNode,
) -> None:
    """Issue 48 item 3a: the vendor's binary at our path no longer strands the node (a mode
    with our runtime at that path; without one, the vendor's containers keep using theirs)."""
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    binary = os.path.join(root, "usr/bin/enflame-container-runtime")
    fx.write(root, "/usr/bin/enflame-container-runtime", VENDOR_RUNTIME)
    os.chmod(binary, 0o755)  # noqa: S103 - an executable, as the vendor's
    done = _install_sh(root, "--migrate", "--mode", "runtimeclass")
    assert done.returncode == 0, done.stderr
    assert "topscloud's runtime, not ours; set aside as" in done.stderr
    assert os.path.islink(binary)
    assert _read(root, "/usr/bin/enflame-container-runtime.topscloud") == VENDOR_RUNTIME
    undone = _install_sh(root, "--uninstall")
    assert undone.returncode == 0, undone.stderr
    assert not os.path.islink(binary)
    assert _read(root, "/usr/bin/enflame-container-runtime") == VENDOR_RUNTIME
    assert not os.path.lexists(binary + ".topscloud")


def test_install_sh_migrate_that_would_be_refused_changes_nothing(make_node: MakeNode) -> None:
    """The whole install is dry-run before migrate touches the node (issue 48 item 3a)."""
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    fx.write(root, "/usr/bin/enflame-container-runtime", VENDOR_RUNTIME)
    fx.write(root, "/usr/bin/enflame-container-runtime.topscloud", "an older copy\n")
    before = fx.snapshot(root)
    done = _install_sh(root, "--migrate", "--mode", "runtimeclass")
    assert done.returncode != 0
    assert "exists already" in done.stderr and "nothing was migrated" in done.stderr
    assert fx.snapshot(root) == before


def _checkpoint(root: str, responses: list[bytes]) -> None:
    """The kubelet's device checkpoint with one container per answer, as kubelet 1.20 writes
    it (AllocResp: the marshalled ContainerAllocateResponse, base64 in JSON)."""
    entries = [
        {
            "PodUID": f"pod-{n}",
            "ContainerName": "main",
            "ResourceName": "enflame.com/gcu",
            "DeviceIDs": {"0": [f"gcu{n}"]},
            "AllocResp": base64.b64encode(response).decode(),
        }
        for n, response in enumerate(responses)
    ]
    data = {"PodDeviceEntries": entries, "RegisteredDevices": {"enflame.com/gcu": CARDS}}
    fx.write(
        root,
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
        json.dumps({"Data": data, "Checksum": 0}),
    )


CARDS = [f"gcu{n}" for n in range(8)]
VENDOR_ANSWER = api_pb2.ContainerAllocateResponse(
    envs={"ENFLAME_VISIBLE_DEVICES": "0"}
).SerializeToString()
OUR_ANSWER = api_pb2.ContainerAllocateResponse(
    envs={"ENFLAME_VISIBLE_DEVICES": "1"},
    devices=[
        api_pb2.DeviceSpec(container_path="/dev/gcu1", host_path="/dev/gcu1", permissions="rw")
    ],
).SerializeToString()


def _default_runtime(root: str) -> str:
    document = tomlkit.parse(_read(root, "/etc/containerd/config.toml")).unwrap()
    return str(
        document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"]
    )


def test_the_adopted_default_stays_while_a_pod_holds_a_vendor_answer_by_environment(
    make_node: MakeNode,
) -> None:
    """Issue 48 item 3b: a restarted container gets the vendor's checkpointed answer again."""
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    _checkpoint(root, [VENDOR_ANSWER, OUR_ANSWER])
    assert main(["migrate", "--host-root", root]) == 0
    outcome = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert outcome.mode == "device-specs"
    assert _default_runtime(root) == "enflame"
    kept = [line for line in outcome.lines if line.startswith("kept topscloud's containerd")]
    assert kept and "pod pod-0/main" in kept[0] and "pod-1" not in kept[0]
    # The pod is gone (only ours, with DeviceSpecs, is held): the next install takes it out.
    _checkpoint(root, [OUR_ANSWER])
    again = installer.install(installer.InstallOptions(host_root=root, mode="auto"))
    assert _default_runtime(root) == "runc"
    assert any("migrate adopted" in line for line in again.lines)


def test_an_unreadable_checkpointed_answer_counts_as_needing_the_runtime(
    make_node: MakeNode,
) -> None:
    assert migrate_plugin.needs_the_runtime(VENDOR_ANSWER)
    assert not migrate_plugin.needs_the_runtime(OUR_ANSWER)
    assert not migrate_plugin.needs_the_runtime(b"")
    with pytest.raises(ValueError):
        migrate_plugin.needs_the_runtime(VENDOR_ANSWER[:-1])
    root = make_node("vendor-8card")
    _checkpoint(root, [VENDOR_ANSWER[:-1], OUR_ANSWER, b""])
    assert migrate_plugin.env_only_holders(root) == ["pod pod-0/main"]
