"""``enflame.com/drs-gcu`` through the device plugin: an instance per container, made at
Allocate with the simulated efsmi, destroyed when PodResources no longer lists the container,
orphans destroyed at start (the real plugin process and the stub kubelet)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from enflame_gcu import devices, efsmi
from enflame_gcu.device_plugin import drs_instances, main, resources
from enflame_gcu.errors import ConfigError
from enflame_gcu.simulation import efsmi_sim, simulate, topofile
from enflame_gcu.simulation.testing import plugin_process

DRS = "enflame.com/drs-gcu"


def with_efsmi(root: str) -> Sequence[str]:
    # The chart's hostPath mount of /var/lib/enflame-gcu (DirectoryOrCreate) makes it.
    os.makedirs(os.path.dirname(record_path(root)), exist_ok=True)
    return ["--efsmi", efsmi_sim.install(root)]


def with_an_orphan(root: str) -> Sequence[str]:
    tool = with_efsmi(root)[1]
    smi = efsmi.Efsmi(tool, timeout=30)
    for index in (2, 7):
        smi.set_drs(index, True)
        smi.create_instance(index, "0")
    return ["--efsmi", tool]


def record_path(root: str) -> str:
    return os.path.join(root, drs_instances.STATE_DIR.lstrip("/"), drs_instances.RECORD_FILE)


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
            record = record_path(node.root)

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


def test_instances_of_another_owner_are_left_alone_at_start() -> None:
    """Instances the record knows nothing of may be the DRA driver's (a node moved from DRA to
    drs-gcu) with containers running on them: the start leaves them alone (it used to destroy
    them)."""

    async def main() -> None:
        async with plugin_process.running_node(
            args=ARGS, pod_resources=True, setup=with_an_orphan, timeout=90
        ) as node:
            assert sorted(i["index"] for i in efsmi_sim.instances(node.root)) == [2, 7]
            assert "not on this plugin's record: left alone" in node.plugin.log_text()

    asyncio.run(main())


def test_an_instance_of_a_create_that_never_got_recorded_is_destroyed_at_start(
    tmp_path: Path,
) -> None:
    """The plugin died between efsmi's create and its record: the card's UUIDs from before the
    create are on record as pending, so the start destroys what appeared since, and only that."""
    root = os.path.join(str(tmp_path), "node")
    simulate.create(root, topofile.load("vendor-8card"), char_devices=False)
    tool = efsmi.Efsmi(efsmi_sim.install(root), timeout=30)
    record = drs_instances.DrsInstances(str(tmp_path / "state"), tool)
    bdf = {card.minor: card.bdf for card in devices.discover(root).cards}
    assert record.learn([("gcu2", bdf[2])]) == {}
    theirs = tool.create_instance(2, "0")  # another owner's, before the create
    record._save([], {2: {theirs.uuid}})  # the state a kill between create and record leaves
    ours = tool.create_instance(2, "0")  # the create whose record never came
    actions = record.reconcile()
    assert actions == [
        f"destroyed orphan DRS instance {ours.uuid} on gcu2 (created by an Allocate that did "
        "not finish)"
    ]
    assert [i["uuid"] for i in efsmi_sim.instances(root)] == [theirs.uuid]
    assert record.reconcile() == []  # the pending mark is gone with it


def test_a_kubelet_that_wipes_its_directory_keeps_every_instance() -> None:
    """A 1.20 kubelet deletes the files of its device-plugin directory when it starts; the
    record is not there, so the plugin's next start keeps the instances containers use."""

    async def main() -> None:
        async with plugin_process.running_node(
            args=ARGS, pod_resources=True, setup=with_efsmi, timeout=90
        ) as node:
            await node.kubelet.allocate_pod("train", {"main": 2}, resource=DRS)
            (made,) = efsmi_sim.instances(node.root)
            await node.kubelet.restart(every_file=True)
            await node.plugin.stop()
            await node.plugin.start()
            # The start-up check of the instances runs before the plugin serves again.
            await until(
                lambda: node.plugin.log_text().count("serving drs-gcu=") == 2, "serving again", 90
            )
            await asyncio.sleep(1.5)  # past the release grace and a few PodResources polls
            assert efsmi_sim.instances(node.root) == [made], node.plugin.log_text()
            assert "destroyed orphan" not in node.plugin.log_text()

    asyncio.run(main())


def test_the_record_of_an_older_version_is_moved_out_of_the_kubelet_directory(
    tmp_path: Path,
) -> None:
    old_dir, state = tmp_path / "device-plugins", tmp_path / "state"
    old_dir.mkdir()
    entry = {"card": "gcu1", "index": 1, "id": "3", "uuid": "u-1", "ids": ["a"], "created": 1.0}
    (old_dir / drs_instances.OLD_RECORD_FILE).write_text(
        json.dumps({"version": 1, "instances": [entry]})
    )
    tool = efsmi.Efsmi("/nonexistent/efsmi")
    record = drs_instances.DrsInstances(str(state), tool, old_dir=str(old_dir))
    (held,) = record.load()
    assert (held.card, held.uuid, held.ids) == ("gcu1", "u-1", ("a",))
    assert not (old_dir / drs_instances.OLD_RECORD_FILE).exists()
    assert [h.uuid for h in drs_instances.DrsInstances(str(state), tool).load()] == ["u-1"]


def test_a_record_that_is_a_fifo_or_nests_deeply_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    tool = efsmi.Efsmi("/nonexistent/efsmi")
    record = drs_instances.DrsInstances(str(tmp_path), tool)
    os.mkfifo(record.path)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            record.load()
        except BaseException as exc:  # what the test looks at
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive():  # the old reader blocks in open(): let it go before failing
        with open(record.path, "w", encoding="utf-8") as writer:
            writer.write("{}")
        reader.join(5)
        raise AssertionError("reading a FIFO record blocked")
    assert isinstance(outcome[0], ConfigError) and "not a regular file" in str(outcome[0])
    os.unlink(record.path)
    with open(record.path, "w", encoding="utf-8") as handle:
        handle.write("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nests"):
        record.load()


def test_drs_gcu_partitions_the_cards_drs_selects_and_serves_the_others_whole(
    tmp_path: Path,
) -> None:
    """drs-gcu took every card of the node; it now selects cards as the DRA driver's --drs
    does (cards, models, families), and a bad selection is refused by name."""
    root = os.path.join(str(tmp_path), "node")
    simulate.create(root, topofile.load("vendor-8card"), char_devices=False)
    inventory = devices.discover(root)
    chosen = main.load_config(["--resources", "gcu,drs-gcu", "--drs", "gcu1, gcu6"], {})
    placed = resources.assign(inventory, chosen)
    assert [c.name for c in placed.drs] == ["gcu1", "gcu6"]
    assert [c.name for c in placed.whole] == [f"gcu{n}" for n in (0, 2, 3, 4, 5, 7)]
    family = main.load_config(["--resources", "drs-gcu"], {"ENFLAME_DRS": "T"})
    assert len(resources.assign(inventory, family).drs) == 8  # the node's T20 cards
    assert len(resources.assign(inventory, main.load_config(["--resources", "drs-gcu"], {})).drs)
    with pytest.raises(ConfigError, match="'gcu-1' is not 'all', a card"):
        main.load_config(["--drs", "gcu-1"], {})
