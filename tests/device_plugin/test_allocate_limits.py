"""Allocate and GetPreferredAllocation input limits: huge, long or odd ID lists get a bounded
INVALID_ARGUMENT quickly, and the plugin's log line about them is bounded too."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import pytest

from enflame_gcu._proto import api_pb2
from enflame_gcu.device_plugin import config
from enflame_gcu.simulation.testing import in_process

from ..conftest import MakeNode

# Generous: the old quadratic check took minutes for these sizes; the linear one milliseconds.
DEADLINE = 10.0
BOUND = 1000  # characters of an error message or a log line


@pytest.fixture
def plugin(make_node: MakeNode) -> Iterator[in_process.ThreadedPlugin]:
    """The whole-card resource of the vendor 8-card machine, served in this process."""
    plugins = in_process.short_plugin_dir()
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=make_node("vendor-8card"))
    try:
        with in_process.ThreadedPlugin(cfg) as served:
            yield served
    finally:
        shutil.rmtree(plugins)


def allocate(plugin: in_process.ThreadedPlugin, *containers: Sequence[str]) -> Any:
    """Allocate, returning the response or the AioRpcError."""
    request = api_pb2.AllocateRequest()
    for ids in containers:
        request.container_requests.add(devices_ids=list(ids))

    async def call() -> Any:
        try:
            return await plugin.stub.Allocate(request, timeout=DEADLINE)
        except grpc.aio.AioRpcError as exc:
            return exc

    return plugin.run(call)


def refused(answer: Any) -> str:
    """The details of an INVALID_ARGUMENT answer (fails on anything else)."""
    assert isinstance(answer, grpc.aio.AioRpcError), answer
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer
    details = answer.details() or ""
    assert len(details) < BOUND, len(details)
    return details


def rejected_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's log lines about rejected requests."""
    return [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]


def test_thousands_of_ids_name_the_first_few_and_the_count(
    plugin: in_process.ThreadedPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ids = [f"gcu{i}" for i in range(5000)]
    details = refused(allocate(plugin, ids))
    assert "5000 device IDs requested for a resource of 8 device(s)" in details
    assert "gcu0, gcu1, gcu2, gcu3, gcu4, ... (5000 in all)" in details
    [line] = rejected_lines(caplog)
    assert len(line) < BOUND


def test_many_repeats_are_refused_in_linear_time(plugin: in_process.ThreadedPlugin) -> None:
    details = refused(allocate(plugin, ["gcu0"] * 8))
    assert "repeated device(s) gcu0" in details
    details = refused(allocate(plugin, ["gcu0", "gcu1"] * 100_000))
    assert "(200000 in all)" in details


def test_a_very_long_id_is_cut_in_the_message(
    plugin: in_process.ThreadedPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    details = refused(allocate(plugin, ["g" * 1_000_000]))
    assert (
        "unknown device(s) 'gggggggggggggggggggggggggggggggggggggggg'... (1000000 characters)"
        in (details)
    )
    [line] = rejected_lines(caplog)
    assert len(line) < BOUND


def test_control_characters_in_ids_are_escaped(
    plugin: in_process.ThreadedPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    details = refused(allocate(plugin, ["gcu0\nINFO forged line", "gcu1"]))
    assert "unknown device(s) 'gcu0\\nINFO forged line'" in details
    [line] = rejected_lines(caplog)
    assert "\n" not in line


def test_more_containers_than_devices_are_refused(plugin: in_process.ThreadedPlugin) -> None:
    details = refused(allocate(plugin, *([f"gcu{i % 8}"] for i in range(10_000))))
    assert "10000 container requests for a resource of 8 device(s)" in details


def test_the_valid_request_still_works(plugin: in_process.ThreadedPlugin) -> None:
    answer = allocate(plugin, ["gcu1", "gcu0"])
    assert dict(answer.container_responses[0].envs) == {"ENFLAME_VISIBLE_DEVICES": "0,1"}


def test_preferred_allocation_with_a_huge_available_list_is_refused_quickly(
    plugin: in_process.ThreadedPlugin,
) -> None:
    request = api_pb2.PreferredAllocationRequest()
    request.container_requests.add(
        available_deviceIDs=["gcu0", "gcu1"] * 100_000,
        must_include_deviceIDs=["x" * 100_000],
        allocation_size=2,
    )

    async def call() -> Any:
        try:
            return await plugin.stub.GetPreferredAllocation(request, timeout=DEADLINE)
        except grpc.aio.AioRpcError as exc:
            return exc

    details = refused(plugin.run(call))
    assert "200000 available device IDs for a resource of 8 device(s)" in details
