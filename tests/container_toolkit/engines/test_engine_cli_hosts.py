"""``enflame-ctk runtime`` handlers, engine detection and engine reload, on fake host roots."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from collections.abc import Sequence

import pytest

from enflame_gcu.container_toolkit import engines
from enflame_gcu.container_toolkit.commands import runtime
from enflame_gcu.container_toolkit.engines import reload as engine_reload
from enflame_gcu.errors import EngineConfigError
from tests.container_toolkit.engines.helpers import read


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="enflame-ctk")
    runtime.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def test_cli_configure_then_unconfigure(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    # --force: no runtime binary on this machine (a real --set-as-default refuses that).
    argv = ("runtime", "configure", "--runtime", "docker", "--config", path, "--set-as-default",
            "--force")  # fmt: skip
    assert run_cli(*argv, "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"+++ {path}" in out and '+  "default-runtime": "enflame"' in out.replace("    ", "  ")
    assert not os.path.exists(path)
    assert run_cli(*argv) == 0
    # A real run reports on stderr with the prefix; stdout (the result) stays empty.
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"enflame-ctk: {path} was created" in captured.err
    assert 'added default-runtime = "enflame"' in captured.err
    assert json.loads(read(path))["default-runtime"] == "enflame"
    assert run_cli("runtime", "unconfigure", "--runtime", "docker", "--config", path) == 0
    assert f"enflame-ctk: {path} was deleted" in capsys.readouterr().err
    assert not os.path.exists(path)


def test_cli_error_goes_to_stderr_with_exit_1(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("{oops")
    assert run_cli("runtime", "configure", "--runtime", "docker", "--config", path) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "not valid JSON (line 1, column 2" in captured.err
    assert read(path) == "{oops"


def test_cli_rejects_a_relative_runtime_path(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("runtime", "configure", "--runtime", "crio", "--runtime-path", "bin/rt")
    assert run_cli(*argv) == 2  # a usage error
    assert "--runtime-path must be absolute" in capsys.readouterr().err


def make_tree(root: str, paths: Sequence[str]) -> None:
    for path in paths:
        full = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8"):
            pass


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ([], []),
        (["/usr/bin/dockerd"], ["docker"]),
        (["/run/containerd/containerd.sock"], ["containerd"]),
        (["/etc/crio/crio.conf", "/usr/bin/containerd"], ["containerd", "crio"]),
        (["/var/run/docker.sock", "/etc/containerd/config.toml"], ["docker", "containerd"]),
    ],
)
def test_detect_names_engines_under_the_host_root(
    tmp_path: os.PathLike[str], paths: list[str], expected: list[str]
) -> None:
    make_tree(str(tmp_path), paths)
    assert engines.detect(str(tmp_path)) == expected


def test_default_config_paths_resolve_under_host_root() -> None:
    assert engines.default_config_path("containerd", "/host") == "/host/etc/containerd/config.toml"
    assert engines.default_config_path("docker") == "/etc/docker/daemon.json"
    with pytest.raises(EngineConfigError, match="unknown engine 'rkt'"):
        engines.default_config_path("rkt")


class FakeHost:
    """Records the signals and commands signal_or_restart would send."""

    def __init__(self, returncode: int = 0) -> None:
        self.signals: list[tuple[int, int]] = []
        self.commands: list[list[str]] = []
        self.returncode = returncode

    def kill(self, pid: int, signum: int) -> None:
        self.signals.append((pid, signum))

    def run(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(command))
        return subprocess.CompletedProcess(list(command), self.returncode, "", "unit not found")


def test_docker_runtimes_only_are_reloaded_with_sighup(tmp_path: os.PathLike[str]) -> None:
    make_tree(str(tmp_path), ["/var/run/docker.pid"])
    with open(os.path.join(str(tmp_path), "var/run/docker.pid"), "w", encoding="utf-8") as handle:
        handle.write("4242\n")
    host = FakeHost()
    message = engine_reload.signal_or_restart(
        "docker", True, str(tmp_path), runner=host.run, signaller=host.kill
    )
    assert host.signals == [(4242, signal.SIGHUP)]
    assert host.commands == []
    assert "pid 4242" in message


@pytest.mark.parametrize(("engine", "unit"), [("docker", "docker"), ("crio", "crio")])
def test_other_changes_restart_the_unit_with_systemctl(
    tmp_path: os.PathLike[str], engine: str, unit: str
) -> None:
    os.makedirs(os.path.join(str(tmp_path), "run/systemd/system"))
    host = FakeHost()
    message = engine_reload.signal_or_restart(
        engine,
        False,
        str(tmp_path),
        runner=host.run,
        signaller=host.kill,
        which=lambda _: "/bin/systemctl",
    )
    assert host.commands == [["systemctl", "restart", unit]]
    assert host.signals == []
    assert message == f"restarted {unit} with systemctl"


def test_restart_failure_and_missing_systemd_are_explained(tmp_path: os.PathLike[str]) -> None:
    host = FakeHost(returncode=5)
    with pytest.raises(EngineConfigError, match="systemd does not manage this host"):
        engine_reload.signal_or_restart("containerd", False, str(tmp_path), runner=host.run)
    os.makedirs(os.path.join(str(tmp_path), "run/systemd/system"))
    with pytest.raises(
        EngineConfigError, match=r"`systemctl restart containerd` failed \(exit 5\)"
    ):
        engine_reload.signal_or_restart(
            "containerd", False, str(tmp_path), runner=host.run, which=lambda _: "/bin/systemctl"
        )
