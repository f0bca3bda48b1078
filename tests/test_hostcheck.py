"""make test's host check sees what a run leaves behind, and fails the run for it."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests import hostcheck

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_new_file_in_a_watched_tree_and_a_new_path_of_ours_are_differences(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cdi = tmp_path / "run" / "cdi"
    monkeypatch.setattr(hostcheck, "WATCHED_TREES", (str(cdi),))
    monkeypatch.setattr(hostcheck, "WATCHED_GLOBS", (str(tmp_path / "run" / "enflame*"),))
    before = hostcheck.snapshot()
    assert hostcheck.differences(before, hostcheck.snapshot()) == []

    cdi.mkdir(parents=True)  # what a test writing to the real /run/cdi would do
    (tmp_path / "run" / "enflame-gcu").mkdir()
    found = hostcheck.differences(before, hostcheck.snapshot())
    assert any(line.startswith(f"{cdi}: absent -> present") for line in found), found
    assert any("enflame-gcu: absent -> present" in line for line in found), found


def test_a_process_started_during_the_run_and_still_alive_is_named() -> None:
    since = hostcheck.snapshot()["taken_at_ticks"]
    time.sleep(0.05)
    stray = subprocess.Popen(["bash", "-c", "exec -a enflame-planted-stray sleep 60"])
    try:
        deadline = time.monotonic() + 5
        found: list[str] = []
        while time.monotonic() < deadline:
            found = [line for line in hostcheck.stray_processes(since) if str(stray.pid) in line]
            if found and "enflame-planted-stray" in found[0]:
                break
            time.sleep(0.05)
        assert found and "enflame-planted-stray" in found[0], found
    finally:
        stray.kill()
        stray.wait()
    assert not [line for line in hostcheck.stray_processes(since) if str(stray.pid) in line]


def test_pytest_sh_fails_a_run_that_leaves_a_process_behind(tmp_path: pathlib.Path) -> None:
    """The wiring: ENFLAME_HOST_CHECK=1 snapshots, runs pytest, checks, and fails on a leftover."""
    pidfile = tmp_path / "pid"
    module = tmp_path / "test_leaves_a_process.py"
    module.write_text(
        "import subprocess\n"
        "def test_leave():\n"
        "    p = subprocess.Popen(['bash', '-c', 'exec -a enflame-left-behind sleep 120'],\n"
        "                         start_new_session=True)\n"
        f"    open({str(pidfile)!r}, 'w').write(str(p.pid))\n",
        "utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENFLAME_")}
    env.update(ENFLAME_HOST_CHECK="1", ENFLAME_HOST_CHECK_SETTLE="1", ENFLAME_TEST_TMPFS="0")
    env.update(TMPDIR=str(tmp_path))
    try:
        result = subprocess.run(
            ["bash", "scripts/pytest.sh", "-q", "-p", "no:cacheprovider",
             "--rootdir", str(tmp_path), "-c", "/dev/null", str(module)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False,
        )  # fmt: skip
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert "1 passed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "enflame-left-behind" in result.stderr, result.stderr[-2000:]
    assert not list(tmp_path.glob("enflame-host-check.*")), "the snapshot file is removed"


def test_usage_errors_are_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.hostcheck", "compare"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "usage" in result.stderr
