"""``--host-root`` / ``--root`` is a jail for install, doctor and labels: links stay inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from enflame_gcu.container_toolkit import cdi_keeper, doctor, installer
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.errors import PathOutsideRootError
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx

FOREIGN = '{"runtimes": {"enflame": {"path": "/outside/of/the/host"}}}\n'


@pytest.fixture
def outside() -> Iterator[str]:
    """A docker config dir of this process's own tree, which no host-root run may touch."""
    directory = tempfile.mkdtemp(prefix="enflame-outside-")
    fx.write(directory, "/daemon.json", FOREIGN)
    yield directory
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def _link_docker_dir(root: str, outside: str) -> str:
    """Make the host's /etc/docker an absolute link to ``outside`` (a path on the host)."""
    inside = os.path.join(root, outside.lstrip("/"))
    os.makedirs(inside)
    os.rename(os.path.join(root, "etc/docker/daemon.json"), os.path.join(inside, "daemon.json"))
    os.rmdir(os.path.join(root, "etc/docker"))
    os.symlink(outside, os.path.join(root, "etc/docker"))
    return os.path.join(inside, "daemon.json")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_install_and_uninstall_follow_host_links_inside_the_host_root(
    tmp_path: object, outside: str
) -> None:
    host = fx.fake_host(str(tmp_path))
    inside = _link_docker_dir(host, outside)
    original = _read(inside)

    installer.install(installer.InstallOptions(host_root=host, set_as_default=True))
    assert _read(os.path.join(outside, "daemon.json")) == FOREIGN
    assert os.listdir(outside) == ["daemon.json"]
    assert json.loads(_read(inside))["default-runtime"] == "enflame"
    assert os.path.islink(os.path.join(host, "etc/docker"))

    installer.uninstall(host)
    assert _read(inside) == original
    assert _read(os.path.join(outside, "daemon.json")) == FOREIGN


def test_doctor_reads_engine_configs_inside_the_root(make_node: MakeNode, outside: str) -> None:
    root = make_node("vendor-8card")
    fx.fake_host(root)
    inside = _link_docker_dir(root, outside)
    fx.write(root, "/usr/bin/enflame-container-runtime", "#!/bin/sh\n", 0o755)
    main(["runtime", "configure", "--runtime", "docker", "--host-root", root, "--set-as-default"])
    assert "enflame-container-runtime" in _read(inside)
    result = next(r for r in doctor.run(root) if r.name == "engine-docker")
    assert result.status == "pass", result
    assert "/usr/bin/enflame-container-runtime is the default" in result.detail


@pytest.mark.parametrize("command", ["labels", "doctor"])
def test_a_root_whose_dev_leads_outside_it_is_refused(
    make_node: MakeNode, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_node("vendor-8card")
    dev = os.path.join(root, "dev")
    os.rename(dev, os.path.join(root, "dev.real"))
    os.symlink("/dev", dev)  # on the host: its own /dev; from here: this process's /dev
    argv = [command, "--host-root", root] + (["--output", "-"] if command == "labels" else [])
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "/dev under the host root" in err and "refused" in err


def test_cdi_watch_refuses_a_root_whose_dev_leads_outside_it(make_node: MakeNode) -> None:
    """Issue 22 item 8: ``cdi watch`` skipped the check ``cdi generate`` makes (and then wrote
    specs of this process's own /dev); before, this ran until the timeout."""
    root = make_node("vendor-8card")
    dev = os.path.join(root, "dev")
    os.rename(dev, os.path.join(root, "dev.real"))
    os.symlink("/dev", dev)
    output = os.path.join(root, "var/run/cdi")
    ctk = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]
    result = subprocess.run(
        [*ctk, "cdi", "watch", "--host-root", root, "--output", output],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "/dev under the host root" in result.stderr and "refused" in result.stderr
    assert not os.path.exists(output)
    with pytest.raises(PathOutsideRootError):
        cdi_keeper.refresh(root, output)
