"""Every documented node command works from every install path (issue 23 item 1).

The .deb, the .rpm's root and the offline bundle run :mod:`tests.packaging.node_commands` in
test_dist.py, install.sh in test_install_sh.py; the toolkit image's contents here: the image
is not built on this machine (no docker engine), so its Dockerfile's own install step is
replayed into a virtualenv and the commands run from there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from enflame_gcu.simulation import simulate, topofile
from tests.conftest import PROJECT_ROOT
from tests.packaging import node_commands

DOCKERFILE = os.path.join(PROJECT_ROOT, "deploy", "docker", "Dockerfile.toolkit")


def test_every_documented_node_command_is_run_or_excused() -> None:
    assert node_commands.check_coverage() == []
    assert "allocations" in node_commands.documented()  # the extraction finds the guide's


def test_the_dev_install_runs_every_documented_node_command(tmp_path: os.PathLike[str]) -> None:
    node = os.path.join(str(tmp_path), "node")
    simulate.create(node, topofile.load("flat-4card"))
    ctk = os.path.join(os.path.dirname(sys.executable), "enflame-ctk")
    assert node_commands.run_all([ctk], node, os.path.join(str(tmp_path), "out")) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_toolkit_images_contents_run_every_documented_node_command(
    tmp_path: os.PathLike[str],
) -> None:
    with open(DOCKERFILE, encoding="utf-8") as handle:
        text = handle.read()
    # The image's install step, as written: pip install of the source tree and its extras.
    match = re.search(r'"\$VIRTUAL_ENV/bin/pip" install ([^\n\\&]+)', text)
    assert match, "Dockerfile.toolkit no longer pip-installs the project"
    words = [w for w in shlex.split(match[1]) if not w.startswith("-")]
    assert len(words) == 1 and words[0].startswith("."), words
    spec = PROJECT_ROOT + words[0][1:]  # ".[extra]" from the build context (the repo root)
    venv = os.path.join(str(tmp_path), "image-venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, spec], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    node = os.path.join(str(tmp_path), "node")
    simulate.create(node, topofile.load("flat-4card"))
    ctk = os.path.join(venv, "bin", "enflame-ctk")
    assert node_commands.run_all([ctk], node, os.path.join(str(tmp_path), "out")) == []
