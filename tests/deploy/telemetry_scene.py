"""A running plugin whose /metrics has data for every dashboard panel and guide query: pods on
whole cards and on a vGCU, an unhealthy card, a card left out of telemetry, ECC errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.request
from collections.abc import AsyncIterator

from enflame_gcu.simulation import efmlsim, simulate
from enflame_gcu.simulation.testing import plugin_process

TOPOLOGY = os.path.join(os.path.dirname(__file__), "telemetry-mixed.topo")
VGCU = "enflame.com/vgcu"


def _ready(text: str) -> bool:
    wanted = (
        'pod_name="pod2"',
        'pod_name="vpod"',
        "enflame_gcu_card_unhealthy{",
        'reason="EFML_ERROR_FAIL"',
        "enflame_gcu_ecc_double_bit_errors_total{",
    )
    return all(part in text for part in wanted) and 'reason="EFML_ERROR_FAIL"} 1.0' in text


@contextlib.asynccontextmanager
async def scene(port: int, *extra: str) -> AsyncIterator[plugin_process.RunningNode]:
    """The plugin on ``port`` with the scene set; yields once /metrics shows all of it."""
    args = [
        f"--metrics-port={port}",
        "--resources=gcu,vgcu",
        "--pod-resources-interval=0.2",
        "--health-interval=0.5",
        "--telemetry-interval=0.2",
        *extra,
    ]
    async with plugin_process.running_node(
        TOPOLOGY, args=args, pod_resources=True, efml=True
    ) as node:
        await node.kubelet.wait_for(
            lambda k: len(k.free(VGCU)) == 2 and len(k.free("enflame.com/gcu")) == 4,
            30,
            "the cards and vGCUs listed",
        )
        await node.kubelet.allocate_pod("pod1", {"main": 2})
        await node.kubelet.allocate_pod("pod2", {"main": 1}, namespace="ml")
        await node.kubelet.allocate_pod("vpod", {"main": 1}, resource=VGCU, namespace="ml")
        for index in range(5):
            efmlsim.set_values(node.root, f"card{index}", {"usage": str(10 * index + 5)})
        efmlsim.set_values(node.root, "card0", {"ecc_dbe": "3", "asic_temp": "90"})
        await asyncio.sleep(0.5)  # one good pass first, so the failing card's address is known
        efmlsim.set_values(node.root, "card3", {"fail": "254"})
        simulate.unplug(node.root, 2)
        url = f"http://127.0.0.1:{port}/metrics"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            with urllib.request.urlopen(url, timeout=5) as answer:
                text = answer.read().decode()
            if _ready(text):
                break
            if loop.time() > deadline:
                raise AssertionError(f"the scene never showed up in /metrics:\n{text[-3000:]}")
            await asyncio.sleep(0.2)
        yield node
