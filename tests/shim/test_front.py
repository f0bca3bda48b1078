"""The sh front: it execs runc itself only where the Python wrapper would have exec'd runc.

Every decision is checked against the Python path's own code (``invocation.parse_argv`` and
``main.may_request_devices``): over generated runc argument vectors and specs (the request
grammar's strategies from test_request_properties) the front either execs the low-level
runtime with the very argv the wrapper would have given it, or hands the unchanged call to
Python. Then the installed front and the wrapper alone are run side by side on the simulated
node and must answer alike, byte for byte; and the verdict the front relies on must follow
every change of the config.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enflame_gcu import naming
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import front, launcher
from enflame_gcu.shim import invocation as runtime_invocation
from enflame_gcu.shim import main as runtime_main
from tests.shim import launch
from tests.shim.conftest import MakeBundle, WriteConfig, make_spec, plugin_mount
from tests.shim.test_request_properties import requests

RECORDER = """#!/bin/sh
# Records who was started (the role in $RECORD_ROLE's place) and with which argv, then exits.
{{ printf '%s\\n' {role} "$0"; for arg; do printf '%s\\n' "$arg"; done; }} > "$FRONT_RECORD"
exit 7
"""
ENV = naming.VISIBLE_DEVICES_ENV


@dataclass(frozen=True)
class Rig:
    """A front whose "python" and "runc" only record how they were started."""

    base: str
    front: str
    runc: str
    python: str
    config: str
    env: dict[str, str]

    def call(self, args: list[str], cwd: str) -> tuple[str, list[str]]:
        """Run the front; (who was exec'd: "runc" or "python", the argv runc's args sit in)."""
        record = os.path.join(cwd, "record")
        if os.path.exists(record):
            os.unlink(record)
        env = dict(self.env, FRONT_RECORD=record)
        done = subprocess.run([self.front, *args], env=env, cwd=cwd, capture_output=True)
        assert done.returncode == 7, done.stderr  # one of the two recorders ran
        assert done.stdout == b"" and done.stderr == b""
        with open(record, encoding="utf-8", errors="surrogateescape") as handle:
            role, argv0, *rest = handle.read().split("\n")[:-1]
        if role == "python":
            assert argv0 == self.python
            assert rest[:2] == ["-IS", "-c"]
            return role, rest[3:]  # the front's path, then runc's argv as given
        return role, [argv0, *rest]


def _recorder(path: str, role: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(RECORDER.format(role=role))
    os.chmod(path, 0o755)  # noqa: S103 - an executable stand-in
    return path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    base = str(tmp_path_factory.mktemp("front"))
    bin_dir = os.path.join(base, "bin")
    os.mkdir(bin_dir)
    runc = _recorder(os.path.join(bin_dir, "runc"), "runc")
    python = _recorder(os.path.join(base, "python"), "python")
    verdict = launch.verdict_path(base)
    path = os.path.join(base, "enflame-container-runtime")
    launcher.write_launcher(path, python, verdict=verdict)
    config = os.path.join(base, "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write('runtimes = ["runc"]\n')
    # runc is found first; grep (the front's one external command) after it, as on a node.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", runtime_config.PATH_ENV: config}
    saved = os.environ.get(runtime_config.PATH_ENV)
    os.environ[runtime_config.PATH_ENV] = config
    try:  # what the wrapper leaves after its first call through this front
        front.update(verdict, runtime_config.load(config))
    finally:
        if saved is None:
            del os.environ[runtime_config.PATH_ENV]
        else:
            os.environ[runtime_config.PATH_ENV] = saved
    assert os.path.isfile(verdict)
    yield Rig(base, path, runc, python, config, env)


GLOBAL_FLAGS = [
    "--root", "/run/r", "--root=/run/r", "-root", "--log", "/b/log.json", "--log-format", "json",
    "--log-format=text", "--debug", "--systemd-cgroup", "--rootless", "true", "--criu",
    "--cgroup-manager", "--log-level", "-", "--", "---", "--=x", "-help", "--help", "-h", "-v",
    "--version", "--version=1", "-x",
]  # fmt: skip
COMMANDS = ["create", "run", "state", "start", "kill", "delete", "exec", "spec", "features",
            "", "Create", "create "]  # fmt: skip
CREATE_FLAGS = [
    "-b", "--bundle", "-bundle", "--pid-file", "--console-socket=/s", "--console-socket",
    "--preserve-fds", "--no-pivot", "-d", "--detach", "--help", "-h", "--", "-", "--b",
]  # fmt: skip
BUNDLES = ["B", "./B", "B/", "sub/../B", "missing", "", ".", "B//", "FIFO", "DIR", "LINK"]
VALUES = ["c1", "create", "/p.pid", "3", "KILL"]
SPEC_KINDS = st.sampled_from(
    ["request", "plain", "empty", "garbage", "marker in a label", "missing", "fifo", "dir"]
)
PROPERTY_SETTINGS = settings(
    max_examples=250,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@st.composite
def tokens(draw: st.DrawFn) -> str:
    """One runc argument: a flag, a command, a create flag, a bundle or a plain value."""
    kind = draw(st.sampled_from(["global", "command", "create", "bundle", "bundle=", "value"]))
    if kind == "bundle=":
        return draw(st.sampled_from(["--bundle=", "-b=", "-bundle="])) + draw(
            st.sampled_from(BUNDLES)
        )
    table = {"global": GLOBAL_FLAGS, "command": COMMANDS, "create": CREATE_FLAGS,
             "bundle": BUNDLES, "value": VALUES}  # fmt: skip
    return draw(st.sampled_from(table[kind]))


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    """runc argument vectors: mostly engine-like, with every odd shape mixed in."""
    start = draw(st.lists(st.sampled_from(GLOBAL_FLAGS[:13]), max_size=4))
    command = draw(st.sampled_from(COMMANDS))
    rest = draw(st.lists(tokens(), max_size=6))
    shuffled = draw(st.booleans())
    argv = [*start, command, *rest]
    return draw(st.permutations(argv)) if shuffled else argv


def _write_spec(path: str, kind: str, request_spec: dict[str, object]) -> None:
    if kind == "missing":
        return
    if kind == "fifo":
        os.mkfifo(path)
        return
    if kind == "dir":
        os.mkdir(path)
        return
    text = {
        "request": json.dumps(request_spec),
        "plain": json.dumps(make_spec(env=["ENFLAME_VISIBLE=0", "A=enflame"])),
        "empty": "",
        "garbage": '{"process": {"env": ["ENFLAME_VISIBLE_DEVICE',
        "marker in a label": json.dumps({"annotations": {"x": "see cdi.k8s.io/ docs"}}),
    }[kind]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _python_decision(argv: list[str], cwd: str) -> tuple[bool, runtime_invocation.Invocation]:
    """What the wrapper's own code decides: (must the wrapper run, the parsed call)."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        parsed = runtime_invocation.parse_argv(argv)
        needed = parsed.version or (
            parsed.edits_spec and runtime_main.may_request_devices(parsed.bundle or ".")
        )
    finally:
        os.chdir(here)
    return needed, parsed


