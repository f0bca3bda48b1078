"""A failed or stopped install takes back only what that run changed; uninstall keeps the rest.

Every test starts from a node that already has a working install (or a runtime entry someone
else made) and checks that it survives: a failed re-install, the DaemonSet's SIGTERM undo and
an uninstall all leave it exactly as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from enflame_gcu.container_toolkit import engines, installer
from enflame_gcu.container_toolkit.cli import main
from enflame_gcu.errors import InstallError
from tests.conftest import PROJECT_ROOT
from tests.container_toolkit import installer_fixtures as fx

CTK = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]
INSTALL_SH = os.path.join(PROJECT_ROOT, "deploy", "install.sh")
DEV_ENV = os.path.dirname(os.path.dirname(sys.executable))
VENDOR = "/opt/vendor/bin/enflame-container-runtime"


@pytest.fixture
def host(tmp_path: object) -> str:
    return fx.fake_host(str(tmp_path))


def _daemon(host: str) -> dict[str, object]:
    with open(os.path.join(host, "etc/docker/daemon.json"), encoding="utf-8") as handle:
        return dict(json.load(handle))


def _break_containerd(host: str) -> None:
    fx.write(host, "/etc/containerd/config.toml", "version = 2\n[plugins\n")


def _install_sh(host: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["bash", INSTALL_SH, "--host-root", host, "--use-env", DEV_ENV, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=110, check=False)


def test_failed_reinstall_by_install_sh_keeps_the_working_install(host: str) -> None:
    assert _install_sh(host).returncode == 0
    _break_containerd(host)
    before = fx.snapshot(host)

    result = _install_sh(host)

    assert result.returncode == 1
    assert "config.toml" in result.stderr and "not valid TOML" in result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []
    daemon = _daemon(host)
    assert daemon["default-runtime"] == "enflame"
    assert os.path.islink(os.path.join(host, "usr/bin/enflame-container-runtime"))
    assert os.path.isfile(os.path.join(host, "opt/enflame-gcu/bin/enflame-container-runtime"))


def test_failed_reinstall_takes_back_only_what_this_run_changed(host: str) -> None:
    installer.install(installer.InstallOptions(host_root=host))
    _break_containerd(host)
    before = fx.snapshot(host)
    # This run changes the launcher (another python) and docker (default runtime) before
    # containerd's config stops it.
    fx.write(host, "/usr/bin/python3.12", "#!/bin/sh\n", 0o755)
    options = installer.InstallOptions(
        host_root=host, set_as_default=True, python="/usr/bin/python3.12"
    )
    with pytest.raises(InstallError, match=r"(?s)not valid TOML.*taken back"):
        installer.install(options)
    os.unlink(os.path.join(host, "usr/bin/python3.12"))
    assert fx.diff(before, fx.snapshot(host)) == []


def _start_waiting(host: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CTK, "install", "--host-root", host, "--wait", "--set-as-default", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until_ready(process: subprocess.Popen[str]) -> None:
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line or line.startswith("enflame-ctk: install: ready"):
            return
    process.kill()


def test_failed_wait_mode_install_keeps_the_earlier_install(host: str) -> None:
    installer.install(installer.InstallOptions(host_root=host, set_as_default=True))
    _break_containerd(host)
    before = fx.snapshot(host)
    process = _start_waiting(host)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert fx.diff(before, fx.snapshot(host)) == []


@pytest.mark.parametrize("toolkit", ["/opt/enflame-gcu", "/opt/other"], ids=["same", "other"])
def test_sigterm_undo_removes_only_what_the_pod_added(host: str, toolkit: str) -> None:
    # install.sh-style install first: /usr/bin links, docker and containerd pointing at them.
    installer.install(
        installer.InstallOptions(
            host_root=host,
            set_as_default=True,
            bin_dir="/usr/bin",
            toolkit_dir="/opt/enflame-gcu",
        )
    )
    before = fx.snapshot(host)
    process = _start_waiting(host, "--toolkit-dir", toolkit)
    try:
        _until_ready(process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert fx.diff(before, fx.snapshot(host)) == []
    assert _daemon(host)["runtimes"] == {
        "enflame": {"path": "/usr/bin/enflame-container-runtime", "runtimeArgs": []}
    }


def test_uninstall_restores_a_runtime_entry_that_was_there_before(host: str) -> None:
    # Someone (a vendor install, an operator) configured runtimes.enflame first.
    argv = ["runtime", "configure", "--runtime", "docker", "--host-root", host]
    # --force: the vendor's binary is not in this fake host (a real node has it).
    assert main([*argv, "--runtime-path", VENDOR, "--set-as-default", "--force"]) == 0
    before = fx.snapshot(host)

    installer.install(installer.InstallOptions(host_root=host, set_as_default=True))
    assert _daemon(host)["runtimes"]["enflame"]["path"] != VENDOR  # type: ignore[index]
    installer.uninstall(host)

    assert _daemon(host)["runtimes"]["enflame"]["path"] == VENDOR  # type: ignore[index]
    assert _daemon(host)["default-runtime"] == "enflame"
    assert fx.diff(before, fx.snapshot(host)) == []


def test_unconfigure_of_one_step_keeps_the_other(tmp_path: os.PathLike[str]) -> None:
    config = fx.write(str(tmp_path), "/daemon.json", fx.DAEMON_JSON)
    first = engines.configure("docker", config, engines.RuntimeOptions(runtime_path=VENDOR))
    after_first = fx.snapshot(str(tmp_path))["daemon.json"]
    second = engines.configure(
        "docker", config, engines.RuntimeOptions(set_as_default=True), step="mine"
    )
    assert first.step and second.step == "mine"

    # The newest step goes exactly; an older one while a newer is live goes key by key.
    engines.unconfigure("docker", config, step="mine")
    assert fx.snapshot(str(tmp_path))["daemon.json"] == after_first
    engines.configure("docker", config, engines.RuntimeOptions(set_as_default=True), step="2")
    engines.unconfigure("docker", config, step=first.step)
    daemon = json.loads(fx.snapshot(str(tmp_path))["daemon.json"][2])
    assert daemon["default-runtime"] == "enflame"
    assert daemon["runtimes"]["enflame"]["path"] == "/usr/bin/enflame-container-runtime"
    engines.unconfigure("docker", config)
    with open(config, encoding="utf-8") as handle:
        assert json.load(handle) == json.loads(fx.DAEMON_JSON)
