"""The four daemons speak one dialect: --http-address, --version, --log-level, --log-format and
ENFLAME_<OPTION>; the old spellings still work and each says so once on stderr."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from enflame_gcu import __version__
from enflame_gcu.device_plugin import main as plugin_main
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.errors import ConfigError
from enflame_gcu.gcu_operator import main as operator_main
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import decisions, server
from enflame_gcu.scheduler_extender import main as extender_main
from enflame_gcu.simulation.testing import plugin_process

OPERATOR_ENV = (
    "ENFLAME_HTTP_ADDRESS",
    "ENFLAME_LOG_LEVEL",
    "ENFLAME_LOG_FORMAT",
    "ENFLAME_INTERVAL",
)


@pytest.fixture(autouse=True)
def _bare_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator's parser reads os.environ: none of this shell's settings leak in.
    for name in OPERATOR_ENV:
        monkeypatch.delenv(name, raising=False)


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "enflame-device-plugin": plugin_main.build_parser,
    "enflame-dra-plugin": lambda: dra_config.build_parser({}),
    "enflame-scheduler-extender": lambda: extender_main.build_parser({}),
    "enflame-gcu-operator": operator_main._parser,
}


def test_every_daemons_help_shows_the_shared_options_and_hides_the_old_ones() -> None:
    for prog, make in PARSERS.items():
        parser = make()
        parser.epilog = None  # which may name the old spellings, as the device plugin's does
        text = " ".join(parser.format_help().split())  # argparse wraps at the terminal width
        for shown in (
            "--http-address HOST:PORT",
            "--version",
            "--log-level {debug,info,warning,error}",
            "--log-format {text,json}",
            "[env ENFLAME_HTTP_ADDRESS;",
            "[env ENFLAME_LOG_LEVEL; default info]",
            "[env ENFLAME_LOG_FORMAT; default text]",
        ):
            assert shown in text, f"{prog} --help lacks {shown!r}"
        for old in ("--metrics-port", "--metrics-bind-address", "--bind-address", "--port ",
                    "--health-port", "--health-address", "EXTENDER_"):  # fmt: skip
            assert old not in text, f"{prog} --help still shows {old}"


def test_every_daemon_prints_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    for prog, make in PARSERS.items():
        with pytest.raises(SystemExit) as exit_info:
            make().parse_args(["--version"])
        assert exit_info.value.code == 0
        assert capsys.readouterr().out == f"{prog} {__version__}\n"


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "deprecated" in line]


def test_the_device_plugins_old_metrics_flags_work_and_say_so_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = plugin_main.load_config(["--metrics-port", "9402", "--metrics-bind-address", "::1"], {})
    assert _warnings(capsys.readouterr().err) == [
        "enflame-device-plugin: warning: --metrics-port is deprecated, use --http-address "
        "HOST:PORT",
        "enflame-device-plugin: warning: --metrics-bind-address is deprecated, use --http-address "
        "HOST:PORT",
    ]
    new = plugin_main.load_config(["--http-address", "[::1]:9402"], {})
    assert capsys.readouterr().err == ""
    assert (old.metrics_bind_address, old.metrics_port) == ("::1", 9402)
    assert (new.metrics_bind_address, new.metrics_port) == ("::1", 9402)
    every = plugin_main.load_config(["--http-address", ":9402"], {})
    assert (every.metrics_bind_address, every.metrics_port) == ("", 9402)
    # The new spelling given anywhere wins over the old halves (one address, one place).
    both = plugin_main.load_config(["--metrics-port=1"], {"ENFLAME_HTTP_ADDRESS": "127.0.0.1:7"})
    assert (both.metrics_bind_address, both.metrics_port) == ("127.0.0.1", 7)
    off = plugin_main.load_config(["--http-address", ""], {})
    assert off.metrics_port == 0
    with pytest.raises(ConfigError, match="'localhost' is not an IP address"):
        plugin_main.load_config(["--http-address", "localhost:9402"], {})


def test_the_device_plugins_config_file_takes_http_address(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text('version: v1\nflags: {httpAddress: "127.0.0.1:9000", metricsPort: 1}\n')
    config = plugin_main.load_config(["--config-file", str(path)], {})
    assert (config.metrics_bind_address, config.metrics_port) == ("127.0.0.1", 9000)


def test_a_running_plugin_says_it_once_not_at_every_sighup(tmp_path: pathlib.Path) -> None:
    config_file = tmp_path / "plugin.yaml"
    config_file.write_text("version: v1\n")
    argv = ["--config-file", str(config_file), "--metrics-bind-address", "127.0.0.1"]

    async def scenario() -> None:
        async with plugin_process.running_node("flat-4card", argv) as node:
            for reloads in (1, 2):
                node.plugin.send(signal.SIGHUP)
                for _ in range(600):
                    if node.plugin.log_text().count("SIGHUP: rediscovering") == reloads:
                        break
                    await asyncio.sleep(0.05)
            text = node.plugin.log_text()
            assert text.count("SIGHUP: rediscovering") == 2, text
            assert text.count("--metrics-bind-address is deprecated") == 1, text

    asyncio.run(scenario())


def test_the_extenders_bind_address_and_port_work_and_say_so_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = extender_main.build_parser({}).parse_args(
        ["--bind-address", "10.1.2.3", "--port", "4000"]
    )
    assert _warnings(capsys.readouterr().err) == [
        "enflame-scheduler-extender: warning: --bind-address is deprecated, use --http-address "
        "HOST:PORT",
        "enflame-scheduler-extender: warning: --port is deprecated, use --http-address HOST:PORT",
    ]
    new = extender_main.build_parser({}).parse_args(["--http-address", "10.1.2.3:4000"])
    assert capsys.readouterr().err == ""
    assert (old.bind_address, old.port) == (new.bind_address, new.port) == ("10.1.2.3", 4000)
    half = extender_main.build_parser({}).parse_args(["--port", "4001"])
    assert (half.bind_address, half.port) == ("127.0.0.1", 4001)  # the default host stays
    default = extender_main.build_parser({}).parse_args([])
    assert (default.bind_address, default.port) == ("127.0.0.1", extender_main.DEFAULT_PORT)


def test_the_operators_health_port_and_address_work_and_say_so_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = operator_main._parser().parse_args(
        ["--health-port", "8081", "--health-address", "10.0.0.1"]
    )
    assert len(_warnings(capsys.readouterr().err)) == 2
    new = operator_main._parser().parse_args(["--http-address", "10.0.0.1:8081"])
    assert capsys.readouterr().err == ""
    assert (old.health_address, old.health_port) == (new.health_address, new.health_port)
    assert (new.health_address, new.health_port) == ("10.0.0.1", 8081)
    six = operator_main._parser().parse_args(["--http-address", "[fd00::1]:8081"])
    assert (six.health_address, six.health_port) == ("fd00::1", 8081)
    off = operator_main._parser().parse_args([])
    assert (off.health_address, off.health_port) == ("", 0)


def test_the_extenders_readiness_probe_takes_the_new_and_the_old_spelling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    http_server = server.ExtenderServer(
        ("127.0.0.1", 0),
        decisions.Decisions(extender_cache.ClusterCache()),
        ready=lambda: (True, "ok"),
    )
    http_server.start()
    try:
        port = http_server.port
        assert extender_main.main(["--check-ready", f"--http-address=127.0.0.1:{port}"]) == 0
        assert _warnings(capsys.readouterr().err) == []
        assert extender_main.main(["--check-ready", f"--port={port}"]) == 0
        assert len(_warnings(capsys.readouterr().err)) == 1
    finally:
        http_server.stop()


def test_one_environment_prefix_for_every_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "ENFLAME_HTTP_ADDRESS": "127.0.0.1:9555",
        "ENFLAME_LOG_LEVEL": "debug",
        "ENFLAME_LOG_FORMAT": "json",
    }
    plugin = plugin_main.load_config([], env)
    assert (plugin.metrics_bind_address, plugin.metrics_port) == ("127.0.0.1", 9555)
    assert (plugin.log_level, plugin.log_format) == ("debug", "json")
    dra = dra_config.parse([], {"NODE_NAME": "n1", **env})
    assert (dra.http_address, dra.log_level, dra.log_format) == ("127.0.0.1:9555", "debug", "json")
    extender = extender_main.build_parser(env).parse_args([])
    assert (extender.bind_address, extender.port, extender.log_level, extender.log_format) == (
        "127.0.0.1", 9555, "debug", "json",
    )  # fmt: skip
    for name, value in {**env, "ENFLAME_INTERVAL": "7"}.items():
        monkeypatch.setenv(name, value)
    operator = operator_main._parser().parse_args([])
    assert (operator.health_address, operator.health_port) == ("127.0.0.1", 9555)
    assert (operator.log_level, operator.log_format, operator.interval) == ("debug", "json", 7.0)
    # The command line still wins over the environment.
    assert operator_main._parser().parse_args(["--interval", "3"]).interval == 3.0


def test_the_extenders_old_variables_are_read_with_a_warning() -> None:
    warnings: list[str] = []
    old = {"EXTENDER_PORT": "4000", "EXTENDER_LOG_LEVEL": "debug", "EXTENDER_GUESS_TTL": "9"}
    args = extender_main.build_parser(old, warnings).parse_args([])
    assert (args.bind_address, args.port, args.log_level, args.guess_ttl) == (
        "127.0.0.1", 4000, "debug", "9",
    )  # fmt: skip
    assert len(warnings) == 3
    for name, new in (
        ("EXTENDER_PORT", "ENFLAME_HTTP_ADDRESS"),
        ("EXTENDER_LOG_LEVEL", "ENFLAME_LOG_LEVEL"),
        ("EXTENDER_GUESS_TTL", "ENFLAME_GUESS_TTL"),
    ):
        assert any(name in w and f"use {new}" in w for w in warnings), (name, warnings)
    both = extender_main.build_parser({"ENFLAME_HTTP_ADDRESS": ":5000", **old}, []).parse_args([])
    assert (both.bind_address, both.port) == ("", 5000)  # the new name wins


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--http-address", "9402"], "is not HOST:PORT"),
        (["--http-address", "host:99999"], "is not HOST:PORT"),
        (["--log-level", "loud"], "'loud' is not one of debug, info, warning, error"),
        (["--log-format", "xml"], "'xml' is not one of text, json"),
    ],
)
def test_a_bad_value_is_refused_by_every_daemon_naming_the_option(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The device plugin's flags are one layer of several (environment, config file), checked
    # as one: its refusal is a ConfigError main prints.
    with pytest.raises(ConfigError) as refused:
        plugin_main.load_config(argv, {})
    assert f"invalid {argv[0][2:]}: " in str(refused.value) and said in str(refused.value)
    for prog in ("enflame-dra-plugin", "enflame-scheduler-extender", "enflame-gcu-operator"):
        with pytest.raises(SystemExit) as exit_info:
            PARSERS[prog]().parse_args(argv)
        assert exit_info.value.code == 2, prog
        err = capsys.readouterr().err
        assert f"argument {argv[0]}" in err and said in err, (prog, err)


def test_the_extender_refuses_a_bad_number_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    interval = sys.getswitchinterval()  # main() sets it
    try:
        for flag, value, said in (
            ("--state-max-age", "5", "invalid --state-max-age: 5 is outside 10..86400"),
            ("--guess-ttl", "soon", "invalid --guess-ttl: 'soon' is not a number"),
            ("--max-body", "10", "invalid --max-body: 10 is outside 1024.."),
        ):
            assert extender_main.main([flag, value]) == 2, flag
            assert said in capsys.readouterr().err, flag
    finally:
        sys.setswitchinterval(interval)


def test_bad_variables_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="invalid http-address"):
        plugin_main.load_config([], {"ENFLAME_HTTP_ADDRESS": "nowhere"})
    with pytest.raises(SystemExit):
        extender_main.build_parser({"EXTENDER_PORT": "many"})
    assert "invalid EXTENDER_PORT: 'many' is not a port" in capsys.readouterr().err
    monkeypatch.setenv("ENFLAME_INTERVAL", "soon")
    with pytest.raises(SystemExit):
        operator_main._parser()
    assert "invalid ENFLAME_INTERVAL: 'soon'" in capsys.readouterr().err
    monkeypatch.setenv("ENFLAME_INTERVAL", "5")
    monkeypatch.setenv("ENFLAME_HTTP_ADDRESS", "nowhere")
    with pytest.raises(SystemExit):
        operator_main._parser()
    assert "invalid ENFLAME_HTTP_ADDRESS: 'nowhere' is not HOST:PORT" in capsys.readouterr().err
    monkeypatch.delenv("ENFLAME_HTTP_ADDRESS")
    with pytest.raises(SystemExit):
        operator_main._parser().parse_args(["--health-port", "99999"])
    assert "'99999' is not a port number" in capsys.readouterr().err


def test_the_dra_driver_logs_json_lines_when_asked(tmp_path: os.PathLike[str]) -> None:
    """A real process: every line it writes to stderr is one JSON object (exit 2: no API)."""
    root = os.fspath(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.dra_plugin.main", "--node-name", "n1",
         "--host-root", root, "--registry-dir", f"{root}/reg", "--plugin-dir", f"{root}/plugin",
         "--cdi-dir", f"{root}/cdi", "--kubeconfig", f"{root}/missing", "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ENFLAME_LOG_LEVEL": "info"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines, "nothing logged"
    records = [json.loads(line) for line in lines]  # each line is JSON, or this raises
    assert {"time", "level", "logger", "msg"} <= set(records[0])
    assert any("starting on node n1" in r["msg"] for r in records)
    assert records[-1]["level"] == "error" and f"{root}/missing" in records[-1]["msg"]
