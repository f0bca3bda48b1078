"""Pass-through: every call but create/run reaches the low-level runtime unchanged, fast path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

import enflame_gcu
from enflame_gcu import naming
from enflame_gcu.shim import launcher
from tests.shim import launch
from tests.shim.conftest import MakeBundle, WriteConfig

FAKE = """#!/bin/sh
# A stand-in low-level runtime: records how it was called, one argument per line.
printf '%s\\n' "$0" "$@" > "$FAKE_RUNC_RECORD"
exit 7
"""


def make_fake_runc(directory: str) -> tuple[str, str]:
    """Write the fake runtime; returns (its path, the file it records its argv in)."""
    path = os.path.join(directory, "fake-runc")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(FAKE)
    os.chmod(path, 0o755)  # noqa: S103 - an executable script, like runc itself
    return path, os.path.join(directory, "record")


@pytest.fixture
def fake_runc(tmp_path: os.PathLike[str]) -> tuple[str, str]:
    """(fake runtime path, file it records its argv in)."""
    return make_fake_runc(str(tmp_path))


@pytest.fixture
def wrapper(tmp_path: os.PathLike[str]) -> str:
    """The minimal-start launcher, as installed."""
    return launch.write_launcher(str(tmp_path))


@dataclass(frozen=True)
class Setup:
    """The wrapper with a fake low-level runtime on the simulated node."""

    tmp: str
    wrapper: str
    fake: str
    record: str
    node: str
    write_config: WriteConfig
    make_bundle: MakeBundle

    def run(self, args: list[str], config: str) -> subprocess.CompletedProcess[bytes]:
        return launch.run(self.wrapper, args, config, extra_env={"FAKE_RUNC_RECORD": self.record})


@pytest.fixture
def setup(
    tmp_path: os.PathLike[str],
    vendor_node: str,
    write_config: WriteConfig,
    make_bundle: MakeBundle,
) -> Setup:
    """Everything a create-through-the-wrapper test needs."""
    wrapper = launch.write_launcher(str(tmp_path))
    fake_runc = make_fake_runc(str(tmp_path))
    return Setup(str(tmp_path), wrapper, *fake_runc, vendor_node, write_config, make_bundle)


def recorded(record: str) -> list[str] | None:
    if not os.path.exists(record):
        return None
    with open(record, encoding="utf-8") as handle:
        return handle.read().splitlines()


STATE_ARGS = ["--root", "/run/x", "--log", "/b/log.json", "--log-format", "json", "state", "c1"]


@pytest.mark.parametrize(
    "args",
    [
        STATE_ARGS,
        ["start", "create"],
        ["delete", "--force", "create"],
        ["--debug", "--systemd-cgroup", "kill", "c1", "KILL"],
        ["exec", "--process", "/tmp/p.json", "c1"],
        ["spec", "--bundle", "/nonexistent"],
    ],
)
def test_non_create_calls_exec_the_runtime_with_identical_argv(
    wrapper: str, fake_runc: tuple[str, str], write_config: WriteConfig, args: list[str]
) -> None:
    path, record = fake_runc
    config = write_config(runtimes=[path], root="/nonexistent-root")
    result = launch.run(wrapper, args, config, extra_env={"FAKE_RUNC_RECORD": record})
    assert result.returncode == 7  # the fake's own exit code: the wrapper exec'd it
    assert result.stdout == b""
    assert result.stderr == b""
    assert recorded(record) == [path, *args]


@pytest.mark.runc
def test_version_names_ours_then_the_low_level_runtimes(
    fake_runc: tuple[str, str], wrapper: str, write_config: WriteConfig
) -> None:
    runc = shutil.which("runc")
    assert runc, "runc is installed by make test"
    config = write_config(runtimes=[runc])
    result = launch.run(wrapper, ["--version"], config)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"enflame-container-runtime version {enflame_gcu.__version__}"
    assert lines[1] == f"low-level runtime: {runc}"
    assert lines[2].startswith("runc version "), lines  # runc's own answer, exec'd
    # With a subcommand, --version is that command's business: passed through untouched.
    path, record = fake_runc
    config = write_config(runtimes=[path])
    result = launch.run(
        wrapper, ["state", "--version"], config, extra_env={"FAKE_RUNC_RECORD": record}
    )
    assert result.stdout == b""
    assert recorded(record) == [path, "state", "--version"]


def test_console_script_passes_through_too(
    fake_runc: tuple[str, str], write_config: WriteConfig
) -> None:
    path, record = fake_runc
    config = write_config(runtimes=[path])
    result = launch.run(
        launch.CONSOLE_SCRIPT, STATE_ARGS, config, extra_env={"FAKE_RUNC_RECORD": record}
    )
    assert result.returncode == 7
    assert recorded(record) == [path, *STATE_ARGS]


def test_runtime_is_found_on_path_and_never_itself(
    tmp_path: os.PathLike[str], fake_runc: tuple[str, str], write_config: WriteConfig
) -> None:
    path, record = fake_runc
    bin_dir = os.path.join(str(tmp_path), "bin")
    os.mkdir(bin_dir)
    me = launch.write_launcher(bin_dir, "runc")  # the wrapper installed under runc's name
    os.symlink(path, os.path.join(bin_dir, "crun"))
    config = write_config(runtimes=["runc", "crun"])
    env = {"FAKE_RUNC_RECORD": record, "PATH": bin_dir}
    result = launch.run(me, ["state", "c1"], config, extra_env=env)
    assert result.returncode == 7, result.stderr
    assert recorded(record) == [os.path.join(bin_dir, "crun"), "state", "c1"]


def test_no_runtime_found_is_a_clear_error(
    tmp_path: os.PathLike[str], wrapper: str, write_config: WriteConfig
) -> None:
    config = write_config(runtimes=["no-such-runc", wrapper])
    log = os.path.join(str(tmp_path), "log.json")
    result = launch.run(
        wrapper, ["--log", log, "--log-format", "json", "state", "c1"], config,
        extra_env={"PATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 1
    message = result.stderr.decode()
    assert "no low-level runtime found" in message
    assert "no-such-runc (not on PATH)" in message
    assert f"{wrapper} (is this wrapper itself)" in message
    with open(log, encoding="utf-8") as handle:
        entry = json.loads(handle.read())
    assert entry["level"] == "error"
    assert "no low-level runtime found" in entry["msg"]


BROKEN_CONFIGS = {
    # name: (text after a first line `runtimes = [FAKE]`, the line named, what is named)
    "newer version (unknown key)": ('future-key = "x"\n', 2, "unknown key(s) future-key"),
    "bad value type": ("log-level = 3\n", 2, "log-level must be a string"),
    "table": ("[extra]\n", 2, "tables are not supported"),
    "not UTF-8": ('root = "/\udcff"\n', 2, "is not UTF-8"),
    "Unicode digit as integer": ("n = ²\n", 2, "expected a value"),
}
# Files that still parse keep their (valid) runtimes; the others fall back to the defaults.
PARSES = ("newer version (unknown key)", "bad value type")


def _broken_config(directory: str, runtimes_line: str, name: str) -> str:
    path = os.path.join(directory, "config.toml")
    with open(path, "wb") as handle:
        handle.write((runtimes_line + BROKEN_CONFIGS[name][0]).encode("utf-8", "surrogateescape"))
    return path


@pytest.mark.parametrize("name", list(BROKEN_CONFIGS))
@pytest.mark.parametrize(
    "args",
    [["--root", "/run/x", "state", "c1"], ["kill", "c1", "KILL"], ["delete", "--force", "c1"],
     ["start", "c1"], ["--version"]],
    ids=["state", "kill", "delete", "start", "version"],
)  # fmt: skip
def test_a_broken_config_does_not_stop_non_create_calls(
    tmp_path: os.PathLike[str], wrapper: str, fake_runc: tuple[str, str], name: str,
    args: list[str],
) -> None:  # fmt: skip
    path, record = fake_runc
    bin_dir = os.path.join(str(tmp_path), "bin")  # the fake is also "runc" on PATH
    os.mkdir(bin_dir)
    os.symlink(path, os.path.join(bin_dir, "runc"))
    config = _broken_config(str(tmp_path), f"runtimes = [{json.dumps(path)}]\n", name)
    env = {"FAKE_RUNC_RECORD": record, "PATH": bin_dir}
    result = launch.run(wrapper, args, config, extra_env=env)
    assert result.returncode == 7, result.stderr  # the low-level runtime ran, as it was asked
    runtime = path if name in PARSES else os.path.join(bin_dir, "runc")
    assert recorded(record) == [runtime, *args]
    # --version names us and the runtime first (stdout is ours there), then execs it.
    ours = f"enflame-container-runtime version {enflame_gcu.__version__}\n"
    assert result.stdout == (ours.encode() + f"low-level runtime: {runtime}\n".encode()
                             if args == ["--version"] else b"")  # fmt: skip
    [line] = result.stderr.decode().splitlines()  # said once
    _, number, problem = BROKEN_CONFIGS[name]
    assert line.startswith("enflame-container-runtime: warning: ")
    assert f"{config} line {number}: " in line and problem in line
    kept = "the configured runtimes" if name in PARSES else "the default runtimes (runc, crun)"
    assert line.endswith(f"; using {kept}" + (f" ({path})" if name in PARSES else ""))


def test_a_broken_config_falls_back_to_the_default_runtimes_on_path(
    tmp_path: os.PathLike[str], wrapper: str, fake_runc: tuple[str, str]
) -> None:
    path, record = fake_runc
    bin_dir = os.path.join(str(tmp_path), "bin")
    os.mkdir(bin_dir)
    os.symlink(path, os.path.join(bin_dir, "runc"))
    config = _broken_config(str(tmp_path), 'runtimes = ["/nonexistent/runc"]\n', "table")
    env = {"FAKE_RUNC_RECORD": record, "PATH": bin_dir}
    result = launch.run(wrapper, ["state", "c1"], config, extra_env=env)
    assert result.returncode == 7, result.stderr
    assert recorded(record) == [os.path.join(bin_dir, "runc"), "state", "c1"]
    message = result.stderr.decode()
    assert f"{config} line 2: " in message and "the default runtimes (runc, crun)" in message


@pytest.mark.parametrize("name", list(BROKEN_CONFIGS))
def test_a_broken_config_fails_create_before_runc_naming_file_and_line(
    setup: Setup, name: str
) -> None:
    config = _broken_config(setup.tmp, f"runtimes = [{json.dumps(setup.fake)}]\n", name)
    bundle = setup.make_bundle(env=[f"{naming.VISIBLE_DEVICES_ENV}=0"])
    log = os.path.join(setup.tmp, "log.json")
    result = setup.run(["--log", log, "--log-format", "json", "create", "-b", bundle, "c1"], config)
    assert result.returncode == 1
    assert recorded(setup.record) is None
    _, number, problem = BROKEN_CONFIGS[name]
    [line] = result.stderr.decode().splitlines()
    assert f"{config} line {number}: " in line and problem in line
    with open(log, encoding="utf-8") as handle:
        assert f"{config} line {number}: " in json.loads(handle.read())["msg"]


def test_bad_request_aborts_create_and_never_runs_the_runtime(setup: Setup) -> None:
    config = setup.write_config(runtimes=[setup.fake], root=setup.node)
    bundle = setup.make_bundle(env=[f"{naming.VISIBLE_DEVICES_ENV}=9"])
    with open(os.path.join(bundle, "config.json"), "rb") as handle:
        before = handle.read()
    for log_format in ("json", "text"):
        log = os.path.join(setup.tmp, f"log.{log_format}")
        args = ["--log", log, "--log-format", log_format, "create", "--bundle", bundle, "c9"]
        result = setup.run(args, config)
        assert result.returncode == 1
        assert result.stdout == b""
        assert recorded(setup.record) is None
        message = result.stderr.decode()
        assert "create c9 aborted while resolving the requested GCUs" in message
        assert "asks for '9', which is not on this node; cards on this node: 0 (" in message
        assert "runc was not run" in message
        with open(log, encoding="utf-8") as handle:
            line = handle.read().strip()
        if log_format == "json":
            assert json.loads(line)["msg"].endswith(message.strip().split(": ", 1)[1])
        else:
            assert line.startswith("time=") and " level=error msg=" in line
    with open(os.path.join(bundle, "config.json"), "rb") as handle:
        assert handle.read() == before


def test_unwritable_log_file_warns_once_and_container_still_starts(setup: Setup) -> None:
    blocker = os.path.join(setup.tmp, "a-file")
    open(blocker, "w").close()  # an empty file in the way of the log's directory
    config = setup.write_config(
        runtimes=[setup.fake], root=setup.node, log_file=f"{blocker}/x/rt.log"
    )
    bundle = setup.make_bundle(env=[f"{naming.VISIBLE_DEVICES_ENV}=0"])
    args = ["create", "--bundle", bundle, "c0"]
    result = setup.run(args, config)
    assert result.returncode == 7
    assert result.stderr.decode().count("warning: cannot write log file") == 1
    assert recorded(setup.record) == [setup.fake, *args]


def test_log_file_records_what_was_done(setup: Setup) -> None:
    log = os.path.join(setup.tmp, "logs", "rt.log")
    config = setup.write_config(runtimes=[setup.fake], root=setup.node, log_file=log)
    bundle = setup.make_bundle(env=[f"{naming.VISIBLE_DEVICES_ENV}=0,1"])
    result = setup.run(["create", "-b", bundle, "cx"], config)
    assert result.returncode == 7, result.stderr
    assert result.stderr == b""
    with open(log, encoding="utf-8") as handle:
        text = handle.read()
    assert "INFO create cx" in text
    assert "gave gcu0, gcu1" in text


def test_pass_through_path_imports_only_light_stdlib_modules() -> None:
    # What the wrapper loads before it execs runc, in a fresh `python -IS` like the launcher.
    code = (
        f"import sys; sys.path.insert(0, {launcher.default_package_dir()!r});"
        "from enflame_gcu.shim import config, invocation, main;"
        "inv = invocation.parse_argv(['x', '--root', '/r', 'state', 'c']);"
        "main.find_low_level_runtime(config.load().runtimes + ('sh',), 'x');"
        "print(' '.join(sorted(sys.modules)))"
    )
    env = dict(os.environ, ENFLAME_CONTAINER_RUNTIME_CONFIG="/dev/null")
    result = subprocess.run(
        [sys.executable, "-IS", "-c", code], capture_output=True, env=env, check=True
    )
    loaded = set(result.stdout.decode().split())
    ours = {name for name in loaded if name.startswith("enflame_gcu")}
    assert ours == {
        "enflame_gcu",
        "enflame_gcu.shim",
        "enflame_gcu.shim.main",
        "enflame_gcu.shim.invocation",
        "enflame_gcu.shim.config",
        "enflame_gcu.shim.toml_subset",
        "enflame_gcu.errors",
    }
    heavy = {"json", "re", "typing", "dataclasses", "logging", "tomllib", "shutil", "yaml", "grpc"}
    assert not loaded & heavy
