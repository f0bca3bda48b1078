"""install.sh installs the toolkit's systemd units and the logrotate file; uninstall removes them.

Issue 23 item 6: the guide says to run ``cdi watch`` as a service, re-create the ``/dev/char``
links after a reboot and refresh the prepared edits; the units doing that are checked by
``systemd-analyze verify`` (systemd's own parser, with every ExecStart binary present).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from enflame_gcu.container_toolkit import cdi_service
from tests.conftest import PROJECT_ROOT
from tests.container_toolkit import installer_fixtures as fx

INSTALL_SH = os.path.join(PROJECT_ROOT, "deploy", "install.sh")
DEV_ENV = os.path.dirname(os.path.dirname(sys.executable))
UNIT_DIR = "etc/systemd/system"
LOGROTATE = "etc/logrotate.d/enflame-container-runtime"


def install_sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", INSTALL_SH, *args], capture_output=True, text=True, timeout=110, check=False
    )


def verify_units(paths: list[str], host: str, scratch: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on ``paths``, their host paths as seen from here."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze comes with systemd (installed by make test's bootstrap)"
    os.makedirs(scratch, exist_ok=True)
    copies = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()

        def local(match: re.Match[str]) -> str:
            return "ExecStart=" + os.path.realpath(os.path.join(host, match[1].lstrip("/")))

        copy = os.path.join(scratch, os.path.basename(path))
        with open(copy, "w", encoding="utf-8") as handle:
            handle.write(re.sub(r"^ExecStart=(\S+)", local, text, flags=re.M))
        copies.append(copy)
    return subprocess.run(
        [analyze, "verify", "--man=no", *copies], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("mode", ["default-runtime", "cdi"])
def test_install_sh_installs_verified_units_and_logrotate_and_uninstall_removes_them(
    tmp_path: os.PathLike[str], mode: str
) -> None:
    cdi = mode == "cdi"  # on CRI-O (it resolves CDI itself)
    host = fx.fake_host(
        os.path.join(str(tmp_path), "host"), docker=not cdi, containerd=not cdi, crio=cdi
    )
    before = fx.snapshot(host)
    done = install_sh("--host-root", host, "--use-env", DEV_ENV, "--mode", mode)
    assert done.returncode == 0, done.stderr
    expected = {*cdi_service.BOOT_UNITS, *([cdi_service.UNIT_NAME] if mode == "cdi" else [])}
    found = sorted(os.listdir(os.path.join(host, UNIT_DIR)))
    assert found == sorted(expected)
    assert "systemctl daemon-reload && systemctl enable --now" in done.stderr  # no systemd here
    result = verify_units(
        [os.path.join(host, UNIT_DIR, name) for name in found],
        host,
        os.path.join(str(tmp_path), "verify"),
    )
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr
    if cdi:  # no wrapper, so no runtime log to rotate
        assert not os.path.exists(os.path.join(host, LOGROTATE))
    else:
        with open(os.path.join(host, LOGROTATE), encoding="utf-8") as handle:
            assert "/var/log/enflame/*.log" in handle.read()
    undo = install_sh("--uninstall", "--host-root", host, "--use-env", DEV_ENV)
    assert undo.returncode == 0, undo.stderr
    assert fx.diff(before, fx.snapshot(host)) == []


def test_an_edited_logrotate_file_is_kept_on_uninstall(tmp_path: os.PathLike[str]) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"))
    assert install_sh("--host-root", host, "--use-env", DEV_ENV).returncode == 0
    with open(os.path.join(host, LOGROTATE), "a", encoding="utf-8") as handle:
        handle.write("# rotate 8 here\n")
    undo = install_sh("--uninstall", "--host-root", host, "--use-env", DEV_ENV)
    assert undo.returncode == 0, undo.stderr
    assert os.path.exists(os.path.join(host, LOGROTATE))
    assert "kept /etc/logrotate.d/enflame-container-runtime: edited" in undo.stderr
