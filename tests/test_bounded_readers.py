"""Every file the product reads goes through one bounded reader: a regular file (a FIFO would
block the reader forever), a size cap, and a nesting cap (``'[' * 60000`` made the recursive
parsers raise RecursionError, which killed the plugin and failed every container create).
One test per reader class: the node's mode record and choice, JSON state files, the engines'
configs, YAML configs, CDI and OCI specs, and the runtime's own TOML subset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from enflame_gcu import claim_specs, fileio, node_modes
from enflame_gcu.container_toolkit import cdi, install_manifest
from enflame_gcu.container_toolkit.doctor import processes
from enflame_gcu.container_toolkit.engines import formats, storage
from enflame_gcu.device_plugin import config_file
from enflame_gcu.dra_plugin import checkpoint
from enflame_gcu.errors import ConfigError, EngineConfigError, InstallError, SpecError
from enflame_gcu.shim import config as runtime_config
from enflame_gcu.shim import main as shim_main
from enflame_gcu.shim import oci, prepared_edits

# A hang is the failure looked for: pytest-timeout ends it.
pytestmark = pytest.mark.timeout(60)

DEEP_JSON = "[" * 20000 + "]" * 20000
# The parser's own stack gives out first at the default recursion limit; where something raised
# the limit (hypothesis does, in the same test process) it parses and the depth check refuses.
DEEP_MESSAGE = r"too deeply|deeper than 64"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# PyYAML scans in pure Python, and under coverage every level costs (20000 levels took 30 s in
# make test): 600 levels are past both the cap and what the default recursion limit lets PyYAML
# reach (400-500 levels).
DEEP_YAML = "a: " + _nested(600) + "\n"


def test_parse_json_allows_the_cap_and_refuses_one_level_more() -> None:
    assert fileio.parse_json(_nested(fileio.MAX_DEPTH), "x") is not None
    with pytest.raises(fileio.NestingError, match="deeper than 64 levels"):
        fileio.parse_json(_nested(fileio.MAX_DEPTH + 1), "x")
    with pytest.raises(fileio.NestingError, match=DEEP_MESSAGE):
        fileio.parse_json(DEEP_JSON, "x")
    objects = '{"a":' * 70 + "1" + "}" * 70
    with pytest.raises(fileio.NestingError):
        fileio.parse_json(objects, "x")


def test_read_json_refuses_a_fifo_before_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")
    with pytest.raises(OSError, match="a FIFO"):
        fileio.read_json(str(tmp_path / "state.json"))


def _etc(root: Path) -> Path:
    etc = root / "etc" / "enflame-gcu"
    etc.mkdir(parents=True)
    return etc


def test_node_mode_record_that_is_a_fifo_or_deeply_nested_is_named(tmp_path: Path) -> None:
    os.mkfifo(_etc(tmp_path) / "node-mode.json")
    with pytest.raises(ValueError, match=r"cannot read /etc/enflame-gcu/node-mode.json.*FIFO"):
        node_modes.read(str(tmp_path))
    os.unlink(tmp_path / "etc/enflame-gcu/node-mode.json")
    (tmp_path / "etc/enflame-gcu/node-mode.json").write_text(DEEP_JSON)
    with pytest.raises(ValueError, match=DEEP_MESSAGE):
        node_modes.read(str(tmp_path))


def test_node_mode_choice_that_is_a_fifo_is_named(tmp_path: Path) -> None:
    os.mkfifo(_etc(tmp_path) / "mode")
    with pytest.raises(ValueError, match=r"cannot read /etc/enflame-gcu/mode.*FIFO"):
        node_modes.read_choice(str(tmp_path))


def test_json_state_files_refuse_deep_nesting_with_their_own_error(tmp_path: Path) -> None:
    """The DRA checkpoint, install manifest, engine state and per-claim CDI specs."""
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_JSON)
    with pytest.raises(ConfigError, match=r"checkpoint .* is damaged .*" + DEEP_MESSAGE):
        checkpoint.Checkpoint(str(deep)).load()
    toolkit = tmp_path / "root" / "opt" / "toolkit"
    toolkit.mkdir(parents=True)
    (toolkit / install_manifest.MANIFEST_NAME).write_text(DEEP_JSON)
    with pytest.raises(InstallError, match=DEEP_MESSAGE):
        install_manifest.InstallRun(str(tmp_path / "root"), "/opt/toolkit", dry_run=True)
    config = tmp_path / "config.toml"
    config.write_text("")
    Path(storage.state_path(str(config))).write_text(DEEP_JSON)
    with pytest.raises(EngineConfigError, match=DEEP_MESSAGE):
        storage.load_state(str(config))
    claims = tmp_path / "cdi"
    claims.mkdir()
    spec = claims / claim_specs.file_name("u1")
    spec.write_text(DEEP_JSON)
    spec.chmod(0o644)
    with pytest.raises(claim_specs.ClaimSpecError, match=DEEP_MESSAGE):
        claim_specs.visible_devices("u1-gcu", [str(claims)])


@pytest.mark.parametrize(
    ("name", "text"),
    [("json", DEEP_JSON), ("json", _nested(80)), ("toml", "a = " + _nested(80) + "\n")],
)
def test_engine_config_nested_too_deeply_is_an_engine_config_error(name: str, text: str) -> None:
    # tomlkit stops at 100 levels itself; between 64 and 100 only our cap stops it.
    with pytest.raises(EngineConfigError, match=r"(too deeply|deeper than 64).*left untouched"):
        formats.FORMATS[name].parse(text, "/etc/engine.conf")


def test_yaml_configs_refuse_deep_nesting(tmp_path: Path) -> None:
    """The plugin's config file, CDI specs in YAML, the kubelet config doctor reads."""
    with pytest.raises(ConfigError, match=DEEP_MESSAGE):
        config_file.parse(DEEP_YAML)
    spec = tmp_path / "spec.yaml"
    spec.write_text(DEEP_YAML)
    with pytest.raises(SpecError, match=DEEP_MESSAGE):
        cdi.load_file(str(spec))
    json_spec = tmp_path / "spec.json"
    json_spec.write_text(DEEP_JSON)
    with pytest.raises(SpecError, match=DEEP_MESSAGE):
        cdi.load_file(str(json_spec))


