"""One engine detection: `enflame-ctk runtime detect` (doctor's and the installer's Python) and
deploy/k8s-config.sh's shell fallback give the same answer, line for line, on one table of nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from enflame_gcu.container_toolkit.engines import cri
from tests.deploy.helpers import DEPLOY

CONTAINERD = "unix:///run/containerd/containerd.sock"
CRIO = "unix:///var/run/crio/crio.sock"
DOCKERD = "unix:///var/run/cri-dockerd.sock"
SOCK = {
    "containerd": "/run/containerd/containerd.sock",
    "crio": "/run/crio/crio.sock",
    "crio-var": "/var/run/crio/crio.sock",
    "docker": "/var/run/docker.sock",
    "docker-run": "/run/docker.sock",
}
FLAGS = "/var/lib/kubelet/kubeadm-flags.env"
DEFAULTS = "/etc/default/kubelet"
SYSCONFIG = "/etc/sysconfig/kubelet"
CONFIG = "/var/lib/kubelet/config.yaml"
KUBEADM_CRIO = f"KUBELET_KUBEADM_ARGS=--container-runtime-endpoint={CRIO}\n"
NOT_SET = "(the kubelet's CRI endpoint is not set)"
IN_CONFIG = f"(containerRuntimeEndpoint in {CONFIG})"


def kubelet(*words: str, pid: int = 4242) -> dict[str, str]:
    """A running kubelet's /proc/PID/cmdline."""
    return {f"/proc/{pid}/cmdline": "\0".join(words) + "\0"}


