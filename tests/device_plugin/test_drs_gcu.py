"""``enflame.com/drs-gcu`` through the device plugin: an instance per container, made at
Allocate with the simulated efsmi, destroyed when PodResources no longer lists the container,
orphans destroyed at start (the real plugin process and the stub kubelet)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from enflame_gcu import efsmi
from enflame_gcu.simulation import efsmi_sim
from enflame_gcu.simulation.testing import plugin_process

DRS = "enflame.com/drs-gcu"


def with_efsmi(root: str) -> Sequence[str]:
    return ["--efsmi", efsmi_sim.install(root)]


def with_an_orphan(root: str) -> Sequence[str]:
    tool = efsmi_sim.install(root)
    smi = efsmi.Efsmi(tool, timeout=30)
    for index in (2, 7):
        smi.set_drs(index, True)
        smi.create_instance(index, "0")
    return ["--efsmi", tool]


ARGS = ["--resources", "drs-gcu", "--drs-release-grace", "0.5", "--pod-resources-interval", "0.2"]


async def until(condition: object, what: str, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.1)


def test_allocate_makes_an_instance_and_a_gone_container_releases_it() -> None:
    async def main() -> None:
        async with plugin_process.running_node(
            args=ARGS, pod_resources=True, setup=with_efsmi, timeout=90
        ) as node:
            assert len(node.kubelet.allocatable(DRS)) == 8 * 4  # T20 32GB: 4 slices each
            held = await node.kubelet.allocate_pod("train", {"main": 2}, resource=DRS)
            envs = dict(held["main"].response.envs)
            (instance,) = efsmi_sim.instances(node.root)
            card = held["main"].device_ids[0].split("-")[0]
            assert {i.split("-")[0] for i in held["main"].device_ids} == {card}
            assert (instance["index"], instance["profile"]) == (int(card[3:]), "2g.16gb")
            assert envs["TOPS_VISIBLE_DEVICES"] == f"DRS-{instance['uuid']}"
            assert envs["ENFLAME_VISIBLE_DEVICES"] == card[3:]
            await asyncio.sleep(1.0)  # past the grace: still held, still there
            assert len(efsmi_sim.instances(node.root)) == 1
            node.kubelet.delete_pod("train")
            await until(lambda: efsmi_sim.instances(node.root) == [], "the instance is gone")
            record = os.path.join(node.plugin_dir, "enflame-drs-instances.json")

            def forgotten() -> bool:
                with open(record, encoding="utf-8") as handle:
                    return '"instances": []' in handle.read()

            await until(forgotten, "the record forgets it")
            assert "destroyed DRS instance" in node.plugin.log_text()

    asyncio.run(main())


def test_a_size_no_profile_has_is_refused_by_name() -> None:
    async def main() -> None:
        async with plugin_process.running_node(
            args=ARGS, pod_resources=True, setup=with_efsmi, timeout=90
        ) as node:
            try:
                await node.kubelet.allocate_pod("odd", {"main": 3}, resource=DRS)
            except Exception as exc:  # the stub's AdmissionError carries the plugin's message
                assert "no DRS profile of 3 slice(s)" in str(exc)
            else:
                raise AssertionError("a 3-slice partition was granted on a 4-slice card")
            assert efsmi_sim.instances(node.root) == []

    asyncio.run(main())


def test_orphans_are_destroyed_at_start() -> None:
    async def main() -> None:
        async with plugin_process.running_node(
            args=ARGS, pod_resources=True, setup=with_an_orphan, timeout=90
        ) as node:
            assert efsmi_sim.instances(node.root) == []
            assert "destroyed orphan DRS instance" in node.plugin.log_text()

    asyncio.run(main())
