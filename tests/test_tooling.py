"""The habits stay wired: pre-commit runs exactly what ``make test`` runs before pytest."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _test_prerequisites() -> list[str]:
    makefile = (ROOT / "Makefile").read_text("utf-8")
    found = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert found is not None, "the Makefile has no test target"
    return [target for target in found.group(1).split() if target not in ("setup", "unit")]


def test_pre_commit_runs_the_same_checks_as_make_test() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text("utf-8"))
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [hook["entry"] for hook in hooks] == [f"make {t}" for t in _test_prerequisites()]
    assert _test_prerequisites() == ["lint", "types", "contracts"]
    assert all(hook["language"] == "system" and not hook["pass_filenames"] for hook in hooks)


def test_pre_commit_accepts_its_config() -> None:
    pre_commit = pathlib.Path(sys.executable).with_name("pre-commit")
    result = subprocess.run(
        [str(pre_commit), "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _scoped_fixtures_running_programs(tree: ast.Module) -> list[str]:
    """Module- or session-scoped fixtures whose body runs a program (a build worth sharing)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            scoped = isinstance(decorator, ast.Call) and any(
                k.arg == "scope" and getattr(k.value, "value", None) in ("module", "session")
                for k in decorator.keywords
            )
            if scoped and "subprocess" in ast.unparse(node):
                found.append(node.name)
    return found


def _unit_recipe() -> str:
    makefile = (ROOT / "Makefile").read_text("utf-8")
    unit = re.search(r"^unit:\n\t(.*)$", makefile, re.MULTILINE)
    assert unit is not None, "the Makefile has no one-line unit target"
    return unit.group(1)


def test_make_unit_runs_on_every_core_and_builds_each_shared_fixture_once() -> None:
    unit = _unit_recipe()
    assert "scripts/pytest.sh" in unit
    assert "-n auto" in unit and "--dist loadgroup" in unit
    # Under --dist loadgroup a module's tests may land on several workers, each building the
    # module's fixtures again: an expensive one (a subprocess) must keep its module on one.
    ungrouped = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.parts[-2] in ("kubelet", "cluster"):  # make e2e(-cluster) runs these, one at a time
            continue
        tree = ast.parse(path.read_text("utf-8"))
        if _scoped_fixtures_running_programs(tree) and "xdist_group" not in ast.unparse(tree):
            ungrouped.append(str(path.relative_to(ROOT)))
    assert not ungrouped, f"module-scoped builds split over workers: {ungrouped}"


GROUPED_MODULE = """\
import os, pytest
pytestmark = [pytest.mark.xdist_group("shared")]
@pytest.mark.parametrize("i", range(8))
def test_grouped(i):
    with open(os.environ["WHERE"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: pathlib.Path) -> None:
    """The grouping make unit relies on really happens with the installed pytest and xdist
    (pytest 9.2's node ids silently broke it: each worker built the group's fixtures)."""
    (tmp_path / "test_grouped.py").write_text(GROUPED_MODULE, "utf-8")
    where = tmp_path / "workers.txt"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "WHERE": str(where)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    workers = where.read_text("utf-8").split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers


def test_no_tests_collected_fails_under_xdist_too() -> None:
    result = subprocess.run(
        ["bash", "scripts/pytest.sh", "-n", "2", "-p", "no:cacheprovider", "-q",
         "-k", "no_such_test_anywhere", "tests/test_naming.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "collected no tests: that is a failure" in result.stderr


def _tmp_filesystem() -> str:
    """``<type> <source>`` of what is mounted on /tmp here, as SCRATCH_MODULE reports it."""
    text = pathlib.Path("/proc/self/mountinfo").read_text("utf-8")
    mounts = [line.split() for line in text.splitlines()]
    tmp = [m for m in mounts if m[4] == "/tmp"]
    return " ".join(tmp[-1][tmp[-1].index("-") + 1 :][:2]) if tmp else "none"


# Reports what the tests it runs under see on /tmp, and leaves a marker there.
SCRATCH_MODULE = f"""\
import os, pathlib
{inspect.getsource(_tmp_filesystem)}
def test_where():
    open(os.environ["MARKER"], "w").close()
    print("SCRATCH=" + _tmp_filesystem())
