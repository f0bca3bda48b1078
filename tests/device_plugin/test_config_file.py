"""The versioned config file: valid, wrong version, unknown keys by path, precedence, SIGHUP."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import signal
import textwrap

import pytest
import yaml

from enflame_gcu import sharing
from enflame_gcu.device_plugin import config, config_file, main
from enflame_gcu.errors import ConfigError
from enflame_gcu.simulation.testing import plugin_process

FULL = """\
version: v1
flags:
  resources: [gcu, shared-gcu]
  passDeviceSpecs: true
  deviceListStrategy: [envvar, cdi-cri]
  healthInterval: 2.5
  failOnInitError: true
  allocationPolicy: simple
  logLevel: debug
  sharedResourceName: example.com/slice
sharing:
  cards: [gcu4, 5, "9d:00.0"]
  slicesPerCard: 4
  slicesByModel: {"S60 48GB": 8}
  slicesByCard: {gcu3: 2}
  policy: distributed
  maxSlicesPerContainer: 3
"""


def write(tmp_path: pathlib.Path, text: str, name: str = "config.yaml") -> str:
    """A config file with ``text``; returns its path."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_full_file_sets_every_flag_and_the_sharing_settings(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, FULL)
    got = main.load_config(["--config-file", path], {})
    assert got == config.PluginConfig(
        config_file=path,
        resources=("gcu", "shared-gcu"),
        pass_device_specs=True,
        device_list_strategy=("envvar", "cdi-cri"),
        health_interval=2.5,
        fail_on_init_error=True,
        allocation_policy="simple",
        log_level="debug",
        shared_resource_name="example.com/slice",
        sharing=sharing.SharingSettings(
            slices=4,
            slices_by_model={"S60 48GB": 8},
            slices_by_card={"gcu3": 2},
            policy="distributed",
            max_slices_per_container=3,
        ),
        shared_cards=("gcu4", "gcu5", "0000:9d:00.0"),
    )
    assert got.resource_names() == {"gcu": "enflame.com/gcu", "shared-gcu": "example.com/slice"}


def test_every_flag_can_be_spelt_in_the_file() -> None:
    fields = {o.field for o in config.OPTIONS} - set(config_file.NOT_IN_FILE)
    assert {o.field for o in config_file.FLAG_KEYS.values()} == fields
    assert "passDeviceSpecs" in config_file.FLAG_KEYS
    assert "deviceListStrategy" in config_file.FLAG_KEYS


