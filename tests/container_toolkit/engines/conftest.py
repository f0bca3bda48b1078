"""Fixtures for the engine config editor tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest

from tests.container_toolkit.engines.helpers import GOLDEN_DIR

InstallGolden = Callable[[str, str], str]


@pytest.fixture
def install_golden(tmp_path: os.PathLike[str]) -> InstallGolden:
    """Copy golden input ``name`` to ``relpath`` under tmp_path; returns the new path."""

    def install(name: str, relpath: str) -> str:
        dest = os.path.join(str(tmp_path), relpath)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        src = os.path.join(GOLDEN_DIR, name)
        if os.path.isdir(src):
            shutil.copytree(src, dest)
        else:
            shutil.copyfile(src, dest)
        return dest

    return install
