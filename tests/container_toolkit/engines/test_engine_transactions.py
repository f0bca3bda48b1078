"""Every engine: idempotent, exactly revertible, dry-run safe, serialized, clear on I/O errors."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from collections.abc import Iterator

import pytest
import tomlkit

from enflame_gcu.container_toolkit import engines
from enflame_gcu.errors import EngineConfigError
from tests.container_toolkit.engines.conftest import InstallGolden
from tests.container_toolkit.engines.helpers import golden_text, listing, read

# (engine, golden input, where it goes, the file configure writes, relative to the config dir)
CASES = {
    "docker": ("docker", "docker-existing.json", "daemon.json", "daemon.json"),
    "containerd-v1": ("containerd", "containerd-v1.toml", "config.toml", "config.toml"),
    "containerd-v2": ("containerd", "containerd-v2.toml", "config.toml", "config.toml"),
    "containerd-v3": ("containerd", "containerd-v3.toml", "config.toml", "config.toml"),
    "crio": ("crio", "crio.conf", "crio.conf", "crio.conf.d/99-enflame.toml"),
}
FULL = engines.RuntimeOptions(set_as_default=True, cdi=True)


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, install_golden: InstallGolden) -> tuple[str, str, str]:
    """(engine, config path, path of the file configure edits) for each engine."""
    engine, golden, name, target = CASES[request.param]
    path = install_golden(golden, os.path.join("cfg", name))
    return engine, path, os.path.join(os.path.dirname(path), target)


def snapshot(directory: str) -> dict[str, tuple[bytes, int]]:
    """Content and inode of every file under ``directory``."""
    result = {}
    for rel in listing(directory):
        full = os.path.join(directory, rel)
        if os.path.isfile(full):
            with open(full, "rb") as handle:
                result[rel] = (handle.read(), os.stat(full).st_ino)
    return result


def test_second_configure_writes_nothing(case: tuple[str, str, str]) -> None:
    engine, path, _ = case
    engines.configure(engine, path, FULL)
    before = snapshot(os.path.dirname(path))
    change = engines.configure(engine, path, FULL)
    assert not change.changed
    assert change.diff == ""
    assert snapshot(os.path.dirname(path)) == before  # same bytes, same inodes, no new backup


def test_unconfigure_restores_the_original_byte_for_byte(case: tuple[str, str, str]) -> None:
    engine, path, _ = case
    directory = os.path.dirname(path)
    before = snapshot(directory)
    engines.configure(engine, path, FULL)
    engines.configure(engine, path, engines.RuntimeOptions(runtime_path="/opt/gcu/runtime"))
    assert snapshot(directory) != before
    engines.unconfigure(engine, path)
    assert {k: v[0] for k, v in snapshot(directory).items()} == {k: v[0] for k, v in before.items()}
    assert engines.unconfigure(engine, path).files == ()  # nothing left to undo


def test_unconfigure_keeps_edits_made_by_others(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{\n  "default-runtime": "runc"\n}\n')
    engines.configure("docker", path, FULL)
    config = json.loads(read(path))
    config["log-level"] = "debug"  # someone else's change
    config["runtimes"]["kata"] = {"path": "/usr/bin/kata"}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    change = engines.unconfigure("docker", path)
    assert json.loads(read(path)) == {
        "default-runtime": "runc",
        "runtimes": {"kata": {"path": "/usr/bin/kata"}},
        "log-level": "debug",
    }
    assert any("kept theirs" in note for note in change.notes)
    backups = [n for n in os.listdir(str(tmp_path)) if ".enflame-backup-" in n]
    assert len(backups) == 1  # kept, since the file is no longer what we backed up


def test_a_value_changed_by_others_is_not_reverted(install_golden: InstallGolden) -> None:
    path = install_golden("containerd-v2.toml", "config.toml")
    engines.configure("containerd", path, FULL)
    text = read(path).replace('default_runtime_name = "enflame"', 'default_runtime_name = "kata"')
    text = text.replace("# keep in sync with kubeadm", "# pinned by ops")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    engines.unconfigure("containerd", path)
    result = read(path)
    config = tomlkit.parse(result).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]
    assert config["containerd"]["default_runtime_name"] == "kata"
    assert "enflame" not in config["containerd"]["runtimes"]
    assert "enable_cdi" not in config
    assert "# pinned by ops" in result


def test_reconfigure_after_foreign_edit_then_unconfigure_keeps_the_edit(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    engines.configure("docker", path)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"debug": true}\n')  # someone rewrote it, dropping our runtime
    engines.configure("docker", path)
    assert json.loads(read(path))["runtimes"]["enflame"]["path"].endswith("runtime")
    engines.unconfigure("docker", path)
    assert json.loads(read(path)) == {"debug": True}


def test_dry_run_changes_nothing_and_prints_a_diff(
    case: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, path, target = case
    directory = os.path.dirname(path)
    before = snapshot(directory)
    change = engines.configure(engine, path, FULL, dry_run=True)
    assert change.dry_run and change.changed
    assert f"+++ {target}" in change.diff
    assert "enflame-container-runtime" in change.diff
    assert snapshot(directory) == before
    engines.configure(engine, path, FULL)
    after = snapshot(directory)
    undo = engines.unconfigure(engine, path, dry_run=True)
    assert "-" in undo.diff and "enflame-container-runtime" in undo.diff
    assert snapshot(directory) == after


def _configure_in_child(path: str) -> None:
    engines.configure("containerd", path, FULL)


def test_concurrent_configures_make_exactly_one_entry(install_golden: InstallGolden) -> None:
    path = install_golden("containerd-v2.toml", "config.toml")
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_configure_in_child, args=(path,)) for _ in range(8)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    text = read(path)
    assert text.count("runtimes.enflame]") == 1
    assert text.count('BinaryName = "/usr/bin/enflame-container-runtime"') == 1
    assert tomlkit.parse(text)["version"] == 2
    names = os.listdir(os.path.dirname(path))
    assert len([n for n in names if ".enflame-backup-" in n]) == 1
    assert not [n for n in names if n.endswith(".lock") or n.endswith(".tmp")]
    engines.unconfigure("containerd", path)
    assert read(path) == golden_text("containerd-v2.toml")


def _unconfigure_in_child(engine: str, path: str) -> None:
    engines.unconfigure(engine, path)


@pytest.mark.parametrize(
    ("engine", "config"),
    [
        ("docker", "etc/docker/daemon.json"),
        ("containerd", "etc/containerd/config.toml"),
        ("crio", "etc/crio/crio.conf"),
    ],
)
def test_unconfigure_where_the_engine_is_not_leaves_no_directory(
    tmp_path: os.PathLike[str], engine: str, config: str
) -> None:
    """The package's prerm unconfigures every engine: on a node without CRI-O that made an
    empty /etc/crio (for the lock file) and left it. Also with eight at once: none of them
    makes the directory, even for a moment another one could find it in."""
    path = os.path.join(str(tmp_path), config)
    engines.unconfigure(engine, path)
    assert os.listdir(str(tmp_path)) == []
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_unconfigure_in_child, args=(engine, path)) for _ in range(8)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert os.listdir(str(tmp_path)) == []


def test_config_path_under_a_regular_file_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    blocker = os.path.join(str(tmp_path), "etc")
    with open(blocker, "w", encoding="utf-8") as handle:
        handle.write("not a directory")
    with pytest.raises(EngineConfigError, match=r"cannot .* Not a directory; nothing was changed"):
        engines.configure("docker", os.path.join(blocker, "docker", "daemon.json"))
    assert listing(str(tmp_path)) == ["etc"]


@pytest.fixture
def immutable_dir(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A directory even root cannot write into (ext4 immutable flag): chattr +i."""
    directory = os.path.join(str(tmp_path), "docker")
    os.mkdir(directory)
    with open(os.path.join(directory, "daemon.json"), "w", encoding="utf-8") as handle:
        handle.write('{"debug": true}\n')
    result = subprocess.run(["chattr", "+i", directory], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(
            f"chattr +i is not supported here ({result.stderr.strip()}); as root no "
            "other way makes a directory unwritable"
        )
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", directory], check=True)


def test_unwritable_directory_is_a_clear_error_and_changes_nothing(immutable_dir: str) -> None:
    path = os.path.join(immutable_dir, "daemon.json")
    with pytest.raises(EngineConfigError, match="Operation not permitted; nothing was changed"):
        engines.configure("docker", path)
    assert read(path) == '{"debug": true}\n'
    assert os.listdir(immutable_dir) == ["daemon.json"]


def test_unknown_engine_names_the_known_ones(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(EngineConfigError, match="known: docker, containerd, crio"):
        engines.configure("podman", os.path.join(str(tmp_path), "x"))


def test_immutable_config_file_rolls_back_backup_and_state(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"debug": true}\n')
    result = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"chattr +i is not supported here ({result.stderr.strip()})")
    try:
        with pytest.raises(
            EngineConfigError, match=f"cannot write {path}: Operation not permitted"
        ):
            engines.configure("docker", path)
    finally:
        subprocess.run(["chattr", "-i", path], check=True)
    assert read(path) == '{"debug": true}\n'
    assert listing(str(tmp_path)) == ["daemon.json"]  # no backup, state or lock left behind
