"""enflame.com/shared-gcu through the plugin process and the stub kubelet on the 8-card machine.

The exhaustive policy table is tests/test_sharing.py; here a short table proves the plugin uses
the configured policy, plus IDs, the cap, the env, whole and shared cards side by side, health.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile
from collections.abc import Awaitable, Callable

import grpc
import pytest

from enflame_gcu import naming, sharing
from enflame_gcu._proto import api_pb2
from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import plugin_process

SHARED = "enflame.com/shared-gcu"
GCU = "enflame.com/gcu"
Scenario = Callable[[plugin_process.RunningNode], Awaitable[None]]


def run(config_text: str, scenario: Scenario, args: tuple[str, ...] = ()) -> None:
    """The vendor 8-card node, a plugin process reading ``config_text``, then ``scenario``
    once every resource the config serves has listed its devices."""
    served = [SHARED] + ([GCU] if "resources: [gcu, shared-gcu]" in config_text else [])
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "config.yaml")
        pathlib.Path(path).write_text(config_text)

        async def main() -> None:
            async with plugin_process.running_node(
                "vendor-8card", ["--config-file", path, *args]
            ) as node:
                await node.kubelet.wait_for(
                    lambda k: all(r in k.plugins and k.plugins[r].lists_received for r in served),
                    10,
                    f"{', '.join(served)} to list their devices",
                )
                await scenario(node)

        asyncio.run(main())


MIXED = """\
version: v1
flags:
  resources: [gcu, shared-gcu]
sharing:
  cards: [gcu4, "0000:9d:00.0"]
  slicesPerCard: 4
  slicesByCard: {gcu5: 2}
  maxSlicesPerContainer: 3
"""


def test_one_process_serves_whole_and_shared_cards_on_two_sockets() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet
        assert sorted((r.resource_name, r.endpoint) for r in kubelet.registrations) == [
            (GCU, "enflame.sock"),
            (SHARED, "enflame-shared-gcu.sock"),
        ]
        assert sorted(kubelet.devices()) == ["gcu0", "gcu1", "gcu2", "gcu3", "gcu6", "gcu7"]
        assert list(kubelet.devices(SHARED)) == [
            *(sharing.slice_id("gcu4", i) for i in range(4)),
            *(sharing.slice_id("gcu5", i) for i in range(2)),
        ]
        assert set(kubelet.plugins[SHARED].numa.values()) == {(1,)}
        # Each card is in exactly one resource.
        shared_cards = {sharing.parse_slice_id(d)[0] for d in kubelet.devices(SHARED)}
        assert shared_cards.isdisjoint(kubelet.devices())
        # Both resources keep working after a kubelet restart, each re-registering on its own.
        before = len(kubelet.registrations)
        await kubelet.restart()
        await kubelet.wait_for(
            lambda k: (
                len(k.registrations) >= before + 2
                and all(p.stream_open and p.lists_received for p in k.plugins.values())
            ),
            15,
            "both resources to re-register",
        )
        pod = await kubelet.allocate_pod("whole", {"main": 2}, GCU)
        assert pod["main"].device_ids == ("gcu0", "gcu1")

    run(MIXED, scenario)


def test_allocate_gives_each_card_once_with_its_share_and_enforces_the_cap() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        stub = node.kubelet.plugins[SHARED].stub
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=["gcu5-slice1", "gcu4-slice0", "gcu4-slice3"])
        answer = (await stub.Allocate(request, timeout=5)).container_responses[0]
        assert dict(answer.envs) == {
            naming.VISIBLE_DEVICES_ENV: "4,5",
            sharing.SUB_CARD_ENV: "true",
            sharing.USABLE_PROCESSOR_ENV: "2/4,1/2",
        }
        assert [d.container_path for d in answer.devices] == [
            "/dev/gcu4",
            "/dev/gcu5",
            "/dev/gcuctl",
        ]
        assert [d.name for d in answer.cdi_devices] == ["enflame.com/gcu=4", "enflame.com/gcu=5"]

        over = api_pb2.AllocateRequest()
        over.container_requests.add(devices_ids=[f"gcu4-slice{i}" for i in range(4)])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Allocate(over, timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "4 shared-gcu slices requested but this node allows at most 3 per container" in (
            caught.value.details() or ""
        )
        whole = api_pb2.AllocateRequest()
        whole.container_requests.add(devices_ids=["gcu4"])  # a shared card is not a whole card
        with pytest.raises(grpc.aio.AioRpcError, match=r"unknown device.*gcu4"):
            await stub.Allocate(whole, timeout=5)

    run(MIXED, scenario, ("--pass-device-specs", "--device-list-strategy=envvar,cdi-cri"))


def every_card(policy: str) -> str:
    """Every card shared, two slices each, with ``policy``."""
    return (
        f"version: v1\nflags: {{resources: [shared-gcu]}}\n"
        f"sharing: {{slicesPerCard: 2, policy: {policy}}}\n"
    )


P = "gcu{}-slice{}".format
POLICY_TABLE = [
    # (policy, slices per pod, expected picks per pod) on 8 cards x 2 slices, pods in order
    ("packed", [1, 1, 3], [[P(0, 0)], [P(0, 1)], [P(1, 0), P(1, 1), P(2, 0)]]),
    ("packed", [3, 1], [[P(0, 0), P(0, 1), P(1, 0)], [P(1, 1)]]),
    ("distributed", [1, 1, 3], [[P(0, 0)], [P(1, 0)], [P(2, 0), P(3, 0), P(4, 0)]]),
    ("distributed", [9], [[P(0, 0), P(0, 1)] + [P(i, 0) for i in range(1, 8)]]),
]


@pytest.mark.parametrize(("policy", "sizes", "expected"), POLICY_TABLE)
def test_configured_policy_picks_slices(
    policy: str, sizes: list[int], expected: list[list[str]]
) -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        assert node.kubelet.capacity(SHARED) == 16
        assert node.kubelet.plugins == {SHARED: node.kubelet.plugins[SHARED]}  # no whole cards
        for index, size in enumerate(sizes):
            pod = await node.kubelet.allocate_pod(f"p{index}", {"main": size}, SHARED)
            assert list(pod["main"].device_ids) == expected[index], f"pod {index}"

    run(every_card(policy), scenario)


def test_slices_follow_their_card_unhealthy_on_unplug_and_healthy_on_replug() -> None:
    async def scenario(node: plugin_process.RunningNode) -> None:
        kubelet = node.kubelet

        def health(card: str) -> set[str]:
            return {h for d, h in kubelet.devices(SHARED).items() if d.startswith(f"{card}-")}

        simulate.unplug(node.root, 4)
        await kubelet.wait_for(
            lambda k: health("gcu4") == {"Unhealthy"}, 10, "gcu4's slices unhealthy"
        )
        assert health("gcu5") == {"Healthy"}
        assert set(kubelet.devices().values()) == {"Healthy"}  # whole cards untouched
        assert "gcu4-slice0" not in kubelet.allocatable(SHARED)
        simulate.replug(node.root, 4)
        await kubelet.wait_for(
            lambda k: health("gcu4") == {"Healthy"}, 10, "gcu4's slices healthy again"
        )

    run(MIXED, scenario)
