"""install.sh upgrades never break the runtime path (issue 22 item 3).

The runtime launcher imports from install.sh's venv on every runc call. An upgrade builds a
new venv beside the old one and switches ``PREFIX/venv`` (a link) with one rename, so killing
the upgrade at any step, SIGKILL included, leaves a runtime that works. A loop calls the
runtime's ``state``/``delete`` through the installed launcher the whole time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from enflame_gcu.shim import launcher
from tests.conftest import PROJECT_ROOT
from tests.container_toolkit import installer_fixtures as fx

INSTALL_SH = os.path.join(PROJECT_ROOT, "deploy", "install.sh")
PREFIX = "/opt/enflame-gcu"
LAUNCHER = f"{PREFIX}/bin/enflame-container-runtime"
# Each named step of install.sh's upgrade (its fault points), then kills while pip runs.
STEPS = ("venv-created", "pip-installed", "venv-switched")
PIP_KILL_DELAYS = (0.4, 0.9, 1.4)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("install_sh")]


def _install(host: str, wheelhouse: str, **env: str) -> subprocess.Popen[str]:
    python = shutil.which("python3") or sys.executable
    pip_args = f"--no-index --find-links {wheelhouse} --force-reinstall"
    [wheel] = [n for n in os.listdir(wheelhouse) if n.startswith("enflame_gcu-")]
    return subprocess.Popen(
        ["bash", INSTALL_SH, "--host-root", host, "--python", python, "--mode", "default-runtime",
         "--wheel", os.path.join(wheelhouse, wheel), "--pip-args", pip_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env}, start_new_session=True,
    )  # fmt: skip


class RuntimeLoop:
    """Calls the installed runtime (``state``, ``delete``) until stopped; keeps every failure."""

    def __init__(self, host: str) -> None:
        with open(os.path.join(host, LAUNCHER.lstrip("/")), encoding="utf-8") as handle:
            text = handle.read()
        python = launcher.front_python(text)  # the sh front's python: what an upgrade moves
        assert python, text[:300]
        self.python = os.path.join(host, python.lstrip("/"))
        # The front's Python part as it is, its host paths seen from here (the same venv link).
        package = re.search(r'sys\.path\.insert\(0, "([^"]+)"\)', text)
        assert package, text
        body = (
            f"import sys\nsys.path.insert(0, {json.dumps(host + package[1])})\n"
            "from enflame_gcu.shim.main import main\nsys.exit(main())\n"
        )
        self.script = os.path.join(host, "launcher-seen-from-here.py")
        with open(self.script, "w", encoding="utf-8") as handle:
            handle.write(body)
        # runc's state root for these calls: without --root, runc makes its default /run/runc.
        self.runc_root = os.path.join(host, "runc-root")
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # Between runtime calls too: the module the launcher imports, polled every millisecond
        # (pip replacing the package in place leaves it missing for a moment).
        self.module = os.path.join(host + package[1], "enflame_gcu", "shim", "main.py")
        self.missing = 0
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            if not os.path.isfile(self.module):
                self.missing += 1
            time.sleep(0.001)

    def _run(self) -> None:
        # Ten rounds a second: the switch itself is one rename, and the module poller above
        # watches every millisecond; back to back, the calls took a core from pip.
        while not self._stop.wait(0.1):
            for verb in ("state", "delete"):
                try:
                    done = subprocess.run(
                        [self.python, "-IS", self.script, "--root", self.runc_root, verb,
                         "no-such-container"],
                        capture_output=True, text=True, timeout=30, check=False,
                    )  # fmt: skip
                except OSError as exc:  # the interpreter path itself is gone
                    self.failures.append(f"{verb}: {exc}")
                    continue
                self.calls += 1
                # runc answers "container does not exist" (exit 1): the runtime itself ran.
                if done.returncode != 1 or "Error" in done.stderr or "Traceback" in done.stderr:
                    self.failures.append(f"{verb}: rc {done.returncode}: {done.stderr[-400:]}")

    def __enter__(self) -> RuntimeLoop:
        self._thread.start()
        self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._poller.join(60)


@pytest.fixture
def installed(tmp_path: os.PathLike[str], wheelhouse: str) -> Iterator[str]:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"), docker=False)
    os.makedirs(os.path.join(host, "var/lib/kubelet"))
    first = _install(host, wheelhouse)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    yield host


def test_killing_an_upgrade_at_any_step_leaves_the_runtime_working(
    installed: str, wheelhouse: str
) -> None:
    host = installed
    venv = os.path.join(host, PREFIX.lstrip("/"), "venv")
    assert os.path.islink(venv), "the live venv is a link switched in one rename"
    first = os.readlink(venv)
    with RuntimeLoop(host) as loop:
        for step in STEPS:
            upgrade = _install(host, wheelhouse, ENFLAME_TEST_KILL_AT=step)
            out, err = upgrade.communicate(timeout=300)
            assert upgrade.returncode == -signal.SIGKILL, f"{step}: not killed there\n{err}"
        for delay in PIP_KILL_DELAYS:
            upgrade = _install(host, wheelhouse)
            time.sleep(delay)
            os.killpg(upgrade.pid, signal.SIGKILL)
            upgrade.communicate(timeout=60)
        # And one upgrade that finishes: the link moves, every earlier venv is removed.
        done = _install(host, wheelhouse)
        out, err = done.communicate(timeout=300)
        assert done.returncode == 0, out + err
        time.sleep(0.5)
    assert loop.calls > 20, loop.calls
    assert loop.failures == [], loop.failures[:5]
    assert loop.missing == 0, f"the runtime's module was missing {loop.missing} times"
    live = os.readlink(venv)
    assert live != first
    assert os.listdir(os.path.join(host, PREFIX.lstrip("/"), "venvs")) == [os.path.basename(live)]


def test_uninstall_after_upgrades_removes_every_venv(installed: str, wheelhouse: str) -> None:
    host = installed
    upgrade = _install(host, wheelhouse)
    out, err = upgrade.communicate(timeout=300)
    assert upgrade.returncode == 0, out + err
    undo = subprocess.run(
        ["bash", INSTALL_SH, "--uninstall", "--host-root", host],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert undo.returncode == 0, undo.stderr
    assert not os.path.lexists(os.path.join(host, PREFIX.lstrip("/")))


def test_upgrading_an_install_from_before_venvs_swaps_the_directory_in_one_step(
    installed: str, wheelhouse: str
) -> None:
    # The layout install.sh made before venvs/: PREFIX/venv a directory of its own.
    prefix = os.path.join(installed, PREFIX.lstrip("/"))
    venv = os.path.join(prefix, "venv")
    live = os.path.join(prefix, os.readlink(venv))
    os.unlink(venv)
    os.rename(live, venv)
    with RuntimeLoop(installed) as loop:
        done = _install(installed, wheelhouse)
        out, err = done.communicate(timeout=300)
        assert done.returncode == 0, out + err
        time.sleep(0.5)
    assert loop.failures == [] and loop.missing == 0, (loop.failures[:5], loop.missing)
    assert os.path.islink(venv)
    assert os.listdir(os.path.join(prefix, "venvs")) == [os.path.basename(os.readlink(venv))]
