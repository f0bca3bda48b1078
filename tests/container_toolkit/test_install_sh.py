"""deploy/install.sh against fake host roots.

The fast tests pass ``--use-env`` with the project's own virtualenv, so they cover everything
install.sh does except creating the venv and running pip; ``test_full_install_builds_a_venv``
(marked slow, about 10 s) covers those too, with pip reaching the package index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from enflame_gcu.simulation import simulate, topofile
from tests.conftest import PROJECT_ROOT
from tests.container_toolkit import installer_fixtures as fx
from tests.packaging import node_commands

INSTALL_SH = os.path.join(PROJECT_ROOT, "deploy", "install.sh")
DEV_ENV = os.path.dirname(os.path.dirname(sys.executable))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", INSTALL_SH, *args], capture_output=True, text=True, timeout=300, check=False
    )


def _read(root: str, path: str) -> str:
    with open(os.path.join(root, path.lstrip("/")), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture
def host(tmp_path: object) -> str:
    return fx.fake_host(str(tmp_path))


def test_install_links_runtime_and_merges_engine_configs(host: str) -> None:
    result = run("--host-root", host, "--use-env", DEV_ENV)
    assert result.returncode == 0, result.stderr
    assert os.readlink(os.path.join(host, "usr/bin/enflame-container-runtime")) == (
        "/opt/enflame-gcu/bin/enflame-container-runtime"
    )
    assert os.readlink(os.path.join(host, "usr/bin/enflame-ctk")) == f"{DEV_ENV}/bin/enflame-ctk"
    launcher = _read(host, "/opt/enflame-gcu/bin/enflame-container-runtime")
    assert launcher.startswith("#!/bin/sh\n")  # the sh front
    assert f"exec {DEV_ENV}/bin/python -IS -c " in launcher
    daemon = json.loads(_read(host, "/etc/docker/daemon.json"))
    assert daemon["runtimes"]["enflame"]["path"] == "/usr/bin/enflame-container-runtime"
    assert daemon["default-runtime"] == "enflame"
    assert daemon["data-root"] == "/var/lib/docker" and daemon["features"] == {"buildkit": True}
    assert 'BinaryName = "/usr/bin/enflame-container-runtime"' in _read(
        host, "/etc/containerd/config.toml"
    )
    assert os.path.isfile(os.path.join(host, "etc/enflame-container-runtime/config.toml"))
    assert os.path.isdir(os.path.join(host, "var/log/enflame"))
    # enflame-ctk reports what it did on stderr, with its prefix.
    said = [x for x in result.stderr.splitlines() if 'added default-runtime = "enflame"' in x]
    assert said and all(x.startswith("enflame-ctk: ") for x in said)
    assert "install-manifest.json; undo with:" in result.stderr
    assert result.stdout == ""  # a real run has no result to print (docs/user-guide.md)


def test_second_run_is_a_no_op_and_uninstall_restores_the_tree(host: str) -> None:
    before = fx.snapshot(host)
    assert run("--host-root", host, "--use-env", DEV_ENV).returncode == 0
    installed = fx.snapshot(host)
    second = run("--host-root", host, "--use-env", DEV_ENV)
    assert second.returncode == 0, second.stderr
    assert fx.diff(installed, fx.snapshot(host)) == []
    result = run("--uninstall", "--host-root", host, "--use-env", DEV_ENV)
    assert result.returncode == 0, result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


def test_no_default_and_runtime_selection(host: str) -> None:
    result = run("--host-root", host, "--use-env", DEV_ENV, "--no-default", "--runtime", "docker")
    assert result.returncode == 0, result.stderr
    daemon = json.loads(_read(host, "/etc/docker/daemon.json"))
    assert "enflame" in daemon["runtimes"] and "default-runtime" not in daemon
    assert "enflame" not in _read(host, "/etc/containerd/config.toml")


def test_dry_run_changes_nothing(host: str) -> None:
    before = fx.snapshot(host)
    result = run("--host-root", host, "--use-env", DEV_ENV, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would be created" in result.stdout
    assert fx.diff(before, fx.snapshot(host)) == []


def test_uninstall_when_nothing_is_installed(host: str) -> None:
    result = run("--uninstall", "--host-root", host)
    assert result.returncode == 0
    assert "install.sh: nothing to uninstall" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["--prefix", "opt/x"], "--prefix must be an absolute path"),
        (["--host-root", "/nonexistent/root"], "is not a directory"),
        (["--use-env", "/nonexistent/env"], "has no bin/enflame-ctk"),
        (["--wheel"], "--wheel needs a value"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(
    host: str, args: list[str], message: str
) -> None:
    before = fx.snapshot(host)
    result = run("--host-root", host, *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


def test_failed_install_rolls_back_and_leaves_malformed_daemon_json_alone(host: str) -> None:
    fx.write(host, "/etc/docker/daemon.json", "{broken")
    before = fx.snapshot(host)
    result = run("--host-root", host, "--use-env", DEV_ENV)
    assert result.returncode == 1
    assert "daemon.json" in result.stderr and "this run's changes were taken back" in result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


@pytest.mark.slow
@pytest.mark.timeout(400)  # pip builds the source tree: minutes on a busy machine
def test_full_install_builds_a_venv_and_uninstall_removes_it(host: str) -> None:
    python = shutil.which("python3") or sys.executable
    before = fx.snapshot(host)
    result = run("--host-root", host, "--python", python)
    assert result.returncode == 0, result.stdout + result.stderr
    venv = os.path.join(host, "opt/enflame-gcu/venv")
    # The python has a pip that installs into another interpreter: no ensurepip, no pip left
    # in the venv the runtime runs from.
    assert "pip 2" in result.stderr and "installs into a venv without pip" in result.stderr
    assert not os.path.lexists(f"{venv}/bin/pip")
    ctk = subprocess.run(
        [f"{venv}/bin/enflame-ctk", "--version"], capture_output=True, text=True, check=False
    )
    assert ctk.returncode == 0 and ctk.stdout.startswith("enflame-ctk "), ctk.stderr
    launcher = _read(host, "/opt/enflame-gcu/bin/enflame-container-runtime")
    assert launcher.startswith("#!/bin/sh\n")  # the sh front
    assert "exec /opt/enflame-gcu/venv/bin/python -IS -c " in launcher
    assert "/opt/enflame-gcu/venv/lib/python3." in launcher
    # Every node command the guides show works from this install (issue 23 item 1).
    scratch = tempfile.mkdtemp(dir=os.path.dirname(host), prefix="node-commands-")
    node = os.path.join(scratch, "node")
    simulate.create(node, topofile.load("flat-4card"))
    out = os.path.join(scratch, "out")
    assert node_commands.run_all([f"{venv}/bin/enflame-ctk"], node, out) == []
    result = run("--uninstall", "--host-root", host)
    assert result.returncode == 0, result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


@pytest.mark.slow
@pytest.mark.timeout(400)  # ensurepip and a pip install of a prebuilt wheel
def test_a_python_without_pip_gets_a_venv_with_its_own(tmp_path: object, wheelhouse: str) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"), docker=False)
    os.makedirs(os.path.join(host, "var/lib/kubelet"))
    # A python with no pip importable (as Debian's python3 without python3-pip).
    bare = os.path.join(str(tmp_path), "bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True)
    python = os.path.join(bare, "bin", "python")
    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode == 1
    result = run("--host-root", host, "--python", python, *fx.wheel_args(wheelhouse))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "has no pip >= 22.3: the venv gets its own (ensurepip)" in result.stderr
    venv = os.path.join(host, "opt/enflame-gcu/venv")
    assert os.path.isfile(f"{venv}/bin/pip")
    ctk = subprocess.run(
        [f"{venv}/bin/enflame-ctk", "--version"], capture_output=True, text=True, check=False
    )
    assert ctk.returncode == 0 and ctk.stdout.startswith("enflame-ctk "), ctk.stderr
    assert run("--uninstall", "--host-root", host).returncode == 0
    assert not os.path.lexists(os.path.join(host, "opt/enflame-gcu"))


@pytest.mark.slow
@pytest.mark.timeout(400)  # three installs, two of them with pip (of a prebuilt wheel)
def test_a_failed_first_install_leaves_nothing_behind_and_a_rerun_works(
    tmp_path: object, wheelhouse: str
) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"), docker=False)
    os.makedirs(os.path.join(host, "var/lib/kubelet"))  # a Kubernetes node: auto is device-specs
    empty = os.path.join(str(tmp_path), "no-wheels")
    os.mkdir(empty)
    python = shutil.which("python3") or sys.executable
    before = fx.snapshot(host)
    # pip fails (an empty wheelhouse, no index): the fresh venv and /opt/enflame-gcu go again.
    failed = run(
        "--host-root", host, "--python", python, "--pip-args", f"--no-index --find-links {empty}"
    )  # fmt: skip
    assert failed.returncode == 1
    assert "pip install of" in failed.stderr and "failed (see above)" in failed.stderr
    assert "removed what this failed first install created (/opt/enflame-gcu/venv)" in (
        failed.stderr
    )
    assert fx.diff(before, fx.snapshot(host)) == []
    # pip works but enflame-ctk install refuses before recording anything (no CDI engine).
    wheel = fx.wheel_args(wheelhouse)
    refused = run("--host-root", host, "--python", python, "--mode", "cdi", *wheel)
    assert refused.returncode == 1
    assert "node mode cdi needs an engine that resolves CDI" in refused.stderr
    assert "removed what this failed first install created" in refused.stderr
    assert fx.diff(before, fx.snapshot(host)) == []
    # The next run is a first install again, not "venv exists but no install recorded it"; in
    # a mode without the wrapper too, the venv is recorded and uninstall removes it.
    result = run("--host-root", host, "--python", python, *wheel)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "enflame-ctk: node mode device-specs (auto)" in result.stderr
    assert "removed what" not in result.stderr
    assert os.path.isfile(os.path.join(host, "opt/enflame-gcu/venv/bin/enflame-ctk"))
    result = run("--uninstall", "--host-root", host)
    assert result.returncode == 0, result.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


# --- node modes -----------------------------------------------------------------------------


def test_mode_auto_on_a_kubernetes_node_installs_no_wrapper_and_uninstalls_clean(
    tmp_path: object,
) -> None:
    root = fx.fake_host(str(tmp_path), docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    before = fx.snapshot(root)
    result = run("--host-root", root, "--use-env", DEV_ENV)
    assert result.returncode == 0, result.stderr
    assert "enflame-ctk: node mode device-specs (auto)" in result.stderr
    assert not os.path.lexists(os.path.join(root, "usr/bin/enflame-container-runtime"))
    assert _read(root, "/etc/containerd/config.toml") == fx.CONTAINERD_V2
    with open(os.path.join(root, "etc/enflame-gcu/node-mode.json"), encoding="utf-8") as handle:
        assert json.load(handle)["mode"] == "device-specs"
    result = run("--host-root", root, "--use-env", DEV_ENV, "--uninstall")
    assert result.returncode == 0, result.stderr
    assert fx.snapshot(root) == before


def test_an_unknown_or_impossible_mode_is_refused_and_changes_nothing(tmp_path: object) -> None:
    root = fx.fake_host(str(tmp_path), docker=False)
    before = fx.snapshot(root)
    result = run("--host-root", root, "--use-env", DEV_ENV, "--mode", "strict")
    assert result.returncode != 0 and "unknown --mode 'strict'" in result.stderr
    result = run("--host-root", root, "--use-env", DEV_ENV, "--mode", "cdi")
    assert result.returncode != 0
    assert "node mode cdi needs an engine that resolves CDI" in result.stderr
    assert fx.snapshot(root) == before


@pytest.mark.slow
@pytest.mark.timeout(400)  # a pip install
def test_dry_run_on_a_fresh_node_shows_the_whole_plan_the_real_run_follows(
    host: str, tmp_path: object, wheelhouse: str
) -> None:
    from tests.container_toolkit.test_dry_run_plans import _done, _plan

    python = sys.executable  # has enflame-ctk's dependencies: the dry run needs no pip
    scratch = os.path.join(str(tmp_path), "scratch")
    os.mkdir(scratch)
    before = fx.snapshot(host)
    env = {**os.environ, "TMPDIR": scratch}
    dry = subprocess.run(
        ["bash", INSTALL_SH, "--host-root", host, "--python", python, "--dry-run",
         *fx.wheel_args(wheelhouse)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert fx.diff(before, fx.snapshot(host)) == []  # nothing on the host changed
    assert os.listdir(scratch) == []  # the throwaway environment is gone
    lines = dry.stdout.splitlines()
    # The engine configs' diffs, with paths as the host sees them, each step once.
    assert "--- /etc/containerd/config.toml" in lines
    assert "/etc/docker/daemon.json would be modified" in lines
    assert not [line for line in lines if host in line]
    plan = _plan(
        tuple(lines[lines.index(next(x for x in lines if x.startswith("would pip"))) + 1 :])
    )
    real = run("--host-root", host, "--python", python, *fx.wheel_args(wheelhouse))
    assert real.returncode == 0, real.stdout + real.stderr
    # What the real run did: enflame-ctk's report, on stderr with its prefix.
    prefix = "enflame-ctk: "
    done = [x.removeprefix(prefix) for x in real.stderr.splitlines() if x.startswith(prefix)]
    # The prefix directories the shell itself makes with the venv ("creating the virtualenv").
    made_by_shell = {"/opt/ created", "/opt/enflame-gcu/ created"}
    assert [line for line in plan if line not in made_by_shell] == _done(tuple(done))
    assert run("--uninstall", "--host-root", host).returncode == 0


NO_NETWORK = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}


def test_dry_run_on_a_fresh_node_needs_no_pip_and_no_network(host: str, tmp_path: object) -> None:
    scratch = os.path.join(str(tmp_path), "scratch")
    os.mkdir(scratch)
    before = fx.snapshot(host)
    env = {**os.environ, "TMPDIR": scratch, **NO_NETWORK}
    dry = subprocess.run(
        ["bash", INSTALL_SH, "--host-root", host, "--python", sys.executable, "--dry-run"],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would pip install" in dry.stdout
    assert "/etc/docker/daemon.json would be modified" in dry.stdout.splitlines()
    assert fx.diff(before, fx.snapshot(host)) == [] and os.listdir(scratch) == []


def test_dry_run_says_what_a_python_without_the_dependencies_lacks(
    host: str, tmp_path: object
) -> None:
    # A Python with nothing installed: no PyYAML, no tomlkit (a venv of this one, no pip).
    venv = os.path.join(str(tmp_path), "bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    bare = os.path.join(venv, "bin", "python")
    before = fx.snapshot(host)
    dry = subprocess.run(
        ["bash", INSTALL_SH, "--host-root", host, "--python", bare, "--dry-run"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, **NO_NETWORK},
    )  # fmt: skip
    assert dry.returncode == 1
    assert "lacks what enflame-ctk needs" in dry.stderr and "No module named" in dry.stderr
    assert "--pip-args" in dry.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


def test_restart_advice_and_undo_hint_follow_what_this_run_did(host: str) -> None:
    # device-specs changes no engine config: nothing to restart, and no advice to.
    mode = ("--mode", "device-specs", "--runtime", "containerd")
    specs = run("--host-root", host, "--use-env", DEV_ENV, *mode)
    assert specs.returncode == 0, specs.stderr
    assert "systemctl restart" not in specs.stderr and "restart it" not in specs.stderr
    # The undo names the same host root and environment, so it undoes this install.
    hint = specs.stderr.split("undo with: ", 1)[1].splitlines()[0]
    assert hint == f"{INSTALL_SH} --uninstall --host-root {host} --use-env {DEV_ENV}"
    undo = subprocess.run(
        ["bash", *hint.split()[0:]], capture_output=True, text=True, timeout=110, check=False
    )
    assert undo.returncode == 0, undo.stderr
    wrapped = run("--host-root", host, "--use-env", DEV_ENV, "--mode", "default-runtime")
    assert wrapped.returncode == 0, wrapped.stderr
    advice = [line for line in wrapped.stderr.splitlines() if "restart it so it loads" in line]
    assert advice and all(line.startswith("enflame-ctk: ") for line in advice)
    assert any("systemctl restart docker" in line for line in advice)
