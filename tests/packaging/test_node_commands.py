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
import shutil
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
    # The image's build context, as its COPY lines put it in /src (a copy: a build in the
    # tree itself writes build/ there, which another test's source-tree install may be using).
    context = os.path.join(str(tmp_path), "src")
    copies = re.findall(r"^COPY (.+) (\S+)$", text, re.MULTILINE)
    assert copies, "Dockerfile.toolkit no longer copies the sources in"
    for sources, target in copies:
        for name in sources.split():
            source, dest = os.path.join(PROJECT_ROOT, name), os.path.join(context, target)
            if os.path.isdir(source):
                ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
                shutil.copytree(source, dest, ignore=ignore)
            else:
                os.makedirs(dest, exist_ok=True)
                shutil.copy(source, dest)
    # The image's install step, as written: pip install of the build context, its options kept.
    match = re.search(r'"\$VIRTUAL_ENV/bin/pip" install ([^\n\\&]+)', text)
    assert match, "Dockerfile.toolkit no longer pip-installs the project"
    words = shlex.split(match[1])
    targets = [w for w in words if not w.startswith("-")]
    assert targets == ["."], words
    venv = os.path.join(str(tmp_path), "image-venv")
    # pip from here installs into the venv (its own pip would only add an ensurepip run).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    pip = [sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python")]
    done = subprocess.run(
        [*pip, "install", "-q", "--disable-pip-version-check", *words],
        cwd=context, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    node = os.path.join(str(tmp_path), "node")
    simulate.create(node, topofile.load("flat-4card"))
    ctk = os.path.join(venv, "bin", "enflame-ctk")
    assert node_commands.run_all([ctk], node, os.path.join(str(tmp_path), "out")) == []