def test_doctor_reads_a_deep_kubelet_config_as_absent(tmp_path: Path) -> None:
    config = tmp_path / "var/lib/kubelet/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(DEEP_YAML)

    class _Node:
        processes: tuple[tuple[str, ...], ...] = ()

        def path(self, host_path: str) -> str:
            return fileio.resolve(str(tmp_path), host_path)

    assert processes.kubelet_setting(_Node(), "a", "--a") is None  # type: ignore[arg-type]


def test_runtime_config_refuses_deeply_nested_arrays(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("runtimes = " + DEEP_JSON + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 64"):
        runtime_config.load(str(config))
    os.environ[runtime_config.PATH_ENV] = str(config)
    try:
        loaded, problem = runtime_config.load_for_passthrough()
    finally:
        del os.environ[runtime_config.PATH_ENV]
    assert problem is not None and "nested deeper" in problem
    assert loaded.runtimes == runtime_config.RuntimeConfig().runtimes


@pytest.mark.parametrize(
    "make",
    [
        os.mkfifo,
        lambda path: Path(path).write_text('{"ENFLAME_VISIBLE_DEVICES":' + DEEP_JSON + "}"),
    ],
    ids=["fifo", "deep"],
)
def test_oci_spec_that_is_a_fifo_or_deep_is_a_spec_error(
    tmp_path: Path, make: Callable[[str], None]
) -> None:
    make(str(tmp_path / "config.json"))
    assert shim_main.may_request_devices(str(tmp_path)) is True  # returns; create names it
    with pytest.raises(SpecError, match=r"FIFO|too deeply|deeper than 64"):
        oci.load(str(tmp_path))


def test_damaged_prepared_edits_fall_back_to_discovery(tmp_path: Path) -> None:
    """Issue 22 item 10: a deep file made every create fail with RecursionError."""
    path = tmp_path / "prepared.json"
    path.write_text(DEEP_JSON)
    with pytest.raises(prepared_edits.Unavailable, match=DEEP_MESSAGE):
        prepared_edits.load(str(path), "/")
    path.write_text(json.dumps({"a": json.loads(_nested(100))}))
    with pytest.raises(prepared_edits.Unavailable, match="deeper than 64"):
        prepared_edits.load(str(path), "/")


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_the_plugin_names_a_bad_mode_record_at_start_instead_of_hanging(
    tmp_path: Path, kind: str
) -> None:
    """Before: a FIFO hung the plugin with no log line; '[' * 60000 killed it (RecursionError)."""
    record = _etc(tmp_path) / "node-mode.json"
    if kind == "fifo":
        os.mkfifo(record)
    else:
        record.write_text(DEEP_JSON)
    (tmp_path / "plugins").mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "enflame_gcu.device_plugin.main",
            f"--host-root={tmp_path}",
            "--node-mode=auto",
            f"--plugin-dir={tmp_path / 'plugins'}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "/etc/enflame-gcu/node-mode.json" in result.stderr
    assert ("FIFO" if kind == "fifo" else "too deeply") in result.stderr