def test_version_only_file_gives_the_defaults() -> None:
    assert config.resolve([config_file.parse("version: v1\n")]) == config.PluginConfig()


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("flags: {}\n", "version: missing; this plugin reads version: v1"),
        ("version: v2\n", "version: 'v2'; this plugin reads version: v1"),
        ("version: 1\n", "version: 1; this plugin reads version: v1"),
        ("", "version: missing"),
        ("- a\n", "top level: must be a mapping, got list"),
        ("version: v1\nflags: [x]\n", "flags: must be a mapping, got list"),
        ("version: [v1\n", "not valid YAML"),
    ],
)
def test_wrong_or_missing_version_and_bad_shapes_are_refused(text: str, phrase: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_file.parse(text)
    assert phrase in str(caught.value)


@pytest.mark.parametrize(
    ("text", "path", "valid"),
    [
        ("version: v1\nshring: {}\n", "shring", "flags, sharing, version"),
        ("version: v1\nsharing: {slicesPerCrad: 4}\n", "sharing.slicesPerCrad", "cards, max"),
        ("version: v1\nflags: {passDeviceSpec: true}\n", "flags.passDeviceSpec", "passDeviceSpecs"),
        ("version: v1\nflags: {configFile: /x}\n", "flags.configFile", "resources"),
    ],
)
def test_unknown_keys_are_named_by_their_path_with_the_valid_keys(
    text: str, path: str, valid: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_file.parse(text)
    message = str(caught.value)
    assert message.startswith(f"{path}: unknown key; valid: ")
    assert valid in message


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        (
            "flags: {healthInterval: soon}",
            "flags.healthInterval: 'soon' is not a number of seconds",
        ),
        ("flags: {healthInterval: true}", "flags.healthInterval: expected a number"),
        ("flags: {passDeviceSpecs: 1}", "flags.passDeviceSpecs: expected true or false"),
        ("flags: {deviceListStrategy: [magic]}", "flags.deviceListStrategy: unknown strategy"),
        ("flags: {resources: [gcu, mig]}", "flags.resources: unknown resource mig; valid: gcu"),
        ("flags: {resources: gcu, logLevel: [a]}", "flags.logLevel: expected a string"),
        ("sharing: {slicesPerCard: 0}", "sharing.slicesPerCard: expected a whole number >= 1"),
        ("sharing: {slicesPerCard: 65}", "slice counts must be 1..64"),
        ("sharing: {slicesByCard: {gcu1: x}}", "sharing.slicesByCard.gcu1: expected a whole"),
        ("sharing: {slicesByCard: {card1: 2}}", "sharing.slicesByCard.card1: 'card1' is not a"),
        ("sharing: {policy: random}", "sharing.policy: 'random' is not a policy; valid: packed"),
        ("sharing: {maxSlicesPerContainer: -1}", "sharing.maxSlicesPerContainer: expected"),
        ("sharing: {cards: []}", "sharing.cards: expected 'all' or a non-empty list"),
        ("sharing: {cards: [gcu1, bogus]}", "sharing.cards[1]: 'bogus' is not a card"),
    ],
)
def test_bad_values_name_their_path(body: str, phrase: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_file.parse(f"version: v1\n{body}\n")
    assert phrase in str(caught.value)


def test_precedence_is_command_line_then_environment_then_file(tmp_path: pathlib.Path) -> None:
    path = write(
        tmp_path,
        "version: v1\nflags: {healthInterval: 7, logLevel: debug, pluginDir: /file, "
        "resources: [gcu, vgcu]}\n",
    )
    env = {"CONFIG_FILE": path, "DP_HEALTH_INTERVAL": "8", "DP_PLUGIN_DIR": "/env"}
    got = main.load_config(["--plugin-dir", "/cli"], env)
    assert (got.plugin_dir, got.health_interval, got.log_level) == ("/cli", 8.0, "debug")
    assert got.resources == ("gcu", "vgcu")
    assert main.load_config(["--resources", "shared-gcu"], env).resources == ("shared-gcu",)
    # The command line's --config-file beats the environment's.
    other = write(tmp_path, "version: v1\nflags: {logLevel: error}\n", "other.yaml")
    assert main.load_config(["--config-file", other], env).log_level == "error"


def test_unreadable_or_invalid_file_exits_2_naming_the_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert main.main(["--config-file", missing]) == 2
    assert f"config file {missing}: cannot read" in capsys.readouterr().err
    bad = write(tmp_path, "version: v1\nsharing: {polcy: packed}\n")
    assert main.main(["--config-file", bad]) == 2
    assert f"config file {bad}: sharing.polcy: unknown key" in capsys.readouterr().err


def test_describe_shows_the_sharing_settings_once_per_setting() -> None:
    text = config_file.parse(FULL)
    described = config.resolve([text]).describe()
    assert described.count("=") == len(config.PluginConfig.__dataclass_fields__)
    assert "policy:'distributed'" in described
    assert "shared_cards=('gcu4', 'gcu5', '0000:9d:00.0')" in described


SHARED_4_5 = """\
version: v1
flags: {resources: [gcu, shared-gcu]}
sharing: {cards: [gcu4, gcu5], slicesPerCard: 2}
"""


def test_sighup_applies_a_valid_new_file_and_refuses_an_invalid_one(
    tmp_path: pathlib.Path,
) -> None:
    path = write(tmp_path, "version: v1\n")

    async def scenario() -> None:
        async with plugin_process.running_node("vendor-8card", ["--config-file", path]) as node:
            kubelet, plugin = node.kubelet, node.plugin
            assert kubelet.capacity() == 8
            assert plugin.log_text().count("starting:") == 1  # effective config logged once
            write(tmp_path, SHARED_4_5)
            plugin.send(signal.SIGHUP)
            await kubelet.wait_for(
                lambda k: k.capacity("enflame.com/shared-gcu") == 4 and k.capacity() == 6,
                15,
                "shared slices of gcu4 and gcu5 after SIGHUP",
            )
            assert sorted(kubelet.devices("enflame.com/shared-gcu")) == [
                "gcu4-slice0",
                "gcu4-slice1",
                "gcu5-slice0",
                "gcu5-slice1",
            ]
            assert "gcu4" not in kubelet.devices()
            assert "SIGHUP: config reloaded" in plugin.log_text()
            # The whole-card resource kept its stream; only the new resource registered.
            assert [r.resource_name for r in kubelet.registrations] == [
                "enflame.com/gcu",
                "enflame.com/shared-gcu",
            ]
            assert kubelet.stream_ends == []

            write(tmp_path, SHARED_4_5.replace("slicesPerCard", "slicesPerCrad"))
            plugin.send(signal.SIGHUP)
            for _ in range(400):
                if "SIGHUP: new config refused" in plugin.log_text():
                    break
                await asyncio.sleep(0.025)
            await asyncio.sleep(0.3)
            assert all(p.stream_open for p in kubelet.plugins.values())
            assert kubelet.capacity("enflame.com/shared-gcu") == 4
            assert len(kubelet.registrations) == 2
            assert kubelet.stream_ends == []
            log_text = plugin.log_text()
            assert "SIGHUP: new config refused, keeping the running one" in log_text
            assert "sharing.slicesPerCrad: unknown key" in log_text
            assert kubelet.capacity() == 6
            assert plugin.process is not None and plugin.process.returncode is None

    asyncio.run(scenario())


CHART = pathlib.Path(__file__).parents[2] / "deploy" / "helm" / "enflame-gcu"


def render_chart_config(sharing_values: dict[str, object]) -> str:
    """The chart's config.yaml body with ``sharing`` values, for the few template forms it uses.

    No helm binary exists here; this keeps the chart's keys and the plugin's parser in step.
    """
    template = (CHART / "templates" / "configmap-plugin-config.yaml").read_text()
    body = template.rsplit("config.yaml: |", 1)[1].split("{{- end }}", 1)[0]  # the generated one

    def value(name: str) -> object:
        return sharing_values[name.removeprefix(".Values.sharing.")]

    def if_else(match: re.Match[str]) -> str:
        return json.dumps(value(match[1])) if value(match[1]) else match[2]

    body = re.sub(
        r"\{\{ if (\S+) \}\}\{\{ toJson \1 \}\}\{\{ else \}\}(\w+)\{\{ end \}\}", if_else, body
    )
    body = re.sub(r"\{\{ toJson (\S+) \}\}", lambda m: json.dumps(value(m[1])), body)
    body = re.sub(r"\{\{ (\.Values\.\S+) \}\}", lambda m: str(value(m[1])), body)
    assert "{{" not in body, body
    return textwrap.dedent(body)


def test_the_charts_config_map_is_a_config_file_the_plugin_accepts() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["sharing"]
    defaults = config.resolve([config_file.parse(render_chart_config(values))])
    assert defaults.sharing == sharing.SharingSettings(slices=values["slicesPerCard"])
    assert defaults.shared_cards is None  # empty list in values = every card
    values.update(
        cards=[4, "0000:9d:00.0"],
        slicesByModel={"S60 48GB": 8},
        slicesByCard={"4": 3},
        policy="distributed",
        maxSlicesPerContainer=2,
    )
    got = config.resolve([config_file.parse(render_chart_config(values))])
    assert got.shared_cards == ("gcu4", "0000:9d:00.0")
    assert got.sharing == sharing.SharingSettings(
        slices=6, slices_by_model={"S60 48GB": 8}, slices_by_card={"gcu4": 3},
        policy="distributed", max_slices_per_container=2,
    )  # fmt: skip
