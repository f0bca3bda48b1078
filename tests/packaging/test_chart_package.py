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