"""


def _scratch_run(tmpfs: str, marker: str) -> tuple[str, str]:
    """Runs scripts/pytest.sh on SCRATCH_MODULE (kept in the checkout, which a tmpfs on /tmp
    does not hide unless the checkout is under /tmp); what the test saw on /tmp, and stderr."""
    folder = ROOT / "build" / f"scratch-check-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "test_scratch.py").write_text(SCRATCH_MODULE, "utf-8")
        env = {k: v for k, v in os.environ.items() if k != "ENFLAME_TEST_TMPFS_MOUNTED"}
        result = subprocess.run(
            ["bash", "scripts/pytest.sh", "-q", "-s", "-p", "no:cacheprovider",
             "--rootdir", str(folder), "-c", "/dev/null", str(folder)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
            env={**env, "ENFLAME_TEST_TMPFS": tmpfs, "MARKER": marker},
        )  # fmt: skip
    finally:
        shutil.rmtree(folder)
    found = re.search(r"SCRATCH=(.*)", result.stdout)
    assert result.returncode == 0 and found, result.stdout[-2000:] + result.stderr[-2000:]
    return found.group(1), result.stderr


def test_make_test_scratch_is_a_private_tmpfs_that_leaves_nothing_mounted() -> None:
    if os.geteuid() != 0:
        pytest.skip("mount namespaces need root (make test runs as root)")
    assert "ENFLAME_TEST_TMPFS=$${ENFLAME_TEST_TMPFS:-1}" in _unit_recipe()
    marker = f"/tmp/enflame-scratch-marker-{os.getpid()}"
    mounts_before = pathlib.Path("/proc/self/mountinfo").read_text("utf-8")
    try:
        fs, said = _scratch_run("1", marker)
        if f"{ROOT}/".startswith("/tmp/"):
            # pytest.sh's rule (a fresh clone under /tmp, as CI may make): a tmpfs on /tmp
            # would hide the checkout itself, so the scratch space stays on disk, and it says so.
            assert "the checkout is under /tmp" in said, said
            assert fs == _tmp_filesystem(), fs
            assert os.path.exists(marker)
        else:
            # On: the tests see a tmpfs of their own on /tmp; what they write there is gone.
            assert fs == "tmpfs enflame-test-scratch", fs
            assert not os.path.exists(marker)
        assert pathlib.Path("/proc/self/mountinfo").read_text("utf-8") == mounts_before
    finally:
        if os.path.exists(marker):
            os.unlink(marker)
    # Off: the tests share this /tmp (the marker shows up here), whatever it is.
    try:
        fs, _ = _scratch_run("0", marker)
        assert os.path.exists(marker)
        assert fs == _tmp_filesystem(), fs
    finally:
        if os.path.exists(marker):
            os.unlink(marker)


def test_a_checkout_under_tmp_keeps_its_scratch_on_disk_instead_of_hiding_itself(
    tmp_path: pathlib.Path,
) -> None:
    # Found when CI's command ran from a clone in /tmp: the tmpfs mounted on /tmp hid the
    # checkout, and the suite died with "scripts/pytest.sh: No such file or directory".
    if os.geteuid() != 0:
        pytest.skip("mount namespaces need root (make test runs as root)")
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "pytest.sh", checkout / "scripts" / "pytest.sh")
    python = checkout / ".venv" / "bin" / "python"
    python.write_text('#!/bin/sh\necho "ran in $PWD with $*"\n', "utf-8")
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "ENFLAME_TEST_TMPFS_MOUNTED"}
    result = subprocess.run(
        ["bash", "scripts/pytest.sh", "-q"], cwd=checkout, capture_output=True, text=True,
        timeout=60, check=False, env={**env, "ENFLAME_TEST_TMPFS": "1", "ENFLAME_HOST_CHECK": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ran in {checkout} with -m pytest -q" in result.stdout
    assert "the checkout is under /tmp" in result.stderr
