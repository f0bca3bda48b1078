"""One grammar for every ``enflame-ctk`` command: options, --json, messages, exit codes, roots."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import yaml

from enflame_gcu.container_toolkit import cli
from enflame_gcu.container_toolkit.commands import common
from tests import program_parsers

REAL_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/enflame-gcu"
REAL_PREPARED_EDITS = "/var/run/enflame/prepared-edits.json"
REAL_CDI_DIR = "/var/run/cdi"


def ctk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enflame_gcu.container_toolkit.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_one_spelling_per_option_across_commands() -> None:
    """The same idea never has two visible spellings (host root, engine restart)."""
    visible: set[object] = set()
    for found in program_parsers.walk(cli.build_parser(), ("enflame-ctk",)):
        for action in found.parser._actions:
            if action.help != argparse.SUPPRESS:
                visible.update(action.option_strings)
    assert "--host-root" in visible and "--restart-engine" in visible
    assert "--root" not in visible and "--restart" not in visible


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["info"], "Info"),
        (["doctor"], "DoctorReport"),
        (["labels", "--output", "-"], "Labels"),
        (["cdi", "list"], "CDIDeviceList"),
        (["sim", "topologies"], "TopologyList"),
        (["runtime", "detect"], "RuntimeDetection"),
        (["allocations", "--pod-resources-socket", "/nonexistent/kubelet.sock"], "Allocations"),
    ],
)
def test_reporting_commands_print_json_with_a_schema_version(
    vendor_node: str, args: list[str], kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if args[0] != "sim":
        args = [*args, "--host-root", vendor_node]
    cli.main([*args, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert list(document)[:2] == ["schemaVersion", "kind"]
    assert document["schemaVersion"] == common.SCHEMA_VERSION
    assert document["kind"] == kind
    assert not _not_camel(document), _not_camel(document)


def _not_camel(value: object, path: str = "") -> list[str]:
    """Keys that are not camelCase (each key once: no snake_case twin beside it)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            twin = common.camel(key)
            if "_" in key:
                found.append(f"{path}.{key}")
            if twin not in common.DATA_MAPS:
                found += _not_camel(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            found += _not_camel(item, f"{path}[]")
    return found


def test_json_keys_are_camel_case_once_and_the_old_spelling_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = {"numa_node": 1, "cards": [{"root_port": "a"}], "by_locality": {"root_port": 2}}
    monkeypatch.delenv(common.LEGACY_KEYS_ENV, raising=False)
    assert common.json_document("X", given) == {
        "schemaVersion": 1,
        "kind": "X",
        "numaNode": 1,
        "cards": [{"rootPort": "a"}],
        "byLocality": {"root_port": 2},  # locality names are data, not field names
    }
    monkeypatch.setenv(common.LEGACY_KEYS_ENV, "1")  # a script still on 0.1's names
    assert common.json_document("X", given) == {
        "schemaVersion": 1,
        "kind": "X",
        "numaNode": 1,
        "numa_node": 1,
        "cards": [{"rootPort": "a", "root_port": "a"}],
        "byLocality": {"root_port": 2},
        "by_locality": {"root_port": 2},
    }


def test_global_options_are_accepted_after_the_subcommand(vendor_node: str) -> None:
    before = ctk("--log-level", "debug", "info", "--host-root", vendor_node)
    after = ctk("info", "--host-root", vendor_node, "--log-level", "debug")
    nested = ctk("cdi", "list", "--host-root", vendor_node, "--log-level", "error")
    assert before.returncode == after.returncode == 0, after.stderr
    assert before.stdout == after.stdout
    assert nested.returncode == 1  # no spec there yet: a failed command, not a usage error
    bad = ctk("info", "--log-level", "loud")
    assert bad.returncode == common.EXIT_USAGE
    assert "invalid choice: 'loud'" in bad.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["doctor"],
        ["labels"],
        ["cdi", "generate"],
        ["cdi", "list"],
        ["system", "create-dev-char-symlinks"],
        ["runtime", "configure", "--runtime", "docker"],
        ["install"],
        ["uninstall"],
    ],
)
def test_a_missing_host_root_is_a_usage_error_that_says_so(
    tmp_path: os.PathLike[str], args: list[str]
) -> None:
    missing = os.path.join(str(tmp_path), "no-such-dir")
    result = ctk(*args, "--host-root", missing)
    assert result.returncode == common.EXIT_USAGE, result.stderr
    assert f"host root {missing} does not exist" in result.stderr
    assert "NOT LOADED" not in result.stdout + result.stderr
    assert result.stderr.splitlines()[-1].startswith("enflame-ctk ")


