"""Fixtures shared by the installer tests."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT

# What a wheel of the project is built from (pyproject's readme, packages and package data).
SOURCE_FILES = ("pyproject.toml", "README.md", "src")


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Our wheel and the node dependencies, built once per run and shared by the test processes
    (xdist workers share the base temp's parent), so installs that are not about building the
    source tree run offline, the same each time, without a build or a download each.

    The wheel is built from a copy of the tree: setuptools writes ``build/`` beside the
    sources, and a build in the tree itself races the source-tree install of another worker."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = os.path.join(str(shared), "wheelhouse")
    with open(os.path.join(str(shared), "wheelhouse.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(out, ".complete")):
            shutil.rmtree(out, ignore_errors=True)
            tree = os.path.join(str(shared), "wheelhouse-source")
            shutil.rmtree(tree, ignore_errors=True)
            os.makedirs(tree)
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            for name in SOURCE_FILES:
                source = os.path.join(PROJECT_ROOT, name)
                if os.path.isdir(source):
                    shutil.copytree(source, os.path.join(tree, name), ignore=ignore)
                else:
                    shutil.copy(source, tree)
            pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
            subprocess.run([*pip, "wheel", "--no-deps", "-w", out, tree], check=True)
            deps = ("tomlkit", "PyYAML", "asyncinotify")
            subprocess.run([*pip, "download", "-d", out, *deps], check=True)
            with open(os.path.join(out, ".complete"), "w", encoding="utf-8"):
                pass
    return out
