"""promtool (Debian's ``prometheus`` package, installed by scripts/bootstrap.sh) for the tests that
check our metric families and prove the chart's alert rules: a missing promtool skips the test
on a developer's machine and fails it under CI=true, where it must be there."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

MISSING = "no promtool: scripts/bootstrap.sh installs Debian's prometheus package, which ships it"


def binary() -> str:
    """promtool's path; skips (fails under CI=true) when it is not installed."""
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None
    )
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return found


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` with its output captured."""
    return subprocess.run(
        [binary(), *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
    )
