"""GetPreferredAllocation explains itself at debug: what it was offered, what it chose, why."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator, Sequence

import pytest

from enflame_gcu._proto import api_pb2
from enflame_gcu.device_plugin import config
from enflame_gcu.simulation.testing import in_process

from ..conftest import MakeNode


@pytest.fixture(params=["vendor-8card"])
def plugin(
    make_node: MakeNode, request: pytest.FixtureRequest
) -> Iterator[in_process.ThreadedPlugin]:
    """The whole-card resource of a built-in machine (the vendor's by default), in-process."""
    plugins = in_process.short_plugin_dir()
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=make_node(request.param))
    try:
        with in_process.ThreadedPlugin(cfg) as served:
            yield served
    finally:
        shutil.rmtree(plugins)


def prefer(
    plugin: in_process.ThreadedPlugin, available: Sequence[str], required: Sequence[str], size: int
) -> list[str]:
    """Ask for a preference; the chosen IDs."""
    request = api_pb2.PreferredAllocationRequest()
    request.container_requests.add(
        available_deviceIDs=list(available),
        must_include_deviceIDs=list(required),
        allocation_size=size,
    )
    answer = plugin.run(lambda: plugin.stub.GetPreferredAllocation(request, timeout=10))
    return list(answer.container_responses[0].deviceIDs)


def decisions(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The plugin's debug lines about preferred allocations."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and r.getMessage().startswith("GetPreferredAllocation")
    ]


ALL = [f"gcu{i}" for i in range(8)]
SIXTEEN = [f"gcu{i}" for i in range(16)]


@pytest.mark.parametrize(
    ("plugin", "case"),
    [
        ("vendor-8card", (ALL, [], 2, "one PCIe switch (pci0000:0c/0000:0f:00.0)")),
        ("vendor-8card", (ALL, [], 4, "one root port (pci0000:0c/0000:0c:02.0) across 3 switches")),
        ("vendor-8card", (ALL, ["gcu0", "gcu4"], 2, "2 NUMA nodes (numa0, numa1)")),
        ("vendor-8card", (["gcu2", "gcu3"], [], 1, "one card")),
        ("2socket-16card", (SIXTEEN, [], 6, "one NUMA node (numa0) across 2 root ports")),
    ],
    indirect=["plugin"],
)
def test_each_decision_is_logged_with_its_inputs_and_reason(
    plugin: in_process.ThreadedPlugin,
    caplog: pytest.LogCaptureFixture,
    case: tuple[list[str], list[str], int, str],
) -> None:
    available, required, size, why = case
    caplog.set_level(logging.DEBUG, logger="enflame_gcu.device_plugin")
    chosen = prefer(plugin, available, required, size)
    [line] = decisions(caplog)
    shown = ", ".join(available[:16]) + (f", ... ({len(available)} in all)" * (len(available) > 16))
    assert f"available {shown};" in line
    assert f"must-include {', '.join(required) or 'none'};" in line
    assert f"size {size}: chose {', '.join(chosen)} by policy topology: {why}" in line
    assert line.endswith(why), line


def test_nothing_is_logged_above_debug(
    plugin: in_process.ThreadedPlugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="enflame_gcu.device_plugin")
    prefer(plugin, ALL, [], 2)
    assert decisions(caplog) == []
