"""A node moved back from DRA to the device plugin: cards DRA claims still hold (the kubelet's
PodResources ``dynamic_resources``) are advertised Unhealthy, so the kubelet neither chooses
nor allocates them, until the claim is released."""

from __future__ import annotations

import asyncio

import pytest

from enflame_gcu.simulation.testing import kubelet_stub, plugin_process


def test_cards_dra_claims_hold_stay_out_until_released() -> None:
    async def main() -> None:
        async with plugin_process.running_node(
            pod_resources=True, args=["--pod-resources-interval", "0.2"]
        ) as node:
            kubelet = node.kubelet
            kubelet.add_dra_claim(
                "dra-pod", "train", ("ml", "pair"), [("gcu.enflame.com", "gcu-3")], "ml"
            )
            kubelet.add_dra_claim(
                "dra-pod", "train", ("ml", "part"), [("gcu.enflame.com", "gcu-5-1g-8gb-0")], "ml"
            )
            await kubelet.wait_for(
                lambda k: (
                    k.devices().get("gcu3") == "Unhealthy"
                    and k.devices().get("gcu5") == "Unhealthy"
                ),
                10,
                "gcu3 and gcu5 advertised Unhealthy",
            )
            assert sorted(kubelet.free()) == [f"gcu{i}" for i in (0, 1, 2, 4, 6, 7)]
            with pytest.raises(kubelet_stub.AdmissionError):
                await kubelet.allocate_pod("too-big", {"main": 7})
            kubelet.dra_claims.clear()  # the DRA pod ended
            await kubelet.wait_for(
                lambda k: all(h == "Healthy" for h in k.devices().values()),
                10,
                "every card Healthy again",
            )
            await kubelet.allocate_pod("all", {"main": 8})

    asyncio.run(asyncio.wait_for(main(), 90))
