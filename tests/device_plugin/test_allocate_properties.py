"""Property: Allocate on any list of device IDs answers validly or with INVALID_ARGUMENT.

Random container requests (known IDs, unknown and odd strings, repeats, empty lists) go to a
plugin served in this process over its real gRPC socket. Whatever comes in, the answer is either
a response that grants exactly what each container asked for (indexes in ascending order), or
INVALID_ARGUMENT with a bounded message; never another status code. A request made only of
distinct known IDs is always granted. Bounded and derandomized, so CI runs the same examples.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import grpc
import hypothesis
import pytest
from hypothesis import strategies as st

from enflame_gcu._proto import api_pb2
from enflame_gcu.device_plugin import config
from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing import in_process

CARDS = 8  # the vendor 8-card machine
KNOWN = [f"gcu{i}" for i in range(CARDS)]
ODD = st.sampled_from(
    ["gcu8", "gcu01", "gcu\u0661", "GCU0", "gcu0\n", "", "gcu-1", "vgcu0", "0", "gcu²"]
)
ID = st.one_of(st.sampled_from(KNOWN), ODD, st.text(max_size=12))
MIXED = st.lists(st.lists(ID, max_size=10), min_size=1, max_size=4)
DISTINCT_KNOWN = st.lists(
    st.lists(st.sampled_from(KNOWN), min_size=1, max_size=CARDS, unique=True),
    min_size=1,
    max_size=4,
)
REQUEST = st.one_of(MIXED, DISTINCT_KNOWN)
SETTINGS = hypothesis.settings(max_examples=150, deadline=None, derandomize=True, database=None)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[in_process.ThreadedPlugin]:
    """One plugin for every example (Allocate keeps no state between calls)."""
    root = str(tmp_path_factory.mktemp("node"))
    simulate.create(root, topofile.load("vendor-8card"))
    plugins = in_process.short_plugin_dir()
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)
    try:
        with in_process.ThreadedPlugin(cfg) as served:
            yield served
    finally:
        shutil.rmtree(plugins)


def allocate(plugin: in_process.ThreadedPlugin, containers: list[list[str]]) -> Any:
    """Allocate over gRPC, returning the response or the AioRpcError."""
    request = api_pb2.AllocateRequest()
    for ids in containers:
        request.container_requests.add(devices_ids=ids)

    async def call() -> Any:
        try:
            return await plugin.stub.Allocate(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc

    return plugin.run(call)


def plainly_valid(containers: list[list[str]]) -> bool:
    """Every container asks for distinct known cards, at least one."""
    return all(ids and set(ids) <= set(KNOWN) and len(set(ids)) == len(ids) for ids in containers)


@SETTINGS
@hypothesis.given(containers=REQUEST)
def test_allocate_answers_validly_or_with_invalid_argument(
    plugin: in_process.ThreadedPlugin, containers: list[list[str]]
) -> None:
    answer = allocate(plugin, containers)
    if isinstance(answer, grpc.aio.AioRpcError):
        assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, (answer.code(), containers)
        assert len(answer.details() or "") < 1000
        assert not plainly_valid(containers), answer.details()
        return
    assert len(answer.container_responses) == len(containers)
    for ids, response in zip(containers, answer.container_responses, strict=True):
        assert set(ids) <= set(KNOWN), ids
        wanted = ",".join(str(i) for i in sorted({int(name[3:]) for name in ids}))
        assert response.envs["ENFLAME_VISIBLE_DEVICES"] == wanted
