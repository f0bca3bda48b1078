"""The habits stay wired: pre-commit runs exactly what ``make test`` runs before pytest."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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
