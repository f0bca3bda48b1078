"""The plugin's node-state annotation: written when it changes, never while holders are unknown."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from enflame_gcu import devices, health, holders, node_state, sharing
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.device_plugin import node_annotation, resources
from enflame_gcu.errors import ConfigError


class RecordingApi:
    """A NodeApi that keeps every patch; ``fail`` makes the next patches raise."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, str | None]]] = []
        self.fail = 0

    async def patch_annotations(self, node: str, annotations: node_annotation.Annotations) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("connection refused")
        self.patches.append((node, dict(annotations)))


def held(pod: str, *ids: str, resource: str = "enflame.com/gcu") -> holders.Holding:
    return holders.Holding("ml", pod, "main", resource, ids)


def setup(
    root: str, config: plugin_config.PluginConfig
) -> tuple[RecordingApi, node_annotation.NodeAnnotator]:
    inventory = devices.discover(root)
    api = RecordingApi()
    annotator = node_annotation.NodeAnnotator(api, "node-a", retry=0.05)
    _, assignment = resources.build(inventory, config)
    monitor = health.HealthMonitor(
        config.host_root, inventory.cards, driver_version=inventory.driver_version
    )
    annotator.set_node(inventory, monitor.report, assignment, config)
    return api, annotator


def test_written_once_per_change_and_not_before_holders_are_known(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    api, annotator = setup(vendor_node, config)

    async def scenario() -> None:
        assert await annotator.write_once()
        assert api.patches == []  # holders unknown: nothing written
        annotator.set_holdings([held("train", "gcu0", "gcu1")])
        await annotator.write_once()
        await annotator.write_once()  # same state: no second write
        annotator.set_holdings(None)  # PodResources failing: keep what was written
        await annotator.write_once()
        annotator.set_holdings([])
        await annotator.write_once()

    asyncio.run(scenario())
    assert [node for node, _ in api.patches] == ["node-a", "node-a"]
    first = node_state.parse(api.patches[0][1][node_state.ANNOTATION] or "")
    assert "gcu0" not in first.free and first.pods == {"ml/train"}
    assert api.patches[0][1][node_state.SHARED_CAPACITY_ANNOTATION] is None
    assert len(node_state.parse(api.patches[1][1][node_state.ANNOTATION] or "").free) == 8


def test_shared_cards_write_the_gcushare_capacity(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node, resources=("gcu", "shared-gcu"), shared_cards=("gcu7",)
    )
    api, annotator = setup(vendor_node, config)
    annotator.set_holdings([held("s", "gcu7-slice0", resource="enflame.com/shared-gcu")])
    asyncio.run(annotator.write_once())
    written = api.patches[0][1]
    assert json.loads(written[node_state.SHARED_CAPACITY_ANNOTATION] or "") == {"7": 5}
    assert [c.name for c in node_state.parse(written[node_state.ANNOTATION] or "").cards] == [
        f"gcu{i}" for i in range(7)
    ]


def test_a_failed_write_is_retried_and_logged_once(
    vendor_node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = plugin_config.PluginConfig(host_root=vendor_node)
    api, annotator = setup(vendor_node, config)
    api.fail = 3
    annotator.set_holdings([])

    async def scenario() -> None:
        task = asyncio.ensure_future(annotator.run())
        for _ in range(200):
            if api.patches:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert len(api.patches) == 1
    warnings = [r for r in caplog.records if "cannot annotate node node-a" in r.getMessage()]
    assert len(warnings) == 1
    assert any("annotated again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("layer", "says"),
    [
        ({"node_state": "true"}, "needs node-name"),
        ({"node_state": "true", "node_name": "n1", "pod_resources_interval": "0"}, "above 0"),
        ({"node_name": "bad name!"}, "not a node name"),
    ],
)
def test_node_state_settings_are_checked(layer: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        plugin_config.resolve([layer])


def test_an_unchanged_state_is_refreshed_with_a_new_observed_time(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    inventory = devices.discover(vendor_node)
    api = RecordingApi()
    now = [1000.0]
    annotator = node_annotation.NodeAnnotator(api, "node-a", refresh=60, clock=lambda: now[0])
    _, assignment = resources.build(inventory, config)
    monitor = health.HealthMonitor(
        config.host_root, inventory.cards, driver_version=inventory.driver_version
    )
    annotator.set_node(inventory, monitor.report, assignment, config)

    async def scenario() -> None:
        annotator.set_holdings([])
        await annotator.write_once()
        now[0] += 5
        annotator.set_holdings([])  # the next PodResources read: same holders
        await annotator.write_once()  # nothing changed, refresh not due: no write
        now[0] += 60
        annotator.set_holdings([])
        await annotator.write_once()  # due: the same state with the newer time

    asyncio.run(scenario())
    times = [node_state.parse(p[node_state.ANNOTATION] or "").observed for _, p in api.patches]
    assert times == [1000.0, 1065.0]


def test_a_clean_shutdown_removes_the_state(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    api, annotator = setup(vendor_node, config)
    annotator.set_holdings([])

    async def scenario() -> None:
        await annotator.write_once()
        await annotator.clear()

    asyncio.run(scenario())
    assert api.patches[-1] == (
        "node-a",
        {node_state.ANNOTATION: None, node_state.SHARED_CAPACITY_ANNOTATION: None},
    )


class SilentApi(RecordingApi):
    """An API server that accepts the connection and never answers a patch."""

    async def patch_annotations(self, node: str, annotations: node_annotation.Annotations) -> None:
        if self.patches:
            await asyncio.Event().wait()
        await super().patch_annotations(node, annotations)


def test_a_shutdown_does_not_wait_for_an_api_server_that_never_answers(
    vendor_node: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = plugin_config.PluginConfig(host_root=vendor_node)
    _, annotator = setup(vendor_node, config)
    api = annotator.api = SilentApi()
    annotator.set_holdings([])

    async def scenario() -> None:
        await annotator.write_once()
        await asyncio.wait_for(annotator.clear(timeout=0.2), 10)

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert len(api.patches) == 1  # the state written; its removal never answered
    assert "no answer in 0.2 s" in caplog.text


def test_the_published_state_names_the_plugins_slice_policy(vendor_node: str) -> None:
    config = plugin_config.PluginConfig(
        host_root=vendor_node,
        resources=("gcu", "shared-gcu"),
        shared_cards=("gcu7",),
        sharing=sharing.SharingSettings(policy="distributed", max_slices_per_container=2),
    )
    api, annotator = setup(vendor_node, config)
    annotator.set_holdings([])
    asyncio.run(annotator.write_once())
    state = node_state.parse(api.patches[0][1][node_state.ANNOTATION] or "")
    assert (state.policy, state.max_per_container) == ("distributed", 2)
    assert state.observed > 0
