"""Fixtures shared by the installer tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Our wheel and the node dependencies, built once per test process, so installs that are
    not about building the source tree run offline, the same each time, without a build each."""
    out = str(tmp_path_factory.mktemp("wheelhouse"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", out, PROJECT_ROOT], check=True)
    subprocess.run([*pip, "download", "-d", out, "tomlkit", "PyYAML", "asyncinotify"], check=True)
    return out
