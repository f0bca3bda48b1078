"""Where each command's output goes (docs/user-guide.md, "Exit codes and output").

The rule: a command's result (what --json carries, a dry run's plan, `cdi generate` to stdout)
is on stdout, unprefixed; progress, notes, warnings and errors are on stderr, every line as
``enflame-ctk: ...``. A command that changes the node has the node's new state as its result:
its real run leaves stdout empty and reports on stderr. Each command runs for real, as its own
process, on a simulated host.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from enflame_gcu.container_toolkit.commands import common
from enflame_gcu.container_toolkit.engines import changes
from tests.conftest import MakeNode
from tests.container_toolkit import installer_fixtures as fx

CTK = [sys.executable, "-m", "enflame_gcu.container_toolkit.cli"]
PREFIX = "enflame-ctk: "


def ctk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTK, *args], capture_output=True, text=True, timeout=120, check=False)


def reports_on_stderr_only(result: subprocess.CompletedProcess[str]) -> list[str]:
    """A real run: nothing on stdout; stderr's lines, each with the prefix (returned without)."""
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines, "a real run says what it did"
    assert [line for line in lines if not line.startswith(PREFIX)] == []
    return [line.removeprefix(PREFIX) for line in lines]


def plan_on_stdout(result: subprocess.CompletedProcess[str]) -> list[str]:
    """A dry run: the plan on stdout, unprefixed; stderr only prefixed lines, if any."""
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and not [line for line in lines if line.startswith(PREFIX)]
    assert [line for line in result.stderr.splitlines() if not line.startswith(PREFIX)] == []
    return lines


@pytest.fixture
def host(make_node: MakeNode) -> str:
    root = make_node("vendor-8card")
    return fx.fake_host(root)


def test_install_and_uninstall_report_on_stderr_and_dry_runs_plan_on_stdout(host: str) -> None:
    before = fx.snapshot(host)
    args = ("--host-root", host, "--set-as-default")
    plan = plan_on_stdout(ctk("install", *args, "--dry-run"))
    assert "/opt/enflame-gcu/ would be created" in plan
    assert any(line.startswith("--- /etc/containerd/config.toml") for line in plan)
    assert fx.diff(before, fx.snapshot(host)) == []
    done = reports_on_stderr_only(ctk("install", *args))
    assert "/opt/enflame-gcu/ created" in done
    assert any('added default-runtime = "enflame"' in line for line in done)
    undo_plan = plan_on_stdout(ctk("uninstall", "--host-root", host, "--dry-run"))
    assert "/opt/enflame-gcu/ would be removed" in undo_plan
    undone = reports_on_stderr_only(ctk("uninstall", "--host-root", host))
    assert "/opt/enflame-gcu/ removed" in undone
    assert fx.diff(before, fx.snapshot(host)) == []


def test_runtime_configure_and_unconfigure_report_on_stderr(host: str) -> None:
    fx.write(host, "/usr/bin/enflame-container-runtime", "#!/bin/sh\n", 0o755)  # installed
    args = ("--runtime", "containerd", "--host-root", host)
    plan = plan_on_stdout(ctk("runtime", "configure", *args, "--dry-run"))
    assert plan[0] == "--- /etc/containerd/config.toml"
    assert "/etc/containerd/config.toml would be modified" in plan
    done = reports_on_stderr_only(ctk("runtime", "configure", *args, "--set-as-default"))
    assert done[0].startswith("/etc/containerd/config.toml was modified")
    # The engine reads its config at start only: the command says so (issue 50 point 6).
    restart = "containerd: restart it so it loads the change (systemctl restart containerd)"
    assert done[-1].startswith(restart), done
    again = reports_on_stderr_only(ctk("runtime", "configure", *args, "--set-as-default"))
    assert again == ["/etc/containerd/config.toml: already up to date, nothing written"]
    undone = reports_on_stderr_only(ctk("runtime", "unconfigure", *args))
    assert undone[0].startswith("/etc/containerd/config.toml was restored")
    assert undone[-1].startswith(restart), undone


