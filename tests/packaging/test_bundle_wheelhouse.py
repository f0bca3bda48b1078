"""The offline bundle's installer takes only the wheels its SHA256SUMS lists (issue 40 item 4).

A bundle laid out as ``make dist`` lays it out (ARCHES, PYTHONS, wheelhouse/<arch>, SHA256SUMS
over every file), with an ``install.sh`` that only records that it ran: the check under test
runs before it, so the real installer is not needed to see whether it would have been reached.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCH = platform.machine()
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "wheelhouse" / ARCH).mkdir(parents=True)
    shutil.copy(REPO / "packaging/bundle/install", bundle / "install")
    (bundle / "install.sh").write_text('echo "$@" > "$(dirname "$0")/ran"\n')
    (bundle / "ARCHES").write_text(f"{ARCH}\n")
    (bundle / "PYTHONS").write_text(f"{PYTHON}\n")
    (bundle / "wheelhouse/enflame_gcu-1.0-py3-none-any.whl").write_bytes(b"ours")
    (bundle / f"wheelhouse/{ARCH}/PyYAML-6.0-cp311-{ARCH}.whl").write_bytes(b"yaml")
    files = sorted(str(path.relative_to(bundle)) for path in bundle.rglob("*") if path.is_file())
    sums = subprocess.run(
        ["sha256sum", *files], cwd=bundle, check=True, capture_output=True, text=True
    ).stdout
    (bundle / "SHA256SUMS").write_text(sums)
    return bundle


def _install(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bundle / "install"), "--python", sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bundle_as_built_reaches_the_installer(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    done = _install(bundle)
    assert done.returncode == 0, done.stderr
    assert "--no-index" in (bundle / "ran").read_text()


@pytest.mark.parametrize(
    "extra",
    [f"wheelhouse/{ARCH}/evil-1.0-py3-none-any.whl", "wheelhouse/evil-1.0-py3-none-any.whl"],
)
def test_a_wheel_sha256sums_does_not_list_is_refused(tmp_path: Path, extra: str) -> None:
    bundle = _bundle(tmp_path)
    (bundle / extra).write_bytes(b"anything")
    done = _install(bundle)
    assert done.returncode != 0
    assert "SHA256SUMS does not list" in done.stderr and extra in done.stderr
    assert not (bundle / "ran").exists()


def test_a_symlinked_wheelhouse_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (bundle / "wheelhouse" / ARCH).rename(elsewhere)
    os.symlink(elsewhere, bundle / "wheelhouse" / ARCH)
    (elsewhere / "evil-1.0-py3-none-any.whl").write_bytes(b"anything")
    done = _install(bundle)
    assert done.returncode != 0
    assert not (bundle / "ran").exists()
