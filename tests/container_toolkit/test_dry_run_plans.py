"""A dry run shows what the real run then does: every step, once, with host paths."""

from __future__ import annotations

import os
import re

import pytest

from enflame_gcu.container_toolkit import installer
from enflame_gcu.simulation import simulate, topofile
from tests.container_toolkit import installer_fixtures as fx

_VERBS = re.compile(r" would be (copied|written|linked|removed)\b")
_DIR = re.compile(r"/ would be created$")
_ENGINE = re.compile(r" would be (modified|restored|created|deleted)$")
_BACKUP = re.compile(r" \(backup: [^)]*\)$")


def _plan(lines: tuple[str, ...]) -> list[str]:
    """A dry run's lines as the real run words them, without the diffs it adds."""
    out: list[str] = []
    in_diff = False
    for line in lines:
        if line.startswith("--- /"):
            in_diff = True
            continue
        if in_diff and _ENGINE.search(line):  # the engine config's own line ends its diff
            out.append(_ENGINE.sub(r" was \1", line))
            in_diff = False
            continue
        if in_diff:
            continue
        worded = line.replace("none would be written", "none written")
        if _DIR.search(worded):
            out.append(_DIR.sub("/ created", worded))
        else:
            out.append(_ENGINE.sub(r" was \1", _VERBS.sub(r" \1", worded)))
    return out


def _done(lines: tuple[str, ...]) -> list[str]:
    return [_BACKUP.sub("", line) for line in lines]


@pytest.mark.parametrize("cards", [False, True], ids=["no-gcu", "vendor-8card"])
def test_install_and_uninstall_dry_runs_match_the_real_runs(tmp_path: object, cards: bool) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"), crio=True)
    if cards:
        simulate.create(host, topofile.load("vendor-8card"))
    options = {"host_root": host, "set_as_default": True, "bin_dir": "/usr/bin"}
    before = fx.snapshot(host)
    dry = installer.InstallOptions(**options, dry_run=True)  # type: ignore[arg-type]
    plan = installer.install(dry, installer.begin(dry))
    assert fx.diff(before, fx.snapshot(host)) == []  # a dry run changes nothing
    steps = [line for line in _plan(plan.lines) if not line.startswith("  ")]
    assert len(steps) == len(set(steps)), "a step is shown twice"
    assert not [line for line in plan.lines if host in line], "paths as the host sees them"
    assert any(line.startswith("--- /etc/containerd/config.toml") for line in plan.lines)
    real = installer.InstallOptions(**options)  # type: ignore[arg-type]
    done = installer.install(real, installer.begin(real))
    assert _plan(plan.lines) == _done(done.lines)
    assert any("usable GCUs" in line for line in done.lines) is cards

    before = fx.snapshot(host)
    undo_plan = installer.uninstall(host, dry_run=True)
    assert fx.diff(before, fx.snapshot(host)) == []
    undone = installer.uninstall(host)
    assert _plan(undo_plan.lines) == _done(undone.lines)
    assert not [line for line in undone.lines if host in line]


def test_a_dry_run_names_the_restarts_it_would_make(tmp_path: object) -> None:
    host = fx.fake_host(os.path.join(str(tmp_path), "host"))
    dry = installer.InstallOptions(host_root=host, restart_engine=True, dry_run=True)
    lines = installer.install(dry, installer.begin(dry)).lines
    assert "docker: would be reloaded or restarted" in lines
    assert "containerd: would be reloaded or restarted" in lines
