"""runc argument parsing: global flags, the subcommand, bundle and id (SPEC §5 shapes)."""

from __future__ import annotations

import os

import pytest

from enflame_gcu.shim import invocation as runtime_invocation

ARGV0 = "/usr/bin/enflame-container-runtime"


def parse(*args: str) -> runtime_invocation.Invocation:
    return runtime_invocation.parse_argv([ARGV0, *args])


def test_containerd_shim_shape_finds_bundle_log_and_id() -> None:
    inv = parse(
        "--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json",
        "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "abc",
    )  # fmt: skip
    assert (inv.command, inv.bundle, inv.container_id) == ("create", "/b", "abc")
    assert (inv.log_file, inv.log_format) == ("/b/log.json", "json")
    assert inv.edits_spec


def test_podman_shape() -> None:
    inv = parse("create", "--bundle", "/b", "--pid-file", "/p", "ctr")
    assert (inv.command, inv.bundle, inv.container_id, inv.log_file) == (
        "create",
        "/b",
        "ctr",
        None,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("create", "-b", "/b", "c1"),
        ("create", "--bundle=/b", "c1"),
        ("create", "-bundle", "/b", "c1"),
        ("create", "-b=/b", "c1"),
        ("create", "c1", "--bundle", "/b"),
        ("--debug", "create", "--bundle", "/b", "c1"),
        ("--systemd-cgroup", "create", "--bundle", "/b", "c1"),
        ("--rootless", "true", "create", "--bundle", "/b", "c1"),
        ("--rootless=false", "--criu", "/usr/sbin/criu", "create", "-b", "/b", "c1"),
        ("-root", "/r", "create", "--no-pivot", "-b", "/b", "--console-socket", "/s", "c1"),
        ("run", "-d", "--bundle", "/b", "c1"),
    ],
)
def test_bundle_flag_shapes(args: tuple[str, ...]) -> None:
    inv = parse(*args)
    assert inv.bundle == "/b"
    assert inv.container_id == "c1"
    assert inv.edits_spec


def test_no_bundle_flag_means_current_directory(tmp_path: os.PathLike[str]) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        inv = parse("create", "c1")
    finally:
        os.chdir(cwd)
    assert inv.bundle == str(tmp_path)


def test_relative_bundle_is_made_absolute() -> None:
    assert parse("create", "-b", "rel/b", "c1").bundle == os.path.abspath("rel/b")


def test_value_of_pid_file_is_not_taken_for_the_id() -> None:
    inv = parse("create", "--pid-file", "create", "--bundle", "/b", "real-id")
    assert inv.container_id == "real-id"


@pytest.mark.parametrize(
    "args",
    [
        ("start", "create"),
        ("delete", "create"),
        ("delete", "--force", "create"),
        ("state", "create"),
        ("kill", "create", "KILL"),
        ("--root", "create", "state", "x"),  # a state root literally named "create"
        ("--log", "create", "delete", "x"),
        ("exec", "--process", "/p.json", "create"),
        ("create", "--help"),
        ("--help",),
        ("--version",),
        (),
    ],
)
def test_container_or_value_named_create_does_not_edit(args: tuple[str, ...]) -> None:
    assert not parse(*args).edits_spec


def test_container_named_create_being_created_does_edit() -> None:
    inv = parse("--root", "/r", "create", "--bundle", "/b", "create")
    assert inv.edits_spec
    assert inv.container_id == "create"


def test_pass_through_commands_are_recognised() -> None:
    inv = parse("--root", "/r", "--log", "/l", "--log-format", "json", "state", "abc")
    assert inv.command == "state"
    assert inv.bundle is None
    assert not inv.edits_spec
