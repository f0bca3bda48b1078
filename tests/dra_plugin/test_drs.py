"""DRS through DRA: counter sets that validate, claims that pack as intended, Prepare/Unprepare
through the real gRPC path with the simulated efsmi creating and destroying instances."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from enflame_gcu import efsmi, resourceslices
from enflame_gcu.dra_plugin import checkpoint, claim_cdi, claims, node
from enflame_gcu.simulation import efsmi_sim, simulate
from tests.dra_plugin import allocator, harness
from tests.dra_plugin import slices_helpers as helpers

DRIVER = resourceslices.DRIVER
VERSIONS = ["1.36.0", "1.37.0"]  # partitionable devices: beta and on by default from 1.36


@contextlib.contextmanager
def drs_node(drs: str = "all") -> Iterator[tuple[harness.Node, Any]]:
    with harness.simulated_node() as where:
        tool = efsmi_sim.install(where.root)
        yield where, where.settings(drs=drs, efsmi=tool, efsmi_timeout=30)


def published(settings: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    devices = node.for_settings(settings)
    return devices.published(), devices.counter_sets()


@pytest.mark.parametrize("version", VERSIONS)
def test_drs_slices_validate_against_the_v1_schema(version: str) -> None:
    with drs_node("gcu0,gcu1") as (_, settings):
        device_list, sets = published(settings)
        slices = resourceslices.build_slices(
            harness.NODE, "uid-1", device_list, 1, counter_sets=sets
        )
    assert resourceslices.check_pool(slices) == []
    assert "sharedCounters" in slices[0]["spec"] and "devices" not in slices[0]["spec"]
    for document in slices:
        helpers.validate(document, version)
    names = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    # T20 32GB cards: 4 slices; profiles 1g.8gb x4, 2g.16gb x2, 4g.32gb x1; plus the card.
    assert [n for n in names if n.startswith("gcu-0")] == [
        "gcu-0",
        *(f"gcu-0-1g-8gb-{k}" for k in range(4)),
        "gcu-0-2g-16gb-0",
        "gcu-0-2g-16gb-1",
        "gcu-0-4g-32gb-0",
    ]
    assert "gcu-2" in names and not any(n.startswith("gcu-2-") for n in names)
    assert sets[0] == {
        "name": "gcu-0-drs",
        "counters": {"slices": {"value": "4"}, "memory": {"value": "32Gi"}},
    }


def test_many_drs_cards_split_counter_sets_and_devices_within_the_limits() -> None:
    with harness.simulated_node("2socket-16card") as where:
        settings = where.settings(drs="all", efsmi=efsmi_sim.install(where.root))
        device_list, sets = published(settings)
    slices = resourceslices.build_slices(harness.NODE, None, device_list, 1, counter_sets=sets)
    assert resourceslices.check_pool(slices) == []
    counted = [len(s["spec"].get("sharedCounters") or []) for s in slices]
    assert counted[:2] == [8, 8] and sum(counted) == 16
    assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    for document in slices:
        helpers.validate(document, VERSIONS[-1])


def test_partitions_pack_onto_a_card_and_the_whole_card_waits_for_them() -> None:
    classes = helpers.device_classes()
    one = helpers.example("one-drs-1g8gb")
    big = helpers.example("one-drs-16gb")
    whole = {"devices": {"requests": [{"name": "gcu", "exactly": {"deviceClassName": DRIVER}}]}}
    with drs_node("gcu0") as (_, settings):
        device_list, sets = published(settings)
    card0 = [d for d in device_list if d["name"] == "gcu-0" or d["name"].startswith("gcu-0-")]
    held: list[dict[str, Any]] = []

    def allocate(spec: dict[str, Any]) -> str | None:
        free = [d for d in card0 if d not in held]
        found = allocator.allocate(spec, classes, free, allocator.counters_left(sets, held))
        if found is None:
            return None
        (name,) = next(iter(found.values()))
        held.append(next(d for d in card0 if d["name"] == name))
        return name

    assert allocate(one) == "gcu-0-1g-8gb-0"
    assert allocate(big) == "gcu-0-2g-16gb-0"  # >= 16 GB: the first that fits
    assert allocate(whole) is None  # a partition is held: the card is not whole
    assert allocate(one) == "gcu-0-1g-8gb-1"  # 1 + 2 + 1 slices: the card is full
    assert allocate(one) is None and allocate(big) is None
    held.clear()
    assert allocate(whole) == "gcu-0"
    assert allocate(one) is None  # and the other way round


def instances(where: harness.Node) -> list[dict[str, Any]]:
    return efsmi_sim.instances(where.root)


def spec_env(where: harness.Node, uid: str) -> tuple[list[str], dict[str, str]]:
    with open(claim_cdi.spec_path(where.cdi, uid), encoding="utf-8") as handle:
        spec = json.load(handle)
    (device,) = spec["devices"]
    edits = device["containerEdits"]
    env = dict(item.split("=", 1) for item in edits.get("env") or [])
    return sorted(n["path"] for n in edits.get("deviceNodes") or []), env


def test_prepare_creates_the_instance_and_unprepare_destroys_it_over_grpc() -> None:
    async def main() -> None:
        with drs_node() as (where, settings):
            source = harness.FakeClaims()
            claim = ("ns", "part", "uid-part")
            other = ("ns", "part2", "uid-part2")
            whole = ("ns", "whole", "uid-whole")
            source.add(harness.claim_document(*claim, [("part", "gcu-3-2g-16gb-0")]))
            source.add(harness.claim_document(*other, [("part", "gcu-3-1g-8gb-0")]))
            source.add(harness.claim_document(*whole, [("gcu", "gcu-3")]))
            async with harness.running(where, source, settings=settings) as env:
                await env.kubelet.wait_registered(DRIVER)
                answer = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                assert answer.error == ""
                assert [d.device_name for d in answer.devices] == ["gcu-3-2g-16gb-0"]
                (made,) = instances(where)
                assert (made["index"], made["profile"]) == (3, "2g.16gb")
                nodes, variables = spec_env(where, claim[2])
                assert nodes == ["/dev/gcu3", "/dev/gcuctl"]
                assert variables["TOPS_VISIBLE_DEVICES"] == f"DRS-{made['uuid']}"
                assert variables["ENFLAME_VISIBLE_DEVICES"] == "3"
                recorded = env.driver.prepared[claim[2]].devices[0]
                assert (recorded.drs_instance, recorded.drs_uuid) == (made["id"], made["uuid"])
                # Idempotent: asked again, the same answer and still one instance.
                again = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                assert [d.cdi_device_ids for d in again.devices] == [
                    d.cdi_device_ids for d in answer.devices
                ]
                assert len(instances(where)) == 1
                # A second partition of the same card: its own instance.
                second = (await env.kubelet.prepare(DRIVER, [other])).claims[other[2]]
                assert second.error == "" and len(instances(where)) == 2
                # The whole card while partitions are held: refused, nothing created.
                refused = (await env.kubelet.prepare(DRIVER, [whole])).claims[whole[2]]
                assert "gcu-3 is already prepared for claim ns/part" in refused.error
                for done in (claim, other):
                    result = await env.kubelet.unprepare(DRIVER, [done])
                    assert result.claims[done[2]].error == ""
                assert instances(where) == []
                assert not os.path.exists(claim_cdi.spec_path(where.cdi, claim[2]))
                assert (await env.kubelet.unprepare(DRIVER, [claim])).claims[claim[2]].error == ""

    asyncio.run(main())


def test_a_failing_efsmi_fails_the_claim_by_name_and_leaves_nothing() -> None:
    async def main() -> None:
        with drs_node() as (where, settings):
            source = harness.FakeClaims()
            claim = ("ns", "part", "uid-part")
            source.add(harness.claim_document(*claim, [("part", "gcu-1-1g-8gb-0")]))
            async with harness.running(where, source, settings=settings) as env:
                await env.kubelet.wait_registered(DRIVER)
                efsmi_sim.set_fault(where.root, "create", "fail")
                answer = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                assert "--create-instance" in answer.error and "exit status 1" in answer.error
                assert env.driver.prepared == {} and instances(where) == []
                assert claim_cdi.claim_uids_on_disk(where.cdi) == set()
                efsmi_sim.set_fault(where.root, "create", None)
                answer = (await env.kubelet.prepare(DRIVER, [claim])).claims[claim[2]]
                assert answer.error == "" and len(instances(where)) == 1

    asyncio.run(main())


def test_a_card_efsmi_cannot_partition_stays_a_whole_card() -> None:
    with drs_node("gcu2") as (where, settings):
        efsmi_sim.set_fault(where.root, "profiles", "fail")
        devices = node.for_settings(settings)
        assert devices.layouts == {}
        assert "list-profile" in devices.drs_problems["gcu2"]
        names = [d["name"] for d in devices.published()]
        assert "gcu-2" in names and not any(n.startswith("gcu-2-") for n in names)
        assert devices.counter_sets() == []


def test_start_up_leaves_instances_it_has_no_record_of_alone() -> None:
    """An instance this driver's record knows nothing of may be another owner's (the device
    plugin's drs-gcu, before the node moved to DRA) with a container running on it: the start
    leaves it alone, on every card (it used to destroy those on the cards it partitions)."""
    with drs_node("gcu1") as (where, settings):
        smi = efsmi.Efsmi(settings.efsmi, timeout=30)
        for index in (1, 5):
            smi.set_drs(index, True)
            smi.create_instance(index, "0")
        prepare, _ = harness.make_driver(where, harness.FakeClaims(), settings)
        assert sorted(i["index"] for i in instances(where)) == [1, 5]
        assert prepare.recover() == []
        assert prepare.lost == {}


def test_drs_is_not_switched_on_under_a_claim_holding_the_whole_card() -> None:
    """The record is read before DRS is turned on: a card a prepared claim holds whole (the
    driver ran without --drs) stays whole until that claim is unprepared."""

    async def main() -> None:
        with drs_node("gcu3") as (where, settings):
            source = harness.FakeClaims()
            whole = ("ns", "whole", "uid-whole")
            source.add(harness.claim_document(*whole, [("gcu", "gcu-3")]))
            before, _ = harness.make_driver(where, source, where.settings())  # no DRS
            assert isinstance((await before.prepare([claims.ClaimRef(*whole)]))[whole[2]], list)
            prepare, devices = harness.make_driver(where, source, settings)  # now --drs gcu3
            assert (
                not efsmi.Efsmi(settings.efsmi, timeout=30)
                .card_for(devices.inventory.cards[3].bdf)
                .drs_on
            )
            assert "gcu3" not in devices.layouts
            assert "held whole by claim ns/whole" in devices.drs_problems["gcu3"]
            assert await prepare.unprepare([claims.ClaimRef(*whole)]) == {whole[2]: ""}
            assert "gcu3" in devices.layouts
            assert "gcu-3-1g-8gb-0" in devices.published_names()

    asyncio.run(main())


def test_a_prepared_claim_whose_instance_vanished_is_refused_not_recreated() -> None:
    async def main() -> None:
        with drs_node("gcu4") as (where, settings):
            source = harness.FakeClaims()
            claim = ("ns", "part", "uid-part")
            source.add(harness.claim_document(*claim, [("part", "gcu-4-1g-8gb-0")]))
            prepare, _ = harness.make_driver(where, source, settings)
            ref = claims.ClaimRef(*claim)
            assert isinstance((await prepare.prepare([ref]))[claim[2]], list)
            (made,) = instances(where)
            efsmi.Efsmi(settings.efsmi, timeout=30).destroy_instance(4, made["id"])
            again, _ = harness.make_driver(where, source, settings)  # a restart
            assert "is gone" in again.lost[claim[2]]
            answer = (await again.prepare([ref]))[claim[2]]
            assert isinstance(answer, str) and "not re-created" in answer
            assert instances(where) == []
            assert (await again.unprepare([ref])) == {claim[2]: ""}
            assert again.prepared == {} and again.lost == {}

    asyncio.run(main())


def test_a_claim_left_preparing_mid_create_adopts_what_was_created_not_a_second() -> None:
    """Another instance (a rolling update) died between efsmi's create and its record: the
    claim is on record as preparing with the card's UUIDs from before the create. The next
    Prepare adopts the instance that appeared since and destroys any other stray one."""

    async def main() -> None:
        with drs_node("gcu4") as (where, settings):
            source = harness.FakeClaims()
            claim = ("ns", "part", "uid-part")
            source.add(harness.claim_document(*claim, [("part", "gcu-4-1g-8gb-0")]))
            prepare, _ = harness.make_driver(where, source, settings)
            smi = efsmi.Efsmi(settings.efsmi, timeout=30)
            kept = smi.create_instance(4, "0")  # before the create: not the claim's
            pending = checkpoint.PreparedClaim(
                uid=claim[2],
                namespace="ns",
                name="part",
                state=checkpoint.PREPARING,
                devices=(
                    checkpoint.PreparedDevice(
                        request="part",
                        device="gcu-4-1g-8gb-0",
                        node_name="gcu4",
                        drs_profile="1g.8gb",
                        drs_before=(kept.uuid,),
                    ),
                ),
            )
            prepare.checkpoint.save({claim[2]: pending})
            made = smi.create_instance(4, "0")  # what the dead attempt created
            stray = smi.create_instance(4, "1")  # and something of the wrong profile
            answer = (await prepare.prepare([claims.ClaimRef(*claim)]))[claim[2]]
            assert isinstance(answer, list), answer
            recorded = prepare.prepared[claim[2]].devices[0]
            assert recorded.drs_uuid == made.uuid and recorded.drs_before is None
            left = {i["uuid"] for i in instances(where)}
            assert left == {kept.uuid, made.uuid} and stray.uuid not in left

    asyncio.run(main())


def test_unprepare_of_a_vanished_card_finishes_and_its_return_is_checked() -> None:
    """The card under a DRS claim is unplugged: efsmi says "invalid device index", which used
    to fail Unprepare for ever (the pod stuck Terminating). The instance went with the card:
    Unprepare finishes; when the card is back, what is left on it is destroyed, and a claim
    whose instance a reset took is reported."""

    async def main() -> None:
        with drs_node("gcu4,gcu5") as (where, settings):
            source = harness.FakeClaims()
            gone = ("ns", "gone", "uid-gone")
            reset = ("ns", "reset", "uid-reset")
            source.add(harness.claim_document(*gone, [("part", "gcu-4-1g-8gb-0")]))
            source.add(harness.claim_document(*reset, [("part", "gcu-5-1g-8gb-0")]))
            prepare, devices = harness.make_driver(where, source, settings)
            watcher = asyncio.ensure_future(prepare.watch_cards())
            health = asyncio.ensure_future(devices.run())
            try:
                for claim in (gone, reset):
                    result = await prepare.prepare([claims.ClaimRef(*claim)])
                    assert isinstance(result[claim[2]], list), result
                simulate.unplug(where.root, 4)
                await until(lambda: not devices.healthy()["gcu4"], "gcu4 is unhealthy")
                answer = await prepare.unprepare([claims.ClaimRef(*gone)])
                assert answer == {gone[2]: ""}
                assert gone[2] not in prepare.prepared
                assert [i["index"] for i in instances(where)] == [4, 5]  # left on the card
                simulate.replug(where.root, 4)
                await until(lambda: [i["index"] for i in instances(where)] == [5], "swept")
                assert prepare.unsettled == {}

                # A reset of gcu5 destroys its instance while the claim is prepared.
                (held,) = instances(where)
                efsmi.Efsmi(settings.efsmi, timeout=30).destroy_instance(5, held["id"])
                simulate.unplug(where.root, 5)
                await until(lambda: not devices.healthy()["gcu5"], "gcu5 is unhealthy")
                simulate.replug(where.root, 5)
                await until(lambda: reset[2] in prepare.lost, "the lost instance is noticed")
                refused = (await prepare.prepare([claims.ClaimRef(*reset)]))[reset[2]]
                assert isinstance(refused, str) and "not re-created" in refused
            finally:
                for task in (watcher, health):
                    task.cancel()
                await asyncio.gather(watcher, health, return_exceptions=True)

    asyncio.run(main())


def test_an_instance_destroyed_while_its_card_stays_healthy_is_noticed_while_running() -> None:
    """A reset so quick the health monitor never saw the card go (or someone's efsmi) takes a
    prepared claim's instance: the periodic look notices it while the driver runs, reports the
    claim once, and leaves the other claim's instance alone."""

    async def main() -> None:
        with drs_node("gcu4,gcu5") as (where, settings):
            source = harness.FakeClaims()
            taken = ("ns", "taken", "uid-taken")
            kept = ("ns", "kept", "uid-kept")
            source.add(harness.claim_document(*taken, [("part", "gcu-5-1g-8gb-0")]))
            source.add(harness.claim_document(*kept, [("part", "gcu-4-1g-8gb-0")]))
            prepare, devices = harness.make_driver(where, source, settings)
            prepare.recheck_interval = 0.3
            for claim in (taken, kept):
                result = await prepare.prepare([claims.ClaimRef(*claim)])
                assert isinstance(result[claim[2]], list), result
            watcher = asyncio.ensure_future(prepare.watch_cards())
            health = asyncio.ensure_future(devices.run())
            try:
                on_gcu5 = [i for i in instances(where) if i["index"] == 5]
                assert len(on_gcu5) == 1, instances(where)
                efsmi.Efsmi(settings.efsmi, timeout=30).destroy_instance(5, on_gcu5[0]["id"])
                await until(lambda: taken[2] in prepare.lost, "the lost instance is noticed")
                assert devices.healthy()["gcu5"], "the card never looked unhealthy"
                assert kept[2] not in prepare.lost
                assert [i["index"] for i in instances(where)] == [4]
                refused = (await prepare.prepare([claims.ClaimRef(*taken)]))[taken[2]]
                assert isinstance(refused, str) and "not re-created" in refused
            finally:
                for task in (watcher, health):
                    task.cancel()
                await asyncio.gather(watcher, health, return_exceptions=True)

    asyncio.run(main())


async def until(condition: Any, what: str, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)
