"""scripts/bootstrap.sh: `make demo` installs only what the demo needs, `make test` the rest
(issue 50 point 5: the demo installed a developer's workstation), and the README says which.

The script runs for real in a copy of the checkout, with dpkg-query, apt-get, systemctl and the
interpreter replaced by recorders on PATH: what it would install is what they were asked for.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO_DEBS = {"runc", "busybox-static", "gcc"}

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$RECORD"
case "$(basename "$0")" in
    dpkg-query) exit 1 ;;   # nothing is installed
esac
exit 0
"""
# The interpreter: `-c` checks pass, `-m venv DIR` makes DIR/bin/python (this same recorder).
PYTHON = """#!/bin/sh
echo "python $*" >> "$RECORD"
if [ "$1" = -m ] && [ "$2" = venv ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && chmod +x "$3/bin/python"
fi
exit 0
"""


def _run(tmp_path: pathlib.Path, *args: str) -> list[str]:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", checkout / "scripts" / "bootstrap.sh")
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("dpkg-query", "apt-get", "systemctl", "id"):
        (bin_dir / name).write_text(RECORDER if name != "id" else "#!/bin/sh\necho 0\n", "utf-8")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python3").write_text(PYTHON, "utf-8")
    (bin_dir / "python3").chmod(0o755)
    record = tmp_path / "record.txt"
    record.write_text("", "utf-8")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RECORD": str(record),
        "VENV_PYTHON": str(bin_dir / "python3"),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        ["bash", "scripts/bootstrap.sh", *args], cwd=checkout, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return record.read_text("utf-8").splitlines()


def _installed(calls: list[str]) -> set[str]:
    debs: set[str] = set()
    for call in calls:
        if call.startswith("apt-get ") and " install " in call:
            debs |= {w for w in call.split()[1:] if not w.startswith("-") and w != "install"}
    return debs


def test_the_demo_set_is_the_demos_needs_only(tmp_path: pathlib.Path) -> None:
    calls = _run(tmp_path, "demo")
    assert _installed(calls) - {"python3-venv"} == DEMO_DEBS
    pip = [c for c in calls if " pip install " in c]
    assert any(c.endswith("-e .[plugin]") for c in pip), pip
    assert not any(".[dev]" in c or "helm" in c for c in calls), calls
    assert not any(c.startswith("systemctl") for c in calls)  # no service touched


def test_the_test_set_is_the_rest_too(tmp_path: pathlib.Path) -> None:
    calls = _run(tmp_path)
    debs = _installed(calls)
    assert DEMO_DEBS | {"containerd", "podman", "shellcheck", "prometheus", "strace"} <= debs
    assert any(c.endswith("-e .[dev]") for c in calls), calls
    assert any("helm-python-sdk" in c for c in calls), calls


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readme_lists_what_each_target_installs(readme: str, tmp_path: pathlib.Path) -> None:
    text = (ROOT / readme).read_text("utf-8")
    setup = text.split("\n## ", 2)[1]  # the set-up section, first of all
    for deb in sorted(DEMO_DEBS):
        assert f"`{deb}`" in setup, deb
    rest = _installed(_run(tmp_path)) - DEMO_DEBS - {"python3-venv"}
    for deb in sorted(rest):
        assert f"`{deb}`" in setup, (readme, deb)


def test_an_unknown_set_is_refused(tmp_path: pathlib.Path) -> None:
    checkout = tmp_path / "c"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", checkout / "scripts" / "bootstrap.sh")
    result = subprocess.run(
        ["bash", "scripts/bootstrap.sh", "everything"], cwd=checkout,
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 2 and "unknown set 'everything'" in result.stderr