_SURE_FAST_BLOCKERS = ("help", "h", "version", "v")


def _front_must_be_fast(args: list[str], parsed: runtime_invocation.Invocation) -> bool:
    """Shapes the front must decide alone (else it would be no faster than Python)."""
    names = {arg.lstrip("-").partition("=")[0] for arg in args if arg.startswith("-")}
    spec = os.path.join(parsed.bundle or ".", "config.json")
    return (
        parsed.command is not None
        and not names & set(_SURE_FAST_BLOCKERS)
        and not any(".." in arg for arg in args)
        and (not parsed.edits_spec or os.path.isfile(spec))
    )


@PROPERTY_SETTINGS
@given(args=argvs(), kinds=st.tuples(SPEC_KINDS, SPEC_KINDS), data=st.data())
def test_front_execs_runc_only_where_the_wrapper_would_and_with_the_same_argv(
    rig: Rig,
    tmp_path_factory: pytest.TempPathFactory,
    args: list[str],
    kinds: tuple[str, str],
    data: st.DataObject,
) -> None:
    kind, cwd_kind = kinds  # config.json in the bundle B and in the current directory
    cwd = str(tmp_path_factory.mktemp("call"))
    spec = data.draw(requests({})).spec
    os.mkdir(os.path.join(cwd, "B"))
    os.mkdir(os.path.join(cwd, "sub"))
    os.mkdir(os.path.join(cwd, "DIR"))
    os.mkdir(os.path.join(cwd, "DIR", "config.json"))
    os.mkdir(os.path.join(cwd, "FIFO"))
    os.mkfifo(os.path.join(cwd, "FIFO", "config.json"))
    os.symlink("B", os.path.join(cwd, "LINK"))
    _write_spec(os.path.join(cwd, "B", "config.json"), kind, spec)
    _write_spec(os.path.join(cwd, "config.json"), cwd_kind, spec)
    needed, parsed = _python_decision([rig.front, *args], cwd)
    role, argv = rig.call(args, cwd)
    if role == "runc":
        assert not needed, f"the front ran runc for a call the wrapper must see: {args}"
        assert argv == [rig.runc, *args]
    else:
        assert argv == [rig.front, *args]  # handed over unchanged
        assert needed or not _front_must_be_fast(args, parsed), (
            f"the front asked Python about a call it should decide alone: {args}"
        )


