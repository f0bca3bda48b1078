"""``enflame-ctk system``: /dev/char links (runc #3671) and the minimal-start launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enflame_gcu.container_toolkit import cli, dev_char
from enflame_gcu.shim import launcher


def links(root: str) -> dict[str, str]:
    directory = os.path.join(root, "dev", "char")
    return {name: os.readlink(os.path.join(directory, name)) for name in os.listdir(directory)}


def test_creates_a_link_per_gcu_node(vendor_node: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["system", "create-dev-char-symlinks", "--host-root", vendor_node]) == 0
    expected = {f"238:{n}": f"../gcu{n}" for n in range(8)} | {"238:255": "../gcuctl"}
    assert links(vendor_node) == expected
    captured = capsys.readouterr()
    assert captured.out == ""  # a real run reports on stderr, each line with the prefix
    assert captured.err.count(": created\n") == 9
    assert all(line.startswith("enflame-ctk: /dev/char/") for line in captured.err.splitlines())
    # The links resolve to the device nodes themselves.
    target = os.path.realpath(os.path.join(vendor_node, "dev", "char", "238:3"))
    assert target == os.path.join(os.path.realpath(vendor_node), "dev", "gcu3")


def test_is_idempotent_and_repairs_wrong_links(
    vendor_node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dev_char.create_links(vendor_node)
    wrong = os.path.join(vendor_node, "dev", "char", "238:1")
    os.unlink(wrong)
    os.symlink("../gcu7", wrong)
    actions = {a.link: a.action for a in dev_char.create_links(vendor_node)}
    assert actions["/dev/char/238:1"] == "replaced"
    assert actions["/dev/char/238:0"] == "unchanged"
    assert links(vendor_node)["238:1"] == "../gcu1"
    second = dev_char.create_links(vendor_node)
    assert {a.action for a in second} == {"unchanged"}
    assert not [n for n in os.listdir(os.path.join(vendor_node, "dev", "char")) if "tmp" in n]


def test_dry_run_changes_nothing(vendor_node: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["system", "create-dev-char-symlinks", "--host-root", vendor_node, "--dry-run"]
    assert cli.main(args) == 0
    assert "would be created" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(vendor_node, "dev", "char"))


def test_a_regular_file_in_the_way_is_reported_not_removed(vendor_node: str) -> None:
    os.makedirs(os.path.join(vendor_node, "dev", "char"))
    blocker = os.path.join(vendor_node, "dev", "char", "238:2")
    with open(blocker, "w", encoding="utf-8") as handle:
        handle.write("keep me")
    assert cli.main(["system", "create-dev-char-symlinks", "--host-root", vendor_node]) == 1
    with open(blocker, encoding="utf-8") as handle:
        assert handle.read() == "keep me"


def test_regular_file_nodes_are_not_linked(make_node: object) -> None:
    root = make_node("vendor-8card", char_devices=False)  # type: ignore[operator]
    assert dev_char.create_links(root) == []


def test_launcher_starts_minimally_and_runs_the_runtime(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "enflame-container-runtime")
    assert cli.main(["system", "install-runtime-launcher", "--output", path]) == 0
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    assert text.startswith("#!/bin/sh\n")  # the sh front, which runs python -IS when needed
    assert f"exec {sys.executable} -IS -c " in text
    assert f"sys.path.insert(0, {json.dumps(launcher.default_package_dir())})" in text
    assert os.stat(path).st_mode & 0o777 == 0o755
    # No runtime can be found with an empty PATH: the launcher ran our main and said so.
    env = {"PATH": str(tmp_path), "ENFLAME_CONTAINER_RUNTIME_CONFIG": "/dev/null"}
    result = subprocess.run([path, "state", "x"], capture_output=True, env=env, check=False)
    assert result.returncode == 1
    assert b"no low-level runtime found" in result.stderr
    assert result.stdout == b""


def test_launcher_rejects_a_relative_interpreter() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        launcher.render("python3", "/x")
