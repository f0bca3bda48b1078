"""docker daemon.json: merge, keep keys and order, refuse malformed input, create when missing."""

from __future__ import annotations

import json
import os

import pytest

from enflame_gcu.container_toolkit import engines
from enflame_gcu.errors import EngineConfigError
from tests.container_toolkit.engines.conftest import InstallGolden
from tests.container_toolkit.engines.helpers import check_golden, golden_text, listing, read

RUNTIME = {"path": "/usr/bin/enflame-container-runtime", "runtimeArgs": []}


def test_existing_keys_and_order_are_kept(install_golden: InstallGolden) -> None:
    path = install_golden("docker-existing.json", "etc/docker/daemon.json")
    options = engines.RuntimeOptions(set_as_default=True, cdi=True)
    change = engines.configure("docker", path, options)
    text = read(path)
    check_golden("docker-existing.configured.json", text)
    config = json.loads(text)
    original = json.loads(golden_text("docker-existing.json"))
    assert list(config) == [*original, "default-runtime"]
    assert config["runtimes"] == {"kata": {"path": "/usr/bin/kata-runtime"}, "enflame": RUNTIME}
    assert config["features"] == {"buildkit": True, "cdi": True}
    assert config["default-runtime"] == "enflame"
    assert config["registry-mirrors"] == ["https://mirror.example.cn"]
    assert change.files[0].action == "modified"
    backup = change.files[0].backup
    assert backup is not None
    assert read(backup) == golden_text("docker-existing.json")


def test_runtime_only_leaves_default_and_features_alone(install_golden: InstallGolden) -> None:
    path = install_golden("docker-existing.json", "daemon.json")
    change = engines.configure("docker", path)
    config = json.loads(read(path))
    assert "default-runtime" not in config
    assert config["features"] == {"buildkit": True}
    assert change.paths and all(p.startswith("runtimes.enflame") for p in change.paths)


def test_tab_indentation_is_kept_and_default_replaced(install_golden: InstallGolden) -> None:
    path = install_golden("docker-tabs.json", "daemon.json")
    engines.configure("docker", path, engines.RuntimeOptions(set_as_default=True))
    check_golden("docker-tabs.configured.json", read(path))
    assert read(path).startswith('{\n\t"debug": true,\n\t"default-runtime": "enflame",')


def test_malformed_json_is_refused_and_untouched(install_golden: InstallGolden) -> None:
    path = install_golden("docker-malformed.json", "docker/daemon.json")
    before = listing(os.path.dirname(path))
    with pytest.raises(EngineConfigError) as caught:
        engines.configure("docker", path, engines.RuntimeOptions(set_as_default=True))
    message = str(caught.value)
    assert path in message
    assert "not valid JSON" in message
    assert "line 3, column 16" in message
    assert read(path) == golden_text("docker-malformed.json")
    assert listing(os.path.dirname(path)) == before  # no backup, state or lock left


def test_top_level_array_is_refused(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("[]\n")
    with pytest.raises(EngineConfigError, match="top level is a list"):
        engines.configure("docker", path)
    assert read(path) == "[]\n"


def test_runtimes_that_is_not_an_object_is_refused(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"runtimes": ["runc"]}\n')
    with pytest.raises(EngineConfigError, match="runtimes is a list, expected a table"):
        engines.configure("docker", path)
    assert read(path) == '{"runtimes": ["runc"]}\n'


def test_missing_file_and_directory_are_created_then_removed(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "etc", "docker", "daemon.json")
    change = engines.configure("docker", path, engines.RuntimeOptions(set_as_default=True))
    assert change.files[0].action == "created"
    assert change.files[0].backup is None
    check_golden("docker-created.json", read(path))
    assert json.loads(read(path)) == {
        "runtimes": {"enflame": RUNTIME},
        "default-runtime": "enflame",
    }
    undo = engines.unconfigure("docker", path)
    assert undo.files[0].action == "deleted"
    assert listing(str(tmp_path)) == ["etc", "etc/docker"]


def test_existing_runtime_args_of_ours_are_kept(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    mine = {"runtimes": {"enflame": {"path": "/opt/old", "runtimeArgs": ["--debug"]}}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(mine, handle)
    engines.configure("docker", path)
    assert json.loads(read(path))["runtimes"]["enflame"] == {
        "path": "/usr/bin/enflame-container-runtime",
        "runtimeArgs": ["--debug"],
    }
    engines.unconfigure("docker", path)
    assert json.loads(read(path)) == mine


def test_drop_in_is_refused_for_docker(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "daemon.json")
    with pytest.raises(EngineConfigError, match="docker has no drop-in directory"):
        engines.configure("docker", path, engines.RuntimeOptions(drop_in=True))
    assert listing(str(tmp_path)) == []
