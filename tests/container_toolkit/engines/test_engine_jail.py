"""Engine config edits under a host root (a jail), through symlinks, keeping modes and owners."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator

import pytest
import tomlkit

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import engines
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.errors import PathOutsideRootError
from tests.container_toolkit import installer_fixtures as fx
from tests.container_toolkit.engines.helpers import read

SECRET = '{\n    "registry-mirrors": [],\n    "auths": {"registry.example": "c2VjcmV0"}\n}\n'
RUNTIME = "/usr/bin/enflame-container-runtime"


@pytest.fixture
def outside() -> Iterator[str]:
    """A directory of this process's own tree, outside every host root: must stay untouched."""
    directory = tempfile.mkdtemp(prefix="enflame-outside-")
    fx.write(directory, "/daemon.json", SECRET)
    yield directory
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def _tree(directory: str) -> dict[str, bytes]:
    found = {}
    for parent, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(parent, name), "rb") as handle:
                found[os.path.relpath(os.path.join(parent, name), directory)] = handle.read()
    return found


def test_absolute_symlink_in_the_host_tree_is_followed_inside_the_root(
    tmp_path: os.PathLike[str], outside: str
) -> None:
    # /host/etc/docker -> <outside> as the host wrote it: on the host that is <root><outside>,
    # never this process's own <outside>.
    root = str(tmp_path)
    fx.write(root, "/usr/bin/dockerd", "#!/bin/sh\n", 0o755)
    inside = fx.write(root, f"{outside}/daemon.json", '{"debug": true}\n')
    os.makedirs(os.path.join(root, "etc"))
    os.symlink(outside, os.path.join(root, "etc/docker"))
    before = _tree(outside)

    change = engines.configure("docker", None, engines.RuntimeOptions(), host_root=root)

    assert change.changed
    assert _tree(outside) == before
    assert json.loads(read(inside))["runtimes"]["enflame"]["path"] == RUNTIME
    engines.unconfigure("docker", None, host_root=root)
    assert read(inside) == '{"debug": true}\n'
    assert _tree(outside) == before


def test_a_path_that_would_leave_the_root_is_refused_and_nothing_changes(
    tmp_path: os.PathLike[str], outside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = os.path.join(str(tmp_path), "host")
    fx.write(root, "/usr/bin/dockerd", "#!/bin/sh\n", 0o755)
    os.makedirs(os.path.join(root, "etc"))
    # Relative, but climbing past the root into this process's tree.
    climb = os.path.relpath(outside, os.path.join(root, "etc"))
    os.symlink(climb, os.path.join(root, "etc/docker"))
    before = _tree(outside)

    with pytest.raises(PathOutsideRootError, match=r"out of the host root .*refused"):
        engines.configure("docker", None, engines.RuntimeOptions(), host_root=root)
    assert main(["runtime", "configure", "--runtime", "docker", "--host-root", root]) == 1
    assert "refused" in capsys.readouterr().err
    assert _tree(outside) == before


def test_explicit_config_under_the_host_root_is_jailed_too(
    tmp_path: os.PathLike[str], outside: str
) -> None:
    root = str(tmp_path)
    inside = fx.write(root, f"{outside}/daemon.json", "{}\n")
    os.makedirs(os.path.join(root, "etc"))
    os.symlink(outside, os.path.join(root, "etc/docker"))
    before = _tree(outside)
    config = os.path.join(root, "etc/docker/daemon.json")
    engines.configure("docker", config, engines.RuntimeOptions(), host_root=root)
    assert _tree(outside) == before
    assert "enflame" in read(inside)


@pytest.mark.parametrize("jailed", [True, False], ids=["host-root", "root-/"])
def test_symlinked_config_stays_a_symlink_and_its_target_is_restored(
    tmp_path: os.PathLike[str], jailed: bool
) -> None:
    root = str(tmp_path)
    real = fx.write(root, "/srv/containerd/config.toml", fx.CONTAINERD_V2)
    link = os.path.join(root, "etc/containerd/config.toml")
    os.makedirs(os.path.dirname(link))
    # As the host sees it: an absolute link; with root "/" it is this process's own path.
    os.symlink("/srv/containerd/config.toml" if jailed else real, link)
    host_root = root if jailed else "/"
    config = None if jailed else link

    engines.configure("containerd", config, engines.RuntimeOptions(), host_root=host_root)
    assert os.path.islink(link) and os.readlink(link) in ("/srv/containerd/config.toml", real)
    cri = tomlkit.parse(read(real)).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["runtimes"]["enflame"]["options"]["BinaryName"] == RUNTIME

    engines.unconfigure("containerd", config, host_root=host_root)
    assert os.path.islink(link)
    assert read(real) == fx.CONTAINERD_V2


def test_backup_state_and_live_file_keep_mode_and_owner(tmp_path: os.PathLike[str]) -> None:
    directory = str(tmp_path)
    config = fx.write(directory, "/daemon.json", SECRET, 0o600)
    os.chown(config, 1234, 5678)

    engines.configure("docker", config, engines.RuntimeOptions(set_as_default=True))

    backups = [n for n in os.listdir(directory) if ".enflame-backup-" in n]
    assert len(backups) == 1
    for path in (config, os.path.join(directory, backups[0]), config + ".enflame-state.json"):
        info = os.stat(path)
        assert (oct(info.st_mode & 0o777), info.st_uid, info.st_gid) == ("0o600", 1234, 5678), path
    engines.unconfigure("docker", config)
    info = os.stat(config)
    assert (oct(info.st_mode & 0o777), info.st_uid, info.st_gid) == ("0o600", 1234, 5678)
    assert read(config) == SECRET


def test_resolve_keeps_every_link_in_the_root(tmp_path: os.PathLike[str]) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "a/b"))
    os.symlink("/a", os.path.join(root, "abs"))
    os.symlink("../a/b", os.path.join(root, "a/rel"))
    os.symlink("/", os.path.join(root, "top"))
    os.symlink("loop", os.path.join(root, "loop"))
    os.symlink("../../..", os.path.join(root, "a/b/up"))
    real = os.path.realpath(root)
    assert fileio.resolve(root, "/abs/b/file") == f"{real}/a/b/file"
    assert fileio.resolve(root, "/a/rel/x") == f"{real}/a/b/x"
    assert fileio.resolve(root, "/top/top/a") == f"{real}/a"
    assert fileio.resolve(root, "/abs", follow=False) == f"{real}/abs"
    assert fileio.resolve(root, "/missing/../a") == f"{real}/a"
    with pytest.raises(PathOutsideRootError, match="more than 40 symlinks"):
        fileio.resolve(root, "/loop")
    with pytest.raises(PathOutsideRootError, match="out of the host root"):
        fileio.resolve(root, "/a/b/up/etc/passwd")
    with pytest.raises(PathOutsideRootError, match="out of the host root"):
        fileio.resolve(root, "/../etc")
