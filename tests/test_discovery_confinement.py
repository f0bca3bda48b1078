"""The device plugin and the DRA driver refuse a host root whose /sys or /dev leads out of it,
as ``cdi watch`` does (issue 40 item 2): discovery joins paths lexically, so through such a
link it would read this machine's own sysfs and serve whatever it found there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import MakeNode

PROGRAMS = {
    "enflame-device-plugin": ("enflame_gcu.device_plugin.main", ["--plugin-dir"]),
    "enflame-dra-plugin": (
        "enflame_gcu.dra_plugin.main",
        ["--node-name", "n1", "--kubeconfig", "/nonexistent", "--registry-dir"],
    ),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("escape", ["sys", "dev"])
def test_a_host_root_whose_discovery_paths_lead_out_is_refused_in_one_line(
    make_node: MakeNode, tmp_path: object, program: str, escape: str
) -> None:
    root = make_node("vendor-8card")
    # The node's tree moved outside the root and linked to by its path here: on the host
    # that path is not the node's, yet discovery would read (and serve) these cards.
    elsewhere = os.path.join(str(tmp_path), f"{escape}.elsewhere")
    os.rename(os.path.join(root, escape), elsewhere)
    os.symlink(elsewhere, os.path.join(root, escape))
    module, extra = PROGRAMS[program]
    sockets = os.path.join(str(tmp_path), "sockets")
    os.mkdir(sockets)
    try:
        done = subprocess.run(
            [sys.executable, "-m", module, "--host-root", root, *extra, sockets],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{program} ran on through /{escape} outside the host root")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{program}: /{escape}") and "outside the root" in lines[0]
    assert os.listdir(sockets) == []
