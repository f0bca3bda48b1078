"""One config per node pool: the node label chooses a named config; a change reloads as SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import Iterator, Mapping

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import main, named_configs, node_annotation
from enflame_gcu.errors import ConfigError
from enflame_gcu.simulation.testing import plugin_process
from tests.dra_plugin.fake_apiserver import FakeApiServer

LABEL = plugin_config.CONFIG_LABEL
WHOLE = "version: v1\n"
SHARED = """\
version: v1
flags: {resources: [gcu, shared-gcu]}
sharing: {cards: [gcu4, gcu5], slicesPerCard: 2}
"""
VGCU_ONLY = "version: v1\nflags: {resources: [gcu], healthInterval: 2}\n"
BROKEN = "version: v1\nsharing: {slicesPerCrad: 2}\n"


def config_map_volume(where: pathlib.Path, configs: Mapping[str, str]) -> str:
    """A directory laid out as the kubelet mounts a ConfigMap: each key a link into ``..data``."""
    where.mkdir(parents=True, exist_ok=True)
    stamp = where / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir()
    for name, text in configs.items():
        (stamp / name).write_text(text)
        os.symlink(f"..data/{name}", where / name)
    os.symlink(stamp.name, where / "..data")
    return str(where)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node("node-a")
        yield server


def label(fake: FakeApiServer, value: str | None) -> None:
    with fake.lock:
        labels = fake.nodes["node-a"]["metadata"].setdefault("labels", {})
        labels.pop(LABEL, None)
        if value is not None:
            labels[LABEL] = value
        labels["kubernetes.io/hostname"] = "node-a"


def named_for(directory: str, default: str = "whole", **extra: str) -> named_configs.NamedConfigs:
    layer = {"config_dir": directory, "config_default": default, "node_name": "node-a", **extra}
    return named_configs.NamedConfigs(plugin_config.resolve([layer]))


# --- the choice --------------------------------------------------------------------------------


def test_the_label_chooses_an_existing_config() -> None:
    choice = named_configs.choose("shared", ("shared", "whole"), "whole")
    assert (choice.name, choice.trouble) == ("shared", False)


def test_no_label_chooses_the_default_and_no_default_means_none() -> None:
    assert named_configs.choose(None, ("shared", "whole"), "whole").name == "whole"
    assert named_configs.choose(None, ("shared", "whole"), "").name == ""


def test_a_label_naming_no_config_falls_back_to_the_default_and_names_what_exists() -> None:
    choice = named_configs.choose("sahred", ("shared", "whole"), "whole")
    assert (choice.name, choice.trouble) == ("whole", True)
    assert "'sahred'" in choice.why and "available: shared, whole" in choice.why


def test_a_default_that_is_not_there_is_none_and_says_so() -> None:
    choice = named_configs.choose(None, ("shared",), "whole")
    assert (choice.name, choice.trouble) == ("", True)
    assert "'whole' is not there either" in choice.why and "available: shared" in choice.why


def test_only_files_with_config_names_count_in_a_config_map_volume(tmp_path: pathlib.Path) -> None:
    directory = config_map_volume(tmp_path / "configs", {"whole": WHOLE, "pool.b_2": SHARED})
    (tmp_path / "configs" / "sub").mkdir()
    (tmp_path / "configs" / "-bad").write_text(WHOLE)
    assert named_configs.available(directory) == ("pool.b_2", "whole")
    assert named_configs.available(str(tmp_path / "missing")) == ()


@pytest.mark.parametrize(
    ("layer", "says"),
    [
        ({"config_dir": "/x"}, "needs node-name"),
        ({"config_dir": "/x", "config_file": "/y", "node_name": "n"}, "not both"),
        ({"config_default": "-pool"}, "not a config name"),
        ({"config_label": "Enflame.com/x"}, "not a label key"),
        ({"config_label": "enflame.com/"}, "not a label key"),
        ({"config_label_interval": "0.01"}, "outside 0.1..3600"),
    ],
)
def test_named_config_settings_are_checked(layer: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        plugin_config.resolve([layer])


def test_a_named_config_cannot_choose_named_configs(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pool"
    path.write_text("version: v1\nflags: {configLabel: x.io/y}\n")
    with pytest.raises(ConfigError, match=r"flags.configLabel: unknown key"):
        main.load_config(["--config-dir", str(tmp_path), "--node-name", "n"], {}, named="pool")


# --- the label read through lightkube from an API server -----------------------------------------


def test_the_label_is_read_through_the_api_and_an_unknown_name_is_an_error(
    tmp_path: pathlib.Path, fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    directory = config_map_volume(tmp_path / "configs", {"whole": WHOLE, "shared": SHARED})
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    named = named_for(directory)

    async def scenario() -> list[str]:
        api = node_annotation.LightkubeNodeApi(kubeconfig)
        try:
            chosen = []
            for value in (None, "shared", "nope"):
                label(fake, value)
                choice = await named.read(api)
                assert choice is not None
                chosen.append(choice.name)
            return chosen
        finally:
            await api.close()

    caplog.set_level(logging.INFO)
    assert asyncio.run(scenario()) == ["whole", "shared", "whole"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert f"{LABEL}=nope" in errors[0] and "available: shared, whole" in errors[0]
    assert ("GET", "/api/v1/nodes/node-a", 200) in fake.requests


def test_an_unreadable_label_keeps_the_choice_and_warns_once(
    tmp_path: pathlib.Path, fake: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    directory = config_map_volume(tmp_path / "configs", {"whole": WHOLE})
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    named = named_for(directory, node_name="node-gone")

    async def scenario() -> list[object]:
        api = node_annotation.LightkubeNodeApi(kubeconfig)
        try:
            return [await named.read(api), await named.read(api)]
        finally:
            await api.close()

    assert asyncio.run(scenario()) == [None, None]
    assert named.wanted == ""
    warnings = [r for r in caplog.records if "cannot read node node-gone" in r.getMessage()]
    assert len(warnings) == 1


def test_the_running_name_is_a_metric() -> None:
    named = named_for("/x")
    registry = CollectorRegistry()
    named_configs.export(registry, named)
    named.applied_now("whole")
    named.applied_now("shared")
    text = generate_latest(registry).decode()
    assert 'enflame_gcu_plugin_config_info{name="shared"} 1.0' in text
    assert 'name="whole"' not in text


# --- the plugin process, its stub kubelet and an API server ---------------------------------------


async def wait_log(plugin: plugin_process.PluginProcess, text: str, count: int = 1) -> None:
    for _ in range(600):
        if plugin.log_text().count(text) >= count:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{text!r} never logged {count} time(s):\n{plugin.log_text()}")


def test_the_label_chooses_at_start_and_a_change_reloads_make_before_break(
    tmp_path: pathlib.Path, fake: FakeApiServer
) -> None:
    directory = config_map_volume(
        tmp_path / "configs", {"whole": WHOLE, "shared": SHARED, "broken": BROKEN}
    )
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    label(fake, "shared")
    args = [
        "--config-dir", directory, "--config-default", "whole", "--node-name", "node-a",
        "--kubeconfig", kubeconfig, "--config-label-interval", "0.2",
    ]  # fmt: skip

    async def scenario() -> None:
        async with plugin_process.running_node("vendor-8card", args) as node:
            kubelet, plugin = node.kubelet, node.plugin
            # Chosen before the first registration: no whole-card-only phase.
            await kubelet.wait_for(
                lambda k: k.capacity("enflame.com/shared-gcu") == 4 and k.capacity() == 6,
                15,
                "shared slices at start",
            )
            assert sorted(r.resource_name for r in kubelet.registrations) == [
                "enflame.com/gcu",
                "enflame.com/shared-gcu",
            ]  # chosen before the first registration: no whole-card-only phase
            assert "running named config 'shared'" in plugin.log_text()

            label(fake, None)  # no label: the default, whole cards only
            await kubelet.wait_for(
                lambda k: len(k.allocatable()) == 8 and not k.allocatable("enflame.com/shared-gcu"),
                15,
                "whole cards after the label went",
            )
            await wait_log(plugin, f"node label {LABEL}: config reloaded")
            # Only the resource that went stopped; whole cards kept their stream.
            assert {end.resource_name for end in kubelet.stream_ends} == {"enflame.com/shared-gcu"}
            assert [r.resource_name for r in kubelet.registrations].count("enflame.com/gcu") == 1

            label(fake, "broken")  # refused: the running config stays
            await wait_log(plugin, f"node label {LABEL}: new config refused")
            assert "slicesPerCrad: unknown key" in plugin.log_text()
            await asyncio.sleep(0.6)  # a refused choice is not retried every interval
            assert plugin.log_text().count("new config refused") == 1
            assert kubelet.capacity() == 8

            label(fake, "shraed")  # a typo: an error naming it, then the default (running)
            await wait_log(plugin, "'shraed', which is not a config here")
            assert "available: broken, shared, whole" in plugin.log_text()

            label(fake, "shared")
            await kubelet.wait_for(
                lambda k: (
                    len(k.allocatable("enflame.com/shared-gcu")) == 4 and len(k.allocatable()) == 6
                ),
                15,
                "shared slices again",
            )
            assert all(p.stream_open for p in kubelet.plugins.values())
            assert plugin.process is not None and plugin.process.returncode is None

    asyncio.run(scenario())


def test_an_invalid_named_config_at_start_exits_1_naming_it(
    tmp_path: pathlib.Path, fake: FakeApiServer
) -> None:
    directory = config_map_volume(tmp_path / "configs", {"whole": WHOLE, "broken": BROKEN})
    kubeconfig = fake.kubeconfig(str(tmp_path / "kubeconfig"))
    label(fake, "broken")
    args = ["--config-dir", directory, "--node-name", "node-a", "--kubeconfig", kubeconfig]

    async def scenario() -> None:
        _work, root, plugins = plugin_process.make_node("vendor-8card")
        plugin = plugin_process.PluginProcess(plugins, root, args)
        await plugin.start()
        try:
            assert await plugin.wait(20) == 1
        finally:
            await plugin.stop()
        text = plugin.log_text()
        assert "named config 'broken' refused" in text
        assert f"{directory}/broken: sharing.slicesPerCrad: unknown key" in text

    asyncio.run(scenario())
