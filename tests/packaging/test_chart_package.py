"""``make chart-package``: laid out as `helm package` does, reproducible, named as documented."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile

import yaml

from tests.deploy.helpers import CHART_DIR, REPO


def _package(out: str) -> str:
    env = {**os.environ, "DIST_DIR": out}
    result = subprocess.run(
        ["bash", "scripts/chart-package.sh"], cwd=REPO, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with open(os.path.join(CHART_DIR, "Chart.yaml"), encoding="utf-8") as handle:
        chart = yaml.safe_load(handle)
    path = os.path.join(out, f"{chart['name']}-{chart['version']}.tgz")
    assert result.stdout.strip() == f"chart-package: {path}"
    return path


def test_chart_package_is_the_chart_under_its_name_and_reproducible(tmp_path: object) -> None:
    first = _package(os.path.join(str(tmp_path), "a"))
    second = _package(os.path.join(str(tmp_path), "b"))
    with open(first, "rb") as one, open(second, "rb") as two:
        assert hashlib.sha256(one.read()).digest() == hashlib.sha256(two.read()).digest()
    with tarfile.open(first) as archive:
        names = archive.getnames()
        chart = yaml.safe_load(archive.extractfile("enflame-gcu/Chart.yaml").read())  # type: ignore[union-attr]
    expected = []
    for directory, _, files in os.walk(CHART_DIR):
        expected += [
            "enflame-gcu/" + os.path.relpath(os.path.join(directory, f), CHART_DIR) for f in files
        ]
    assert sorted(names) == sorted(expected)
    assert os.path.basename(first) == f"enflame-gcu-{chart['version']}.tgz"
    with open(os.path.join(REPO, "docs", "packaging.md"), encoding="utf-8") as handle:
        documented = handle.read()
    assert "`enflame-gcu-<version>.tgz` | `make chart-package`" in documented


def test_chart_package_refuses_a_chart_out_of_step_with_the_package(tmp_path: object) -> None:
    """The packaged chart's version and appVersion are the package's, or nothing is written."""
    import shutil

    root = os.path.join(str(tmp_path), "tree")
    shutil.copytree(CHART_DIR, os.path.join(root, "deploy", "helm", "enflame-gcu"))
    os.makedirs(os.path.join(root, "scripts"))
    shutil.copy(os.path.join(REPO, "scripts", "chart-package.sh"), os.path.join(root, "scripts"))
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        pyproject = handle.read()
    with open(os.path.join(root, "pyproject.toml"), "w", encoding="utf-8") as handle:
        handle.write(pyproject.replace('\nversion = "', '\nversion = "9.', 1))
    out = os.path.join(str(tmp_path), "out")
    result = subprocess.run(
        ["bash", "scripts/chart-package.sh"], cwd=root, capture_output=True, text=True,
        env={**os.environ, "DIST_DIR": out, "PY": os.path.join(REPO, ".venv", "bin", "python")},
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pyproject.toml 9." in result.stderr and "nothing written" in result.stderr
    assert os.listdir(out) == []
