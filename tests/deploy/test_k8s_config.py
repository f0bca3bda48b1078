"""deploy/k8s-config.sh on a node tree under --host-root, with a stand-in kubelet and enflame-ctk.

Under --root nothing on the live system is touched (swapoff, systemctl are only printed), so
these tests run the script for real against temporary trees.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.helpers import DEPLOY

FSTAB = "UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n# /old none swap sw 0 0\n"


def executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "fstab").write_text(FSTAB)
    (root / "run" / "containerd").mkdir(parents=True)
    (root / "run" / "containerd" / "containerd.sock").touch()
    return root


def run(
    tmp_path: Path, root: Path, *args: str, kubelet_version: str = "v1.28.2"
) -> subprocess.CompletedProcess[str]:
    kubelet = executable(tmp_path / "kubelet", f"#!/bin/sh\necho 'Kubernetes {kubelet_version}'\n")
    # A stand-in that records the calls that change things; `runtime detect` is the real one.
    real = f"{sys.executable} -m enflame_gcu.container_toolkit.cli"
    ctk = executable(
        tmp_path / "enflame-ctk",
        f'#!/bin/sh\n[ "$1 $2" = "runtime detect" ] && exec {real} "$@"\n'
        f'echo "$@" >> {tmp_path}/ctk-calls\n',
    )
    env = {**os.environ, "KUBELET": kubelet, "ENFLAME_CTK": ctk}
    return subprocess.run(
        ["bash", os.path.join(DEPLOY, "k8s-config.sh"), "--host-root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def ctk_calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "ctk-calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_dry_run_changes_nothing_and_says_what_it_would_do(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert (node / "etc" / "fstab").read_text() == FSTAB
    assert "/swap.img none swap sw 0 0" in result.stdout
    # A containerd node gets node mode device-specs: the engine is left alone.
    assert "node mode device-specs: containerd is left as it is" in result.stderr
    assert ctk_calls(tmp_path) == []
    result = run(tmp_path, node, "--dry-run", "--mode", "default-runtime")
    expected = "would run: enflame-ctk runtime configure --runtime containerd --set-as-default"
    assert expected in result.stdout
    # With enflame-ctk present the dry run also asks it for the diff, itself in --dry-run mode.
    assert ctk_calls(tmp_path) and all(c.endswith("--dry-run") for c in ctk_calls(tmp_path))
    assert not (node / "etc" / "fstab.enflame-k8s-config.bak").exists()


def test_prepares_swap_and_the_detected_runtime(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node)
    assert result.returncode == 0, result.stderr
    fstab = (node / "etc" / "fstab").read_text().splitlines()
    assert fstab[0] == "UUID=1 / ext4 defaults 0 1"
    assert fstab[1] == "# disabled by k8s-config.sh: /swap.img none swap sw 0 0"
    assert fstab[2] == "# /old none swap sw 0 0"
    assert (node / "etc" / "fstab.enflame-k8s-config.bak").read_text() == FSTAB
    assert ctk_calls(tmp_path) == []  # device-specs: the engine needs nothing
    assert "DevicePlugins is GA" in result.stderr


@pytest.mark.parametrize(
    ("mode", "flags"), [("default-runtime", " --set-as-default"), ("runtimeclass", "")]
)
def test_wrapper_modes_configure_the_engine(
    tmp_path: Path, node: Path, mode: str, flags: str
) -> None:
    result = run(tmp_path, node, "--skip-swap", "--mode", mode)
    assert result.returncode == 0, result.stderr
    assert ctk_calls(tmp_path) == [
        f"runtime configure --runtime containerd{flags} --host-root {node}"
    ]


def test_an_unknown_mode_is_refused(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--mode", "strict")
    assert result.returncode != 0 and "--mode must be auto" in result.stderr


def test_second_run_changes_nothing_more(tmp_path: Path, node: Path) -> None:
    assert run(tmp_path, node).returncode == 0
    once = (node / "etc" / "fstab").read_text()
    assert run(tmp_path, node).returncode == 0
    assert (node / "etc" / "fstab").read_text() == once


def test_runtime_can_be_chosen(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--runtime", "docker", "--skip-swap")
    assert result.returncode == 0, result.stderr
    assert ctk_calls(tmp_path) == [
        f"runtime configure --runtime docker --set-as-default --host-root {node}"
    ]


def test_unknown_runtime_is_refused(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--runtime", "rkt")
    assert result.returncode == 2  # a usage error, as for enflame-ctk
    assert "--runtime must be docker, containerd or crio" in result.stderr


def test_kubelet_too_old_for_v1beta1_is_refused(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--skip-swap", kubelet_version="v1.9.11")
    assert result.returncode == 1
    assert "kubelet 1.9 is too old" in result.stderr
    assert ctk_calls(tmp_path) == []


def test_device_plugins_gate_is_turned_on_only_when_it_was_off(tmp_path: Path, node: Path) -> None:
    result = run(tmp_path, node, "--skip-swap", "--skip-runtime", kubelet_version="v1.19.8")
    assert "DevicePlugins is on (the default since 1.10); nothing to change" in result.stderr
    assert not (node / "etc" / "default" / "kubelet").exists()

    (node / "var" / "lib" / "kubelet").mkdir(parents=True)
    config = node / "var" / "lib" / "kubelet" / "config.yaml"
    config.write_text("featureGates:\n  DevicePlugins: false\n")
    result = run(tmp_path, node, "--skip-swap", "--skip-runtime", kubelet_version="v1.19.8")
    assert result.returncode == 0, result.stderr
    defaults = (node / "etc" / "default" / "kubelet").read_text()
    assert defaults == 'KUBELET_EXTRA_ARGS="--feature-gates=DevicePlugins=true"\n'
    assert "would run: systemctl restart kubelet (not run:" in result.stderr


def test_no_engine_found_is_a_clear_error(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    result = run(tmp_path, bare)
    assert result.returncode == 1
    assert "no container engine found" in result.stderr


def test_the_enflame_ctk_calls_are_ones_the_real_cli_accepts(tmp_path: Path, node: Path) -> None:
    from enflame_gcu.container_toolkit import cli

    assert run(tmp_path, node, "--mode", "default-runtime").returncode == 0
    assert run(tmp_path, node, "--mode", "default-runtime", "--dry-run").returncode == 0
    calls = ctk_calls(tmp_path)
    assert len(calls) == 2
    for call in calls:
        args = cli.build_parser().parse_args(call.split())
        assert args.runtime == "containerd"
        assert args.set_as_default is True


def test_output_plan_on_stdout_and_every_message_on_stderr_with_the_prefix(
    tmp_path: Path, node: Path
) -> None:
    """The rule enflame-ctk follows: a dry run's plan is the result (stdout, no prefix);
    progress and notes go to stderr, every line prefixed; a real run prints no result."""
    dry = run(tmp_path, node, "--dry-run", "--mode", "default-runtime")
    assert dry.returncode == 0, dry.stderr
    assert "would comment out in" in dry.stdout and "would run: enflame-ctk" in dry.stdout
    assert not [x for x in dry.stdout.splitlines() if x.startswith("k8s-config:")]
    for result in (dry, run(tmp_path, node)):
        lines = result.stderr.splitlines()
        assert lines and all(x.startswith("k8s-config: ") for x in lines), result.stderr
    real = run(tmp_path, node)
    assert real.returncode == 0 and real.stdout == "", real.stdout
