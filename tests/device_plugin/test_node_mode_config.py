"""``--node-mode``: the plugin answers as the node's mode needs; explicit flags still win."""

from __future__ import annotations

import os

import pytest

from enflame_gcu import node_modes
from enflame_gcu.device_plugin import main
from enflame_gcu.errors import ConfigError


def _record(root: str, mode: str) -> None:
    path = node_modes.local_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(node_modes.Record(mode, "containerd", "1.7", "auto", "test").to_json())


@pytest.mark.parametrize("mode", node_modes.NAMES)
def test_auto_follows_the_recorded_mode(tmp_path: os.PathLike[str], mode: str) -> None:
    _record(str(tmp_path), mode)
    config = main.load_config(["--node-mode=auto", f"--host-root={tmp_path}"], {})
    row = node_modes.MODES[mode]
    assert config.node_mode == mode
    assert config.pass_device_specs is row.pass_device_specs
    assert config.device_list_strategy == row.strategies
    assert node_modes.MODE_FILE in config.node_mode_source


def test_auto_without_a_record_is_device_specs(tmp_path: os.PathLike[str]) -> None:
    config = main.load_config(["--node-mode", "auto", "--host-root", str(tmp_path)], {})
    assert config.node_mode == "device-specs"
    assert config.pass_device_specs is True
    assert "no /etc/enflame-gcu/node-mode.json" in config.node_mode_source


def test_without_a_node_mode_the_flags_alone_decide() -> None:
    config = main.load_config([], {})
    assert config.node_mode == "" and config.pass_device_specs is False
    assert config.device_list_strategy == ("envvar",)


def test_explicit_flags_and_env_win_over_the_mode() -> None:
    config = main.load_config(
        ["--node-mode=cdi", "--no-pass-device-specs"], {"DEVICE_LIST_STRATEGY": "cdi-cri"}
    )
    assert config.pass_device_specs is False
    assert config.device_list_strategy == ("cdi-cri",)
    config = main.load_config([], {"DP_NODE_MODE": "device-specs"})
    assert config.pass_device_specs is True


def test_a_broken_record_stops_the_plugin_with_the_file_named(tmp_path: os.PathLike[str]) -> None:
    path = node_modes.local_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"version": "v1", "mode": "magic"}')
    with pytest.raises(ConfigError, match=r"node-mode\.json: unknown mode 'magic'"):
        main.load_config(["--node-mode=auto", f"--host-root={tmp_path}"], {})


def test_an_unknown_node_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not one of"):
        main.load_config(["--node-mode=strict"], {})