FAST_SHAPES = {
    # SPEC §5: what the engines send, for every container.
    "containerd create": ["--root", "/run/containerd/runc/k8s.io", "--log", "B/log.json",
                          "--log-format", "json", "create", "--bundle", "B", "--pid-file",
                          "B/init.pid", "c1"],
    "podman create": ["create", "--bundle", "B", "--pid-file", "/p", "c1"],
    "-b": ["create", "-b", "B", "c1"],
    "--bundle=": ["--systemd-cgroup", "create", "--bundle=B", "c1"],
    "run": ["run", "-d", "--bundle", "B", "c1"],
    "start": ["--root", "/r", "start", "c1"],
    "state": ["--root", "/r", "--log", "/l", "--log-format", "json", "state", "c1"],
    "kill": ["kill", "c1", "KILL"],
    "delete": ["delete", "--force", "c1"],
    "container named create": ["start", "create"],
    "features": ["features"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(FAST_SHAPES))
@pytest.mark.parametrize(
    "request_env",
    [None, f"{ENV}=0", f"{ENV}=void", "enflame-container-devices"],
    ids=["no request", "env", "env void", "mount name"],
)
def test_engine_shapes_reach_runc_directly_unless_the_spec_names_a_gcu(
    rig: Rig, tmp_path: os.PathLike[str], name: str, request_env: str | None
) -> None:
    cwd = str(tmp_path)
    os.mkdir(os.path.join(cwd, "B"))
    spec = make_spec(env=[request_env] if request_env else [])
    with open(os.path.join(cwd, "B", "config.json"), "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    args = FAST_SHAPES[name]
    role, argv = rig.call(args, cwd)
    creates = runtime_invocation.parse_argv([rig.front, *args]).edits_spec
    expected = "python" if creates and request_env else "runc"
    assert role == expected, (name, request_env)
    assert argv == ([rig.runc, *args] if role == "runc" else [rig.front, *args])


@pytest.mark.parametrize(
    "marker", [m.decode() for m in runtime_main.REQUEST_MARKERS], ids=lambda m: m.strip("/")
)
def test_every_request_marker_sends_create_to_python(
    rig: Rig, tmp_path: os.PathLike[str], marker: str
) -> None:
    cwd = str(tmp_path)
    with open(os.path.join(cwd, "config.json"), "w", encoding="utf-8") as handle:
        handle.write('{"a": "x' + marker + 'y"}')  # no bundle flag: the current directory
    assert rig.call(["create", "c1"], cwd)[0] == "python"
    assert rig.call(["--debug", "run", "c1"], cwd)[0] == "python"
    with open(os.path.join(cwd, "config.json"), "w", encoding="utf-8") as handle:
        handle.write('{"a": "x' + marker[:-1] + 'y"}')  # one byte short
    assert rig.call(["create", "c1"], cwd)[0] == "runc"


def test_front_never_execs_itself_found_on_path_as_runc(
    rig: Rig, tmp_path: os.PathLike[str]
) -> None:
    bin_dir = os.path.join(str(tmp_path), "bin")
    os.mkdir(bin_dir)
    os.symlink(rig.front, os.path.join(bin_dir, "runc"))
    env = dict(rig.env, PATH=f"{bin_dir}:{rig.env['PATH']}")
    rigged = Rig(rig.base, rig.front, rig.runc, rig.python, rig.config, env)
    assert rigged.call(["state", "c1"], str(tmp_path))[0] == "python"


def test_runc_gets_the_engines_environment(rig: Rig, tmp_path: os.PathLike[str]) -> None:
    probe = os.path.join(str(tmp_path), "bin")
    os.mkdir(probe)
    runc = os.path.join(probe, "runc")
    with open(runc, "w", encoding="utf-8") as handle:
        handle.write('#!/bin/sh\n/usr/bin/env > "$FRONT_RECORD.env"\nexit 7\n')
    os.chmod(runc, 0o755)  # noqa: S103
    record = os.path.join(str(tmp_path), "record")
    env = dict(rig.env, PATH=probe, FRONT_RECORD=record, PWD=str(tmp_path), name="x", cfg="y")
    done = subprocess.run([rig.front, "state", "c1"], env=env, cwd=str(tmp_path), check=False)
    assert done.returncode == 7
    with open(record + ".env", encoding="utf-8") as handle:
        seen = dict(line.split("=", 1) for line in handle.read().splitlines())
    seen.pop("_", None)  # the probe's own shell sets it
    assert seen == env  # no variable of the front's leaks, none is changed


# The installed front and the wrapper alone, side by side on the simulated node.


@dataclass(frozen=True)
class Pair:
    tmp: str
    front: str
    alone: str
    fake: str
    node: str


ALONE = """#!{python} -IS
import sys
sys.path.insert(0, {package!r})
from enflame_gcu.shim.main import main
sys.exit(main())
"""


@pytest.fixture
def pair(tmp_path: os.PathLike[str], vendor_node: str) -> Pair:
    tmp = str(tmp_path)
    front_path = launch.write_launcher(tmp)
    alone = os.path.join(tmp, "alone", "enflame-container-runtime")
    os.mkdir(os.path.dirname(alone))
    with open(alone, "w", encoding="utf-8") as handle:
        handle.write(ALONE.format(python=sys.executable, package=launcher.default_package_dir()))
    os.chmod(alone, 0o755)  # noqa: S103
    fake = os.path.join(tmp, "fake-runc")
    with open(fake, "w", encoding="utf-8") as handle:
        handle.write('#!/bin/sh\nprintf "%s\\n" "$0" "$@" >> "$FAKE_RUNC_RECORD"\nexit 7\n')
    os.chmod(fake, 0o755)  # noqa: S103
    return Pair(tmp, front_path, alone, fake, vendor_node)


SIDE_BY_SIDE: dict[str, dict[str, Any]] = {
    "no request": {},
    "env one card": {"env": [f"{ENV}=0"]},
    "env all": {"env": [f"{ENV}=all"]},
    "env none": {"env": [f"{ENV}=none"]},
    "env void": {"env": [f"{ENV}=void"]},
    "env unknown card": {"env": [f"{ENV}=9"]},
    "env garbage": {"env": [f"{ENV}=0,x\n1"]},
    "plugin mounts": {"mounts": [plugin_mount("gcu1"), plugin_mount("gcu2")]},
    "cdi annotation": {"annotations": {"cdi.k8s.io/c": "enflame.com/gcu=3"}},
    "other vendor's cdi": {"annotations": {"cdi.k8s.io/c": "vendor.example/gpu=0"}},
}


Outcome = tuple[int, bytes, bytes, list[str] | None, bytes]


def _outcome(path: str, args: list[str], config: str, record: str, bundle: str) -> Outcome:
    if os.path.exists(record):
        os.unlink(record)
    spec_path = os.path.join(bundle, "config.json")
    with open(spec_path, "rb") as handle:
        before = handle.read()
    done = launch.run(path, args, config, extra_env={"FAKE_RUNC_RECORD": record})
    with open(spec_path, "rb") as handle:
        after = handle.read()
    with open(spec_path, "wb") as handle:
        handle.write(before)  # the next run starts from the same spec
    ran = None
    if os.path.exists(record):
        with open(record, encoding="utf-8") as handle:
            ran = handle.read().splitlines()
    stderr = done.stderr.replace(path.encode(), b"<runtime>")
    return done.returncode, done.stdout, stderr, ran and ran[1:], after


@pytest.mark.parametrize("shape", list(SIDE_BY_SIDE))
def test_installed_front_answers_exactly_as_the_wrapper_alone(
    pair: Pair, write_config: WriteConfig, make_bundle: MakeBundle, shape: str
) -> None:
    log = os.path.join(pair.tmp, "runtime.log")
    config = write_config(runtimes=[pair.fake], root=pair.node, log_file=log)
    bundle = make_bundle(**SIDE_BY_SIDE[shape])
    record = os.path.join(pair.tmp, "record")
    for args in (
        ["--root", "/r", "--log", os.path.join(pair.tmp, "l.json"), "--log-format", "json",
         "create", "--bundle", bundle, "--pid-file", "/p", "c1"],
        ["create", "-b", bundle, "c2"],
        ["--root", "/r", "state", "c1"],
        ["delete", "--force", "c1"],
    ):  # fmt: skip
        alone = _outcome(pair.alone, args, config, record, bundle)
        # Twice through the front: first without a verdict (Python answers and leaves one),
        # then with it (the front answers alone wherever it can).
        for _ in range(2):
            assert _outcome(pair.front, args, config, record, bundle) == alone, args
    assert os.path.isfile(launch.verdict_path(pair.tmp))


def _log_lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [line.split(" ", 3)[3] for line in handle.read().splitlines()]  # no time, pid


def test_the_runtime_log_is_the_same_through_the_front(
    pair: Pair, write_config: WriteConfig, make_bundle: MakeBundle
) -> None:
    record = os.path.join(pair.tmp, "record")
    logs = []
    for path, name in ((pair.alone, "alone.log"), (pair.front, "front.log")):
        log = os.path.join(pair.tmp, name)
        config = write_config(runtimes=[pair.fake], root=pair.node, log_file=log)
        for shape in SIDE_BY_SIDE.values():
            bundle = make_bundle(**shape)
            for _ in range(2):
                _outcome(path, ["create", "-b", bundle, "c1"], config, record, bundle)
        # Each run has its own bundle directories (bundleN): the same lines otherwise.
        logs.append([re.sub(r"/bundle[0-9]+", "/bundle", line) for line in _log_lines(log)])
    assert logs[0] and logs[0] == logs[1]


# The verdict follows the config.


def _state(pair: Pair, config: str, record: str) -> tuple[int, bytes, list[str] | None]:
    if os.path.exists(record):
        os.unlink(record)
    done = launch.run(pair.front, ["state", "c1"], config, extra_env={"FAKE_RUNC_RECORD": record})
    ran = None
    if os.path.exists(record):
        with open(record, encoding="utf-8") as handle:
            ran = handle.read().splitlines()
    return done.returncode, done.stderr, ran


def test_an_edited_config_is_followed_at_once(pair: Pair, write_config: WriteConfig) -> None:
    config = write_config(runtimes=[pair.fake])
    record = os.path.join(pair.tmp, "record")
    assert _state(pair, config, record)[2] == [pair.fake, "state", "c1"]  # leaves a verdict
    assert _state(pair, config, record)[2] == [pair.fake, "state", "c1"]  # front alone
    other = os.path.join(pair.tmp, "other-runc")
    shutil.copy(pair.fake, other)
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"runtimes = [{json.dumps(other)}]\n")
    for _ in range(2):
        assert _state(pair, config, record)[2] == [other, "state", "c1"]


def test_a_config_broken_after_the_verdict_is_still_reported(
    pair: Pair, write_config: WriteConfig
) -> None:
    config = write_config(runtimes=[pair.fake])
    record = os.path.join(pair.tmp, "record")
    _state(pair, config, record)
    with open(config, "a", encoding="utf-8") as handle:
        handle.write("no-such-key = 1\n")
    for _ in range(2):  # said on every call, as the wrapper alone does
        _, stderr, ran = _state(pair, config, record)
        assert ran == [pair.fake, "state", "c1"]
        assert b"warning: " in stderr and b"no-such-key" in stderr


def test_a_verdict_the_front_did_not_write_is_ignored(
    pair: Pair, write_config: WriteConfig
) -> None:
    config = write_config(runtimes=[pair.fake])
    record = os.path.join(pair.tmp, "record")
    _state(pair, config, record)
    verdict = launch.verdict_path(pair.tmp)
    evil = os.path.join(pair.tmp, "evil")
    shutil.copy(pair.fake, evil)
    identity = os.stat(config)
    mtime = identity.st_mtime_ns
    ids = (identity.st_dev, identity.st_ino, identity.st_size, mtime, identity.st_ctime_ns)
    forged = front.render(config, "present", (evil,), ids, front.stamp_path(verdict, mtime))
    assert forged is not None
    with open(verdict, "w", encoding="utf-8") as handle:
        handle.write(forged)
    os.utime(verdict, ns=(0, os.stat(config).st_mtime_ns + 10**9))
    if os.geteuid() == 0:  # someone else's file: never trusted
        os.chown(verdict, 65534, 65534)
        assert _state(pair, config, record)[2] == [pair.fake, "state", "c1"]
    os.unlink(verdict)
    os.symlink(os.path.join(pair.tmp, "elsewhere"), verdict)  # a link: never followed
    with open(os.path.join(pair.tmp, "elsewhere"), "w", encoding="utf-8") as handle:
        handle.write(forged)
    assert _state(pair, config, record)[2] == [pair.fake, "state", "c1"]


def test_no_verdict_is_left_for_a_config_the_front_cannot_follow(
    tmp_path: os.PathLike[str],
) -> None:
    tmp = str(tmp_path)
    ids, stamp = (1, 2, 3, 4, 5), "/run/v.m4"
    assert front.render("relative/config.toml", "present", ("runc",), ids, stamp) is None
    assert front.render("/etc/c.toml", "present", ("run\nc",), ids, stamp) is None
    assert front.render("/etc/c.toml", "present", ("",), ids, stamp) is None
    assert front.render("/etc/c.toml", "present", ("runc",)) is None  # no identity: no verdict
    os.symlink(tmp, os.path.join(tmp, "link"))
    link = os.path.join(tmp, "link", "c.toml")
    assert front.render(link, "present", ("runc",), ids, stamp) is None
    text = front.render(os.path.join(tmp, "c.toml"), "present", ("runc", "/x"), ids, stamp)
    assert text is not None
    # What the front sources: the same six values, read back by sh itself.
    shown = subprocess.run(
        ["/bin/sh", "-c", '. /dev/stdin; printf "%s|" "$_efr_format" "$_efr_path" "$_efr_state" '
         '"$_efr_names" "$_efr_identity" "$_efr_stamp"'],
        input=text.encode(), capture_output=True, check=True,
    )  # fmt: skip
    expected = f"{front.FORMAT}|{tmp}/c.toml|present|runc\n/x\n|1 2 3 4 5|/run/v.m4|"
    assert shown.stdout.decode() == expected


def test_no_verdict_for_a_config_that_is_not_a_regular_file(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    verdict = os.path.join(str(tmp_path), "v", "verdict")
    # An empty config the front cannot vouch for (it only trusts regular files).
    monkeypatch.setenv(runtime_config.PATH_ENV, os.devnull)
    front.update(verdict, runtime_config.load())
    assert not os.path.exists(os.path.dirname(verdict))  # no verdict, not even its directory


def test_doctor_can_name_the_python_a_front_starts() -> None:
    text = launcher.render("/opt/python/bin/python3", "/pkg")
    assert launcher.front_python(text) == "/opt/python/bin/python3"
    assert launcher.front_python("#!/usr/bin/python3 -IS\nimport sys\n") is None


# The verdict is sourced: one read, values that stay values, nothing else ever sourced.

HOSTILE_NAMES = ["/opt/it's/runc", "/opt/$(touch PWNED)/runc", "/opt/`id`/run c", "/o/\\;&|>x"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_runtime_name_with_shell_characters_is_only_a_name(
    pair: Pair, write_config: WriteConfig, name: str
) -> None:
    runtime = os.path.join(pair.tmp, "rt") + name
    os.makedirs(os.path.dirname(runtime), exist_ok=True)
    shutil.copy(pair.fake, runtime)
    config = write_config(runtimes=[runtime])
    record = os.path.join(pair.tmp, "record")
    for _ in range(2):  # the wrapper leaves the verdict, then the front uses it alone
        assert _state(pair, config, record)[2] == [runtime, "state", "c1"]
    assert not os.path.exists(os.path.join(pair.tmp, "PWNED"))
    assert not os.path.exists("PWNED")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_the_front_reads_its_verdict_in_one_go(pair: Pair, write_config: WriteConfig) -> None:
    # dash's `read` takes one system call per byte (~100 for a verdict, on every runc call);
    # the sourced verdict is read in blocks. Counted with strace until the front execs runc.
    config = write_config(runtimes=[pair.fake])
    record = os.path.join(pair.tmp, "record")
    _state(pair, config, record)  # the wrapper leaves the verdict
    trace = os.path.join(pair.tmp, "trace")
    env = dict(os.environ, **{runtime_config.PATH_ENV: config}, FAKE_RUNC_RECORD=record)
    subprocess.run(
        ["strace", "-e", "trace=read,execve", "-o", trace, pair.front, "state", "c1"],
        env=env,
        capture_output=True,
        check=False,
    )
    with open(trace, encoding="utf-8") as handle:
        calls = handle.read().split(f'execve("{pair.fake}"')[0]
    assert f'execve("{pair.front}"' in calls  # the front ran, then exec'd runc itself
    assert re.findall(r"^read\(\d+, .*, 1\) += 1$", calls, re.MULTILINE) == []


# A config replaced by a file with an older mtime (issue 48 item 2): never the old verdict.

OLD = 1_600_000_000 * 10**9  # 2020-09-13: older than any verdict


def _other_runtime(pair: Pair) -> str:
    other = os.path.join(pair.tmp, "other-runc")
    shutil.copy(pair.fake, other)
    return other


def _older_file(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.utime(path, ns=(OLD, OLD))
    return path


@pytest.mark.parametrize("how", ["cp -p", "touch -d", "rsync -t", "touch -r of itself"])
def test_a_config_replaced_by_an_older_file_is_followed_at_once(
    pair: Pair, write_config: WriteConfig, how: str
) -> None:
    config = write_config(runtimes=[pair.fake])
    record = os.path.join(pair.tmp, "record")
    for _ in range(2):  # the wrapper leaves the verdict, then the front uses it alone
        assert _state(pair, config, record)[2] == [pair.fake, "state", "c1"]
    other = _other_runtime(pair)
    text = f"runtimes = [{json.dumps(other)}]\n"
    if how == "cp -p":  # in place: same inode, the source's older mtime
        source = _older_file(os.path.join(pair.tmp, "config.toml.new"), text)
        subprocess.run(["cp", "-p", source, config], check=True)
    elif how == "touch -d":  # edited in place, then dated back
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(text)
        subprocess.run(["touch", "-d", "2020-09-13 12:26:40", config], check=True)
    elif how == "rsync -t":  # a new file with the old mtime renamed into place (tar, dpkg)
        temp = _older_file(os.path.join(os.path.dirname(config), ".config.toml.x"), text)
        os.rename(temp, config)
    else:  # its mtime put back to the very second of the original (not the nanosecond)
        before = os.stat(config).st_mtime_ns
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.utime(config, ns=(before, before - before % 10**9))
    for _ in range(2):
        assert _state(pair, config, record)[2] == [other, "state", "c1"]


def test_a_verdict_names_the_config_s_whole_identity(pair: Pair, write_config: WriteConfig) -> None:
    config = write_config(runtimes=[pair.fake])
    _state(pair, config, os.path.join(pair.tmp, "record"))
    verdict = launch.verdict_path(pair.tmp)
    info = os.stat(config)
    shown = subprocess.run(
        ["/bin/sh", "-c", f'. {verdict}; printf "%s|%s" "$_efr_identity" "$_efr_stamp"'],
        capture_output=True, check=True, text=True,
    )  # fmt: skip
    ids = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    stamp = front.stamp_path(verdict, info.st_mtime_ns)
    assert shown.stdout == " ".join(map(str, ids)) + "|" + stamp
    assert os.stat(stamp).st_mtime_ns == info.st_mtime_ns
    assert [n for n in os.listdir(os.path.dirname(verdict)) if ".m" in n] == [
        os.path.basename(stamp)
    ]