def test_usage_errors_and_failed_checks_have_distinct_exit_codes(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    assert ctk("doctor", "--no-such-option").returncode == common.EXIT_USAGE
    assert ctk("cdi", "generate", "--format", "xml").returncode == common.EXIT_USAGE
    empty = os.path.join(str(tmp_path), "empty")
    os.mkdir(empty)
    failed = ctk("doctor", "--host-root", empty)
    assert failed.returncode == common.EXIT_FAILED
    assert ctk("info", "--host-root", empty).returncode == common.EXIT_FAILED
    assert {common.EXIT_OK, common.EXIT_FAILED, common.EXIT_USAGE, common.EXIT_WARNINGS} == {
        0,
        1,
        2,
        3,
    }


def test_the_old_spellings_still_work_and_say_which_to_use(vendor_node: str) -> None:
    result = ctk("info", "--root", vendor_node, "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["root"] == vendor_node
    assert "enflame-ctk: warning: --root is deprecated, use --host-root" in result.stderr


def _stat(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns)


def test_labels_with_a_host_root_writes_inside_it_only(vendor_node: str) -> None:
    real = _stat(REAL_FEATURE_FILE)
    result = ctk("labels", "--host-root", vendor_node)
    assert result.returncode == 0, result.stderr
    inside = os.path.join(vendor_node, REAL_FEATURE_FILE.lstrip("/"))
    with open(inside, encoding="utf-8") as handle:
        assert "enflame.com/gcu.count=8\n" in handle.read()
    assert f"enflame-ctk: wrote 7 labels to {inside}" in result.stderr
    assert _stat(REAL_FEATURE_FILE) == real


def test_cdi_generate_with_a_host_root_reads_and_writes_inside_it_only(vendor_node: str) -> None:
    real = (_stat(REAL_PREPARED_EDITS), _stat(REAL_CDI_DIR))
    # The host's runtime config inside the root names where the prepared edits go.
    config = os.path.join(vendor_node, "etc/enflame-container-runtime/config.toml")
    os.makedirs(os.path.dirname(config))
    with open(config, "w", encoding="utf-8") as handle:
        handle.write('prepared-edits = "/var/lib/enflame/prepared.json"\n')
    result = ctk("cdi", "generate", "--host-root", vendor_node, "--prepared-edits", "config")
    assert result.returncode == 0, result.stderr
    prepared = os.path.join(vendor_node, "var/lib/enflame/prepared.json")
    with open(prepared, encoding="utf-8") as handle:
        assert json.load(handle)["root"] == "/"  # as the host's runtime sees it
    assert os.path.isfile(os.path.join(vendor_node, "var/run/cdi/enflame.com-gcu.yaml"))
    assert (_stat(REAL_PREPARED_EDITS), _stat(REAL_CDI_DIR)) == real


def test_cdi_generate_output_file_writes_that_file(
    vendor_node: str, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(str(tmp_path), "specs", "gcu.yaml")
    assert cli.main(["cdi", "generate", "--host-root", vendor_node, "--output", target]) == 0
    with open(target, encoding="utf-8") as handle:
        assert yaml.safe_load(handle)["kind"] == "enflame.com/gcu"
    as_json = os.path.join(str(tmp_path), "gcu.json")
    assert cli.main(["cdi", "generate", "--host-root", vendor_node, "--output", as_json]) == 0
    with open(as_json, encoding="utf-8") as handle:
        assert json.load(handle)["kind"] == "enflame.com/gcu"
    # An existing directory is a directory, whatever its name.
    directory = os.path.join(str(tmp_path), "looks-like.yaml")
    os.mkdir(directory)
    assert cli.main(["cdi", "generate", "--host-root", vendor_node, "--output", directory]) == 0
    assert os.listdir(directory) == ["enflame.com-gcu.yaml"]


def test_every_message_is_on_stderr_with_the_prefix(vendor_node: str) -> None:
    result = ctk("system", "create-dev-char-symlinks", "--host-root", vendor_node, "--dry-run")
    assert result.returncode == 0
    notes = ctk("sim", "unplug", vendor_node, "gcu1")
    assert notes.stdout == ""
    assert notes.stderr == "enflame-ctk: unplugged gcu1\n"
    failing = ctk("cdi", "validate", os.path.join(vendor_node, "missing.yaml"))
    assert failing.returncode == common.EXIT_FAILED
    assert all(line.startswith("enflame-ctk: ") for line in failing.stderr.splitlines())


def test_device_plugin_bad_values_are_named_not_python_errors() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.device_plugin.main", "--metrics-port", "abc"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "enflame-device-plugin: warning: --metrics-port is deprecated, use --http-address "
        "HOST:PORT\n"
        "enflame-device-plugin: invalid metrics-port: 'abc' is not a port number "
        "(0..65535; 0 turns metrics off)\n"
    )
    missing = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.device_plugin.main", "--host-root", "/no/such/root"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert "invalid host-root: /no/such/root does not exist" in missing.stderr


def test_each_command_module_registers_the_commands_the_cli_maps_to_it() -> None:
    """The map that lets a command import only its own module matches what each registers."""
    for module, commands in cli.COMMAND_MODULES.items():
        parser = cli.build_parser([module])
        [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert tuple(subparsers.choices) == commands, module


@pytest.mark.parametrize(
    ("argv", "imported", "not_imported"),
    [
        (["--log-level", "info", "info", "--help"], "info", "allocations"),
        (["runtime", "detect", "--help"], "runtime", "doctor"),
        (["--version"], None, "info"),
        (["--help"], "doctor", None),
    ],
)
def test_a_command_imports_only_its_own_module(
    argv: list[str], imported: str | None, not_imported: str | None
) -> None:
    probe = (
        "import sys\n"
        "from enflame_gcu.container_toolkit import cli\n"
        "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(m.rsplit('.', 1)[1] for m in sys.modules"
        " if m.startswith('enflame_gcu.container_toolkit.commands.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True
    )
    loaded = done.stdout.splitlines()[-1].split()
    assert "common" in loaded
    if imported:
        assert imported in loaded, loaded
    if not_imported:
        assert not_imported not in loaded, loaded