def config(endpoint: str, path: str = CONFIG) -> dict[str, str]:
    return {path: f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {endpoint}\n"}


def sockets(*names: str) -> dict[str, str]:
    return {SOCK[name]: "" for name in names}


# (id, files under the host root, the expected line)
CASES = [
    (
        "running-kubelet-flag",
        {**kubelet("/usr/bin/kubelet", f"--container-runtime-endpoint={CRIO}"),
         **config(CONTAINERD), **sockets("containerd")},
        f"crio: the kubelet's CRI endpoint {CRIO} (--container-runtime-endpoint of the running "
        "kubelet)",
    ),
    (
        "running-kubelet-flag-as-two-words-last-wins",
        kubelet("kubelet", "--container-runtime-endpoint", DOCKERD,
                "--container-runtime-endpoint", CONTAINERD),
        f"containerd: the kubelet's CRI endpoint {CONTAINERD} (--container-runtime-endpoint of "
        "the running kubelet)",
    ),
    (
        "running-kubelet-config-it-names",
        {**kubelet("/usr/bin/kubelet", "--config=/etc/kubernetes/kubelet.yaml"),
         **config(DOCKERD, "/etc/kubernetes/kubelet.yaml"), **config(CRIO)},
        f"docker: the kubelet's CRI endpoint {DOCKERD} (containerRuntimeEndpoint in "
        "/etc/kubernetes/kubelet.yaml)",
    ),
    (
        "running-kubelet-ignores-flag-files-it-did-not-take",
        {**kubelet("/usr/bin/kubelet"), FLAGS: KUBEADM_CRIO,
         **config(CONTAINERD)},
        f"containerd: the kubelet's CRI endpoint {CONTAINERD} {IN_CONFIG}",
    ),
    (
        "running-kubelet-without-endpoint-falls-back-to-sockets",
        {**kubelet("/usr/bin/kubelet"), **sockets("docker")},
        "docker: socket /var/run/docker.sock (the kubelet's CRI endpoint is not set)",
    ),
    (
        "kubeadm-flags-file",
        {FLAGS: f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint={CONTAINERD} '
                '--pod-infra-container-image=registry.k8s.io/pause:3.9"\n',
         **sockets("crio", "docker")},
        f"containerd: the kubelet's CRI endpoint {CONTAINERD} (--container-runtime-endpoint in "
        f"{FLAGS})",
    ),
    (
        "extra-args-override-kubeadm-flags",
        {FLAGS: f"KUBELET_KUBEADM_ARGS=--container-runtime-endpoint={CONTAINERD}\n",
         DEFAULTS: f'KUBELET_EXTRA_ARGS="--container-runtime-endpoint {DOCKERD}"\n'},
        f"docker: the kubelet's CRI endpoint {DOCKERD} (--container-runtime-endpoint in "
        f"{DEFAULTS})",
    ),
    (
        "sysconfig-file",
        {SYSCONFIG: "KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix:///var/run/dockershim.sock\n"},
        "docker: the kubelet's CRI endpoint unix:///var/run/dockershim.sock "
        f"(--container-runtime-endpoint in {SYSCONFIG})",
    ),
    (
        "commented-out-flag-is-ignored",
        {DEFAULTS: f"# KUBELET_EXTRA_ARGS=--container-runtime-endpoint={CRIO}\n",
         **sockets("docker-run")},
        "docker: socket /run/docker.sock (the kubelet's CRI endpoint is not set)",
    ),
    (
        "config-file-only-quoted",
        config(f'"{CONTAINERD}"'),
        f"containerd: the kubelet's CRI endpoint {CONTAINERD} {IN_CONFIG}",
    ),
    (
        "flag-file-beats-config-file",
        {**config(CONTAINERD), FLAGS: KUBEADM_CRIO},
        f"crio: the kubelet's CRI endpoint {CRIO} (--container-runtime-endpoint in {FLAGS})",
    ),
    (
        "kubelet-word-beats-sockets",
        {**config(CRIO), **sockets("containerd", "docker")},
        f"crio: the kubelet's CRI endpoint {CRIO} {IN_CONFIG}",
    ),
    (
        "unknown-endpoint-falls-back-to-sockets",
        {**config("unix:///run/k0s/cri.sock"), **sockets("docker")},
        "docker: socket /var/run/docker.sock (the kubelet's CRI endpoint unix:///run/k0s/cri.sock "
        f"(containerRuntimeEndpoint in {CONFIG}) names no engine we know)",
    ),
    (
        "sockets-containerd-first",
        sockets("docker", "crio", "containerd"),
        f"containerd: socket /run/containerd/containerd.sock {NOT_SET}",
    ),
    (
        "sockets-crio-before-docker",
        sockets("docker", "crio-var"),
        "crio: socket /var/run/crio/crio.sock (the kubelet's CRI endpoint is not set)",
    ),
    (
        "not-a-kubelet-process-is-ignored",
        {**kubelet("/bin/sh", "-c", f"kubelet --container-runtime-endpoint={CRIO}"),
         **sockets("containerd")},
        f"containerd: socket /run/containerd/containerd.sock {NOT_SET}",
    ),
    ("none-found", {"/etc/hostname": "node\n"}, None),
]  # fmt: skip


def make_root(base: Path, files: dict[str, str]) -> str:
    root = base / "node"
    root.mkdir()
    for path, text in files.items():
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
    return str(root)


def shell_answer(base: Path, root: str, ctk: str) -> subprocess.CompletedProcess[str]:
    """deploy/k8s-config.sh's own detection: only the runtime step, in a dry run."""
    env = {**os.environ, "ENFLAME_CTK": ctk, "KUBELET": str(base / "no-kubelet")}
    return subprocess.run(
        ["bash", os.path.join(DEPLOY, "k8s-config.sh"), "--host-root", root, "--dry-run",
         "--skip-swap", "--skip-kubelet", "--mode", "device-specs"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def detected(result: subprocess.CompletedProcess[str]) -> str | None:
    prefix = "k8s-config: runtime: detected "
    lines = [x.removeprefix(prefix) for x in result.stderr.splitlines() if x.startswith(prefix)]
    return lines[0] if lines else None


@pytest.fixture
def real_ctk(tmp_path: Path) -> str:
    """enflame-ctk as a script k8s-config.sh can run, from this checkout."""
    path = tmp_path / "enflame-ctk"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m enflame_gcu.container_toolkit.cli "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("files", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_python_cli_and_shell_fallback_agree(
    tmp_path: Path, real_ctk: str, files: dict[str, str], expected: str | None
) -> None:
    root = make_root(tmp_path, files)
    python = cri.detect(root)
    assert (python.describe() if python.engine else None) == expected
    cli = subprocess.run(
        [real_ctk, "runtime", "detect", "--host-root", root],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    shell = shell_answer(tmp_path, root, str(tmp_path / "absent-enflame-ctk"))
    via_ctk = shell_answer(tmp_path, root, real_ctk)
    if expected is None:
        assert cli.returncode == 1 and cli.stdout == ""
        assert cli.stderr.startswith("enflame-ctk: no container engine found: ")
        for result in (shell, via_ctk):
            assert result.returncode == 1
            assert "k8s-config: error: no container engine found" in result.stderr
        return
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == expected + "\n" and cli.stderr == ""
    assert detected(shell) == expected, shell.stdout + shell.stderr
    assert detected(via_ctk) == expected, via_ctk.stdout + via_ctk.stderr


def test_the_oldest_of_two_kubelets_is_the_one_asked(tmp_path: Path) -> None:
    files = {
        **kubelet("/usr/bin/kubelet", f"--container-runtime-endpoint={CRIO}", pid=900),
        **kubelet("/usr/bin/kubelet", f"--container-runtime-endpoint={DOCKERD}", pid=77),
    }
    root = make_root(tmp_path, files)
    assert cri.detect(root).engine == "docker"
    answer = detected(shell_answer(tmp_path, root, str(tmp_path / "absent")))
    assert answer is not None and answer.startswith("docker:")


def test_an_enflame_ctk_without_runtime_detect_leaves_it_to_the_shell(tmp_path: Path) -> None:
    old = tmp_path / "old-enflame-ctk"
    old.write_text("#!/bin/sh\necho \"enflame-ctk: error: invalid choice: 'detect'\" >&2\nexit 2\n")
    old.chmod(0o755)
    root = make_root(tmp_path, sockets("crio"))
    result = shell_answer(tmp_path, root, str(old))
    assert detected(result) == (
        "crio: socket /run/crio/crio.sock (the kubelet's CRI endpoint is not set)"
    )


def test_json_answer(tmp_path: Path, real_ctk: str) -> None:
    root = make_root(tmp_path, config(CONTAINERD))
    result = subprocess.run(
        [real_ctk, "runtime", "detect", "--host-root", root, "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["kind"] == "RuntimeDetection" and document["schemaVersion"] == 1
    assert document["engine"] == "containerd" and document["source"] == "kubelet"
    assert document["endpoint"] == CONTAINERD


def test_a_fifo_in_place_of_a_kubelet_file_is_skipped_not_a_hang(tmp_path: Path) -> None:
    root = make_root(tmp_path, sockets("containerd"))
    for path in ("proc/1/cmdline", "etc/default/kubelet", "var/lib/kubelet/config.yaml"):
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        os.mkfifo(os.path.join(root, path))
    expected = f"containerd: socket /run/containerd/containerd.sock {NOT_SET}"
    assert cri.detect(root).describe() == expected
    assert detected(shell_answer(tmp_path, root, str(tmp_path / "absent"))) == expected
