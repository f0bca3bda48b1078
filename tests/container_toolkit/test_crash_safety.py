"""SIGKILL the engine config editors and the installer at every fault point; then re-run.

The fault points are ``fileio.fault_point`` calls, armed only by ``$ENFLAME_TEST_KILL_AT``
(test-only): ``NAME`` kills at the first pass, ``NAME:N`` at the N-th. After each kill the
config is either the old or the new version (never a mix), and a plain re-run converges: the
same result as an uninterrupted run, and an undo that gives back the original bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import installer
from tests.container_toolkit import installer_fixtures as fx

CTK = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]
CONFIGURE_POINTS = ["configure-recorded", "configure-backed-up", "configure-wrote-file"]
ENGINES = {
    "docker": ("daemon.json", fx.DAEMON_JSON),
    "containerd": ("config.toml", fx.CONTAINERD_V2),
}


def _ctk(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(fileio.FAULT_ENV, None)
    if kill_at:
        env[fileio.FAULT_ENV] = kill_at
    return subprocess.run(
        [*CTK, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _configured(tmp_path: str, engine: str) -> str:
    """What an uninterrupted configure writes."""
    name, text = ENGINES[engine]
    path = fx.write(os.path.join(tmp_path, "clean"), f"/{name}", text)
    assert _ctk("runtime", "configure", "--runtime", engine, "--config", path).returncode == 0
    return _read(path)


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("point", CONFIGURE_POINTS)
def test_configure_killed_at_each_point_leaves_old_or_new_and_converges(
    tmp_path: os.PathLike[str], engine: str, point: str
) -> None:
    name, original = ENGINES[engine]
    new = _configured(str(tmp_path), engine)
    path = fx.write(os.path.join(str(tmp_path), "node"), f"/{name}", original)
    args = ("runtime", "configure", "--runtime", engine, "--config", path)

    killed = _ctk(*args, kill_at=point)

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _read(path) in (original, new)
    assert _ctk(*args).returncode == 0
    assert _read(path) == new
    assert _ctk("runtime", "unconfigure", "--runtime", engine, "--config", path).returncode == 0
    assert _read(path) == original
    assert sorted(os.listdir(os.path.dirname(path))) == [name]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_unconfigure_killed_after_its_write_converges(
    tmp_path: os.PathLike[str], engine: str
) -> None:
    name, original = ENGINES[engine]
    path = fx.write(str(tmp_path), f"/{name}", original)
    assert _ctk("runtime", "configure", "--runtime", engine, "--config", path).returncode == 0
    new = _read(path)
    args = ("runtime", "unconfigure", "--runtime", engine, "--config", path)

    killed = _ctk(*args, kill_at="unconfigure-wrote-file")

    assert killed.returncode == -signal.SIGKILL
    assert _read(path) in (original, new)
    assert _ctk(*args).returncode == 0
    assert _read(path) == original
    assert sorted(os.listdir(str(tmp_path))) == [name]


def _record_count(tmp_path: str) -> int:
    """How many times a clean install passes the install-recorded fault point."""
    host = fx.fake_host(os.path.join(tmp_path, "count"))
    run = installer.begin(installer.InstallOptions(host_root=host, set_as_default=True))
    calls = 0
    record = run.record

    def counting(action: dict[str, object]) -> None:
        nonlocal calls
        calls += 1
        record(action)

    run.record = counting  # type: ignore[method-assign]
    installer.install(installer.InstallOptions(host_root=host, set_as_default=True), run)
    return calls


@pytest.mark.timeout(600)  # three enflame-ctk runs per recorded step (now with the logrotate file)
def test_installer_killed_at_every_recorded_step_converges(tmp_path: os.PathLike[str]) -> None:
    total = _record_count(str(tmp_path))
    assert total >= 10
    for nth in range(1, total + 1):
        host = fx.fake_host(os.path.join(str(tmp_path), f"host-{nth}"))
        original = fx.snapshot(host)
        daemon = os.path.join(host, "etc/docker/daemon.json")
        containerd = os.path.join(host, "etc/containerd/config.toml")
        args = ("install", "--host-root", host, "--set-as-default")

        killed = _ctk(*args, kill_at=f"install-recorded:{nth}")

        assert killed.returncode == -signal.SIGKILL, (nth, killed.stderr)
        # Each engine config is whole: the original or a complete configured version.
        assert _read(containerd) == fx.CONTAINERD_V2 or "enflame" in _read(containerd)
        json.loads(_read(daemon))
        assert _ctk(*args).returncode == 0, nth
        assert json.loads(_read(daemon))["default-runtime"] == "enflame"
        assert "BinaryName" in _read(containerd)
        assert _ctk("uninstall", "--host-root", host).returncode == 0, nth
        assert fx.diff(original, fx.snapshot(host)) == [], nth
