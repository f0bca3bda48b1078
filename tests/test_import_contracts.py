"""The import-linter contracts have teeth: each planted violation breaks the contract meant for it.

Every case copies the package and ``pyproject.toml`` into a temporary directory, plants one
import a newcomer could write, and runs ``lint-imports`` on the copy with only the contract that
must catch it. The unplanted copy keeps every contract, so the harness can pass as well as fail.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import tomlkit

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "enflame_gcu"
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")

# (case, contract id, file under src/enflame_gcu, line appended to it)
PLANTS = [
    (
        "a new device_plugin module imports grpc",
        "grpc-edge",
        "device_plugin/planted.py",
        "import grpc",
    ),
    (
        "the toolkit's CDI module imports grpc",
        "grpc-edge",
        "container_toolkit/cdi.py",
        "import grpc",
    ),
    (
        "the state module imports protobuf",
        "grpc-edge",
        "device_plugin/state.py",
        "import google.protobuf",
    ),
    (
        "a domain module imports the stubs",
        "grpc-edge",
        "edits.py",
        "from enflame_gcu._proto import api_pb2",
    ),
    (
        "a new top-level module imports the device plugin",
        "layers",
        "planted.py",
        "from enflame_gcu.device_plugin import config",
    ),
    (
        "a domain module imports the device plugin",
        "layers",
        "devices.py",
        "from enflame_gcu.device_plugin import config",
    ),
    ("a domain module imports the shim", "layers", "edits.py", "from enflame_gcu.shim import oci"),
    (
        "a domain module imports presentation",
        "layers",
        "resourceslices.py",
        "from enflame_gcu.presentation import labels",
    ),
    (
        "the shim imports the toolkit CLI",
        "layers",
        "shim/create.py",
        "from enflame_gcu.container_toolkit import cdi",
    ),
    (
        "a low-level helper imports the domain",
        "layers",
        "fileio.py",
        "from enflame_gcu import devices",
    ),
    (
        "a toolkit command imports the device plugin",
        "programs-independent",
        "container_toolkit/commands/info.py",
        "from enflame_gcu.device_plugin import state",
    ),
    (
        "the device plugin imports the DRA driver",
        "programs-independent",
        "device_plugin/state.py",
        "from enflame_gcu.dra_plugin import claims",
    ),
    ("the shim imports a third-party package", "shim-stdlib", "shim/oci.py", "import yaml"),
    (
        "the shim reaches a third-party package through the domain",
        "shim-stdlib",
        "naming.py",
        "import tomlkit",
    ),
    (
        "the shim reaches inotify through health",
        "shim-stdlib",
        "shim/modifiers.py",
        "from enflame_gcu import health",
    ),
    (
        "two shim modules import each other",
        "acyclic",
        "shim/oci.py",
        "from enflame_gcu.shim import create",
    ),
    (
        "two toolkit packages import each other",
        "acyclic",
        "container_toolkit/engines/base.py",
        "from enflame_gcu.container_toolkit import doctor",
    ),
    (
        "the stand-ins import the demo",
        "simulation-layers",
        "simulation/testing/containers.py",
        "from enflame_gcu.simulation import demo",
    ),
    ("a new simulation module", "simulation-layers", "simulation/planted.py", "import os"),
]


def _contracts() -> list[dict[str, Any]]:
    config = tomlkit.parse((ROOT / "pyproject.toml").read_text("utf-8")).unwrap()
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _copy(tmp: pathlib.Path) -> pathlib.Path:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(PACKAGE, tmp / "src" / "enflame_gcu", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(tree: pathlib.Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    args = [str(LINT_IMPORTS), "--no-cache", "--no-logo"]
    for contract in contracts:
        args += ["--contract", contract]
    return subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_every_contract_is_targeted_by_a_planted_case() -> None:
    ids = [str(contract.get("id")) for contract in _contracts()]
    assert "None" not in ids, "every contract needs an id so that a planted case can target it"
    assert sorted(ids) == sorted({contract for _, contract, _, _ in PLANTS})


def test_the_shim_contract_forbids_every_runtime_dependency() -> None:
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text("utf-8")).unwrap()["project"]
    # Every runtime dependency: the base list and each extra but the developers' tools.
    specs = list(project["dependencies"])
    for extra, listed in project.get("optional-dependencies", {}).items():
        if extra != "dev":
            specs += listed
    names = {re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0] for spec in specs}
    wanted = {name.lower().replace("_", "-") for name in names}
    provided = importlib.metadata.packages_distributions()
    imports = {
        module
        for module, dists in provided.items()
        if not module.startswith("_") and wanted & {d.lower().replace("_", "-") for d in dists}
    }
    shim = next(c for c in _contracts() if c.get("id") == "shim-stdlib")
    assert imports == set(shim["forbidden_modules"])


def test_the_unplanted_copy_keeps_every_contract(tmp_path: pathlib.Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(_contracts())} kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("contract", "path", "line"), [case[1:] for case in PLANTS], ids=[case[0] for case in PLANTS]
)
def test_a_planted_violation_breaks_its_contract(
    tmp_path: pathlib.Path, contract: str, path: str, line: str
) -> None:
    tree = _copy(tmp_path)
    with (tree / "src" / "enflame_gcu" / path).open("a", encoding="utf-8") as handle:
        handle.write(f"\n{line}\n")
    result = _lint(tree, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 kept, 1 broken" in result.stdout, result.stdout