def test_dev_char_links_report_on_stderr_and_plan_on_stdout(host: str) -> None:
    args = ("system", "create-dev-char-symlinks", "--host-root", host)
    plan = plan_on_stdout(ctk(*args, "--dry-run"))
    assert "/dev/char/238:0 -> ../gcu0: would be created" in plan
    done = reports_on_stderr_only(ctk(*args))
    assert "/dev/char/238:0 -> ../gcu0: created" in done


def test_a_failed_install_says_so_on_stderr_every_line_prefixed(host: str) -> None:
    fx.write(host, "/etc/docker/daemon.json", "{not json")
    before = fx.snapshot(host)
    result = ctk("install", "--host-root", host)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) > 1 and all(line.startswith(PREFIX) for line in lines), lines
    assert any("daemon.json" in line for line in lines)
    assert fx.diff(before, fx.snapshot(host)) == []


def test_a_multi_line_note_carries_the_prefix_on_every_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common.note("first\nsecond\n")
    common.note("")
    assert capsys.readouterr().err == f"{PREFIX}first\n{PREFIX}second\n{PREFIX}\n"


def test_cdi_watch_reports_each_spec_it_writes_on_stderr_with_the_prefix(
    make_node: MakeNode, tmp_path: os.PathLike[str]
) -> None:
    """A watcher's news is what it writes: shown at info unless --log-level says otherwise
    (it once called basicConfig after main had, so its lines were silently dropped)."""
    root = make_node()
    output = f"{tmp_path}/cdi"
    process = subprocess.Popen(
        [*CTK, "cdi", "watch", "--host-root", root, "--output", output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    lines = [process.stderr.readline() for _ in range(2)]  # the start note, the first write
    process.terminate()
    out, rest = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out == ""
    result = subprocess.CompletedProcess(process.args, 0, out, "".join(lines) + rest)
    said = reports_on_stderr_only(result)
    assert f"INFO: {output}/enflame.com-gcu.yaml written" in said, said


def test_the_dry_run_summary_writes_values_as_the_file_does(host: str) -> None:
    """TOML's true and "..." for containerd, JSON's for docker: not Python's True and '...'."""
    fx.write(host, "/usr/bin/enflame-container-runtime", "#!/bin/sh\n", 0o755)
    fx.write(
        host,
        "/etc/containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n",
    )
    args = ("--runtime", "containerd", "--host-root", host, "--set-as-default", "--dry-run")
    summary = [line for line in plan_on_stdout(ctk("runtime", "configure", *args)) if "=" in line]
    enflame = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.enflame'
    assert f"  added {enflame}.options.SystemdCgroup = true" in summary, summary
    binary = f'  added {enflame}.options.BinaryName = "/usr/bin/enflame-container-runtime"'
    assert binary in summary, summary
    assert not any("True" in line or "'" in line for line in summary), summary
    fx.write(host, "/etc/docker/daemon.json", '{"default-runtime": "runc"}\n')
    docker = ("--runtime", "docker", "--host-root", host, "--set-as-default", "--dry-run")
    summary = plan_on_stdout(ctk("runtime", "configure", *docker))
    assert '  set default-runtime = "enflame" (was "runc")' in summary, summary


@pytest.mark.parametrize(
    ("value", "toml", "json_"),
    [
        (False, "false", "false"),
        ("", '""', '""'),
        (["a", 1], '["a", 1]', '["a", 1]'),
        ({"path": "/x", "weird key": True}, '{ path = "/x", "weird key" = true }',
         '{"path": "/x", "weird key": true}'),
        ({}, "{}", "{}"),
        ('say "hi"\n', '"say \\"hi\\"\\n"', '"say \\"hi\\"\\n"'),
    ],
)  # fmt: skip
def test_a_changed_value_is_written_in_the_files_syntax(
    value: object, toml: str, json_: str
) -> None:
    assert changes.literal(value, "toml") == toml
    assert changes.literal(value, "json") == json_
