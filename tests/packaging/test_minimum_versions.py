"""The minimum versions in pyproject.toml work: the tests that use each library run against it.

A throwaway virtualenv gets exactly the declared minimum of each library below (and what pip
pulls in for them), read from pyproject.toml; the project itself comes from ``src`` (no deps)
and the test tools (pytest, grpc, ...) from this checkout's own virtualenv, placed after the
throwaway one on ``sys.path`` so the old versions win. The venv is cached under ``build/``,
keyed by the pins, so only a change of minimum pays for a new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest
import tomlkit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(REPO, "build", "min-versions")

# The libraries whose minimums are tested here, in groups, with the tests that exercise them.
CHECKED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "metrics": (
        ("prometheus-client",),
        ("tests/device_plugin/test_metrics.py", "tests/device_plugin/test_observability.py"),
    ),
    "inotify": (
        ("asyncinotify",),
        (
            "tests/test_health.py",  # the health monitor's watches (plugin and DRA driver)
            "tests/container_toolkit/test_node_mode_install.py::"
            "test_the_keeper_rewrites_specs_on_a_change_event_and_never_leaves_a_gap",
        ),
    ),
    "dra": (
        ("lightkube", "lightkube-models"),
        ("tests/dra_plugin/test_api_side.py", "tests/dra_plugin/test_process.py"),
    ),
}
LIBRARIES = {name for names, _ in CHECKED.values() for name in names}
# Every other runtime dependency, and where its minimum is tested instead.
TESTED_ELSEWHERE = {
    "tomlkit": "Debian 12's python3-tomlkit runs enflame-ctk in the .deb test (test_dist.py)",
    "pyyaml": "Debian 12's python3-yaml runs enflame-ctk in the .deb test (test_dist.py)",
    "grpcio": "forced by the committed stubs, which refuse an older grpcio at import",
    "protobuf": "forced by the committed stubs (generated code checks its runtime version)",
}
_REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)$")

# One worker builds the module fixture once and runs every test that uses it (-n auto).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minimum-versions")]


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_minimums() -> dict[str, str]:
    """``name>=version`` of every runtime dependency (base and extras but dev), from pyproject."""
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        project = tomlkit.parse(handle.read()).unwrap()["project"]
    requirements = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        if extra != "dev":
            requirements += items
    found: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement.strip())
        assert match, f"{requirement!r}: a runtime dependency is pinned as name>=minimum"
        name, version = _name(match[1]), match[2]
        assert found.setdefault(name, version) == version, f"{name}: two different minimums"
    return found


def test_every_runtime_dependency_has_a_tested_minimum() -> None:
    declared = set(declared_minimums())
    assert declared == LIBRARIES | set(TESTED_ELSEWHERE), (
        "a runtime dependency was added or dropped: test its minimum here or say where it is"
    )


@pytest.fixture(scope="module")
def minimum_env() -> str:
    """The cached venv holding exactly the declared minimums of ``LIBRARIES``."""
    minimums = declared_minimums()
    pins = sorted(f"{name}=={minimums[name]}" for name in LIBRARIES)
    dev_site = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(json.dumps([pins, dev_site, sys.version]).encode()).hexdigest()[:16]
    venv = os.path.join(CACHE, key)
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs in this checkout build it once
        if not os.path.exists(os.path.join(venv, ".complete")):
            for old in os.listdir(CACHE):  # venvs of earlier pins
                if not old.startswith("."):
                    shutil.rmtree(os.path.join(CACHE, old))
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
            pip = subprocess.run(
                [sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"),
                 "install", "--quiet", "--disable-pip-version-check", *pins],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert pip.returncode == 0, f"pip install {' '.join(pins)}:\n{pip.stderr}"
            site = subprocess.run(
                [os.path.join(venv, "bin", "python"), "-c",
                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            # After the venv's own site-packages: the project's source (no deps), then the dev
            # venv (test tools; its copies of the checked libraries are shadowed).
            with open(os.path.join(site, "zz-enflame-dev.pth"), "w", encoding="utf-8") as pth:
                pth.write(os.path.join(REPO, "src") + "\n")
                pth.write(f"import site; site.addsitedir({dev_site!r})\n")
            with open(os.path.join(venv, ".complete"), "w", encoding="utf-8") as done:
                done.write("\n".join(pins) + "\n")
    return venv


def _clean_env() -> dict[str, str]:
    # No coverage of the outer run in the inner one, no venv or path leaking in.
    drop = ("COV_", "COVERAGE", "PYTHON", "VIRTUAL_ENV", "PYTEST_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("group", sorted(CHECKED))
def test_the_declared_minimums_pass_the_tests_that_use_them(minimum_env: str, group: str) -> None:
    python = os.path.join(minimum_env, "bin", "python")
    libraries, tests = CHECKED[group]
    minimums = {name: declared_minimums()[name] for name in libraries}
    probe = subprocess.run(
        [python, "-c",
         "import importlib.metadata as m, json, sys; print(json.dumps("
         "{n: [m.distribution(n).version, str(m.distribution(n).locate_file(''))]"
         " for n in sys.argv[1:]}))", *libraries],
        capture_output=True, text=True, check=False, env=_clean_env(),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    for name, (found, where) in json.loads(probe.stdout).items():
        assert found == minimums[name], f"{name} {found} is the one imported, not the minimum"
        assert os.path.realpath(where).startswith(os.path.realpath(minimum_env)), where
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests],
        cwd=REPO, capture_output=True, text=True, check=False, env=_clean_env(),
    )  # fmt: skip
    assert result.returncode == 0, f"{minimums}:\n{result.stdout[-4000:]}"
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]
