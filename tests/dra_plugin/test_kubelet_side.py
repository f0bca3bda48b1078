"""The kubelet side over real gRPC: registration, Prepare/Unprepare contract, crashes, health."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from typing import Any

import pytest

from enflame_gcu.container_toolkit import cdi_validate
from enflame_gcu.dra_plugin import checkpoint, claim_cdi, claims
from enflame_gcu.errors import ClaimError, ConfigError
from enflame_gcu.simulation import simulate
from tests.dra_plugin import harness
from tests.shim import schemas

DRIVER = harness.DRIVER
A = ("enflame", "pair-a", "uid-a")
B = ("enflame", "pair-b", "uid-b")


def two_card_claim(source: harness.FakeClaims, who: tuple[str, str, str], *cards: int) -> None:
    source.add(harness.claim_document(*who, [("gcus", f"gcu-{card}") for card in cards]))


def spec_of(where: harness.Node, uid: str) -> dict[str, Any]:
    with open(claim_cdi.spec_path(where.cdi, uid), encoding="utf-8") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


def env_of(spec: dict[str, Any], device: int = 0) -> dict[str, str]:
    entries = spec["devices"][device]["containerEdits"].get("env", [])
    return dict(item.split("=", 1) for item in entries)


def nodes_of(spec: dict[str, Any], device: int = 0) -> list[str]:
    return [n["path"] for n in spec["devices"][device]["containerEdits"]["deviceNodes"]]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_registers_with_the_newest_service_and_learns_the_outcome() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            async with harness.running(where, harness.FakeClaims()) as env:
                plugin = await env.kubelet.wait_registered(DRIVER)
                assert plugin.service == "v1.DRAPlugin"
                assert plugin.health_service == "v1.DRAResourceHealth"
                assert plugin.endpoint == where.settings().endpoint
                assert os.path.basename(plugin.socket) == "gcu.enflame.com-reg.sock"
                await asyncio.wait_for(env.plugin.registered.wait(), 5)
                info = await env.kubelet.ping(DRIVER)
                assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            # Stopping removes both sockets.
            assert os.listdir(where.registry) == []
            assert not os.path.exists(where.settings().endpoint)

    run(main())


def test_an_older_kubelet_gets_v1beta1_and_one_that_knows_nothing_refuses() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)
            async with harness.running(where, source, known_services=("v1beta1.DRAPlugin",)) as env:
                plugin = await env.kubelet.wait_registered(DRIVER)
                assert plugin.service == "v1beta1.DRAPlugin"
                answer = await env.kubelet.prepare(DRIVER, [A])
                assert [d.device_name for d in answer.claims["uid-a"].devices] == ["gcu-0", "gcu-1"]
                assert not hasattr(answer.claims["uid-a"].devices[0], "share_id")
        with harness.simulated_node() as where:
            async with harness.running(
                where, harness.FakeClaims(), known_services=("v2.DRAPlugin",)
            ) as env:
                await env.kubelet._until(lambda: bool(env.kubelet.refused), "a refusal", 10)
                assert "none of the services" in env.kubelet.refused[0].error
                await env.kubelet._until(lambda: bool(env.plugin.registration_error), "status", 10)
                assert "none of the services" in env.plugin.registration_error

    run(main())


def test_prepare_writes_one_cdi_device_per_request_and_is_idempotent() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                first = await env.kubelet.prepare(DRIVER, [A])
                entry = first.claims["uid-a"]
                assert entry.error == ""
                cdi_id = "k8s.gcu.enflame.com/claim=uid-a-gcus"
                assert [
                    (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                    for d in entry.devices
                ] == [
                    (["gcus"], harness.NODE, "gcu-0", [cdi_id]),
                    (["gcus"], harness.NODE, "gcu-1", []),
                ]
                spec = spec_of(where, "uid-a")
                assert spec["kind"] == "k8s.gcu.enflame.com/claim"
                assert spec["cdiVersion"] == "0.5.0"
                assert [d["name"] for d in spec["devices"]] == ["uid-a-gcus"]
                assert nodes_of(spec) == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
                assert env_of(spec) == {"ENFLAME_VISIBLE_DEVICES": "0,1"}
                assert cdi_validate.semantic_problems(spec) == []
                reads = source.reads
                again = await env.kubelet.prepare(DRIVER, [A])
                assert again == first and source.reads == reads  # answered from the record
                # A spec lost while prepared (someone cleaned /var/run/cdi) comes back.
                os.unlink(claim_cdi.spec_path(where.cdi, "uid-a"))
                assert await env.kubelet.prepare(DRIVER, [A]) == first
                assert spec_of(where, "uid-a") == spec
                for _ in range(2):
                    gone = await env.kubelet.unprepare(DRIVER, [A])
                    assert gone.claims["uid-a"].error == ""
                assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a"))
                assert env.driver.prepared == {}

    run(main())


def test_each_request_gets_its_own_cdi_device_with_its_own_visible_list() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            source.add(
                harness.claim_document(
                    *A,
                    [("train", "gcu-0"), ("train", "gcu-1"), ("eval/same-numa", "gcu-4")],
                )
            )
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                entry = (await env.kubelet.prepare(DRIVER, [A])).claims["uid-a"]
                assert [(list(d.request_names), list(d.cdi_device_ids)) for d in entry.devices] == [
                    (["train"], ["k8s.gcu.enflame.com/claim=uid-a-train"]),
                    (["train"], []),
                    (["eval"], ["k8s.gcu.enflame.com/claim=uid-a-eval"]),
                ]
                spec = spec_of(where, "uid-a")
                assert env_of(spec, 0)["ENFLAME_VISIBLE_DEVICES"] == "0,1"
                assert env_of(spec, 1)["ENFLAME_VISIBLE_DEVICES"] == "4"
                assert nodes_of(spec, 1) == ["/dev/gcu4", "/dev/gcuctl"]

    run(main())


def test_a_device_prepared_for_another_claim_is_refused_clearly() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)
            two_card_claim(source, B, 1, 2)
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                answer = await env.kubelet.prepare(DRIVER, [A, B])
                assert answer.claims["uid-a"].error == ""
                error = answer.claims["uid-b"].error
                assert "gcu-1 is already prepared for claim enflame/pair-a (uid uid-a)" in error
                assert not answer.claims["uid-b"].devices
                assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-b"))
                await env.kubelet.unprepare(DRIVER, [A])
                assert (await env.kubelet.prepare(DRIVER, [B])).claims["uid-b"].error == ""

    run(main())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (None, "not found"),
        (harness.claim_document("enflame", "pair-a", "other-uid", [("g", "gcu-0")]), "has uid"),
        (harness.claim_document(*A, [("g", "gcu-0")], pool="node-b"), "pool 'node-b'"),
        (harness.claim_document(*A, [("g", "gcu-9")]), "not a device this node offers"),
        (harness.claim_document(*A, [("g", "gcu-0")], driver_name="x.example.com"), "no device of"),
        ({"metadata": {"uid": "uid-a"}, "status": {}}, "is not allocated"),
    ],
)
def test_claims_that_cannot_be_prepared_get_a_clear_error_and_change_nothing(
    document: dict[str, Any] | None, message: str
) -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            if document is not None:
                source.documents[("enflame", "pair-a")] = document
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                answer = await env.kubelet.prepare(DRIVER, [A])
                assert message in answer.claims["uid-a"].error
                assert env.driver.prepared == {}
                assert not os.path.isdir(where.cdi) or os.listdir(where.cdi) == []

    run(main())


def test_per_claim_specs_validate_against_the_cdi_schema() -> None:
    async def main() -> dict[str, Any]:
        with harness.simulated_node("vgcu-2card") as where:
            source = harness.FakeClaims()
            source.add(harness.claim_document(*A, [("v", "vgcu-1"), ("w", "vgcu-5")]))
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                assert (await env.kubelet.prepare(DRIVER, [A])).claims["uid-a"].error == ""
                return spec_of(where, "uid-a")

    spec = run(main())
    assert env_of(spec, 0) == {"ENFLAME_VISIBLE_DEVICES": "vgcu1"}
    assert nodes_of(spec, 1) == ["/dev/vgcu5", "/dev/gcuctl"]
    schemas.assert_valid_cdi(spec)


def test_an_unhealthy_card_is_not_prepared() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 2, 3)
            async with harness.running(where, source, watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                simulate.unplug(where.root, 3)
                seen = env.devices.version
                while env.devices.healthy()["gcu3"]:
                    seen = await asyncio.wait_for(env.devices.changed(seen), 5)
                error = (await env.kubelet.prepare(DRIVER, [A])).claims["uid-a"].error
                assert "gcu-3 is unhealthy" in error and "gone" in error

    run(main())


@pytest.mark.parametrize("point", ["after-checkpoint", "after-cdi"])
def test_a_crash_between_the_two_steps_is_rolled_back_at_the_next_start(point: str) -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)

            def crash(at: str) -> None:
                if at == point:
                    raise harness.Crash(at)

            crashing, _ = harness.make_driver(where, source, fault=crash)
            with pytest.raises(harness.Crash):
                await crashing.prepare([claims.ClaimRef(*A)])
            record = checkpoint.Checkpoint(os.path.join(where.plugins, "checkpoint.json"))
            assert record.load()["uid-a"].state == checkpoint.PREPARING
            assert os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a")) == (point == "after-cdi")
            restarted, _ = harness.make_driver(where, source)
            assert record.load() == {}
            assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a"))
            outcome = await restarted.prepare([claims.ClaimRef(*A)])
            assert [d.device for d in outcome["uid-a"]] == ["gcu-0", "gcu-1"]  # type: ignore[union-attr]
            assert record.load()["uid-a"].state == checkpoint.PREPARED

    run(main())


def test_after_a_reboot_the_specs_of_prepared_claims_come_back() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)
            two_card_claim(source, B, 4, 5)
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                await env.kubelet.prepare(DRIVER, [A, B])
                await env.kubelet.unprepare(DRIVER, [B])
                before = spec_of(where, "uid-a")
            shutil.rmtree(where.cdi)  # /var/run is a tmpfs
            os.makedirs(where.cdi)
            with open(claim_cdi.spec_path(where.cdi, "stale-uid"), "w", encoding="utf-8") as f:
                f.write("{}")
            source.documents.clear()  # the API server is not needed for this
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                assert spec_of(where, "uid-a") == before
                assert sorted(os.listdir(where.cdi)) == [
                    os.path.basename(claim_cdi.spec_path(where.cdi, "uid-a"))
                ]
                # The kubelet insists on Unprepare after the reboot; it works from the record.
                assert (await env.kubelet.unprepare(DRIVER, [A])).claims["uid-a"].error == ""
                assert os.listdir(where.cdi) == []

    run(main())


def test_a_damaged_checkpoint_stops_the_driver_with_a_clear_error() -> None:
    with harness.simulated_node() as where:
        os.makedirs(where.plugins)
        path = os.path.join(where.plugins, "checkpoint.json")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write('{"version": 1, "claims": {"u": {"state": "weird"}}}')
        with pytest.raises(ConfigError, match=r"damaged .* move it aside"):
            harness.make_driver(where, harness.FakeClaims())
        with open(path, encoding="utf-8") as handle:
            assert "weird" in handle.read()  # kept for the operator


def test_eight_claims_in_one_call_finish_well_inside_the_kubelet_timeout() -> None:
    async def main() -> float:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            refs = []
            for index in range(8):
                who = ("enflame", f"one-{index}", f"uid-{index}")
                source.add(harness.claim_document(*who, [("gcu", f"gcu-{index}")]))
                refs.append(who)
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                started = time.monotonic()
                answer = await env.kubelet.prepare(DRIVER, refs)
                elapsed = time.monotonic() - started
                assert all(answer.claims[r[2]].error == "" for r in refs)
                assert len(os.listdir(where.cdi)) == 8
                undone = await env.kubelet.unprepare(DRIVER, refs)
                assert all(undone.claims[r[2]].error == "" for r in refs)
                return elapsed

    elapsed = run(main())
    print(json.dumps({"prepare_8_claims_seconds": round(elapsed, 3)}))
    assert elapsed < 45 / 3  # the kubelet gives the whole call 45 s


def test_shares_of_one_card_coexist_but_never_with_a_whole_card_use() -> None:
    def share(uid: str, device: str, slices: str) -> dict[str, Any]:
        return {
            "request": "slice",
            "device": device,
            "shareID": f"share-{uid}",
            "consumedCapacity": {"slices": slices, "memory": "0"},
        }

    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            source.add(harness.claim_document(*A, [share("a", "gcu-0", "2")]))
            source.add(harness.claim_document(*B, [share("b", "gcu-0", "3")]))
            source.add(harness.claim_document("enflame", "c", "uid-c", [share("c", "gcu-0", "2")]))
            source.add(harness.claim_document("enflame", "whole", "uid-w", [("g", "gcu-0")]))
            settings = where.settings(shared_slices=6)
            async with harness.running(where, source, settings=settings) as env:
                await env.kubelet.wait_registered(DRIVER)
                answer = await env.kubelet.prepare(DRIVER, [A, B])
                assert [d.share_id for d in answer.claims["uid-a"].devices] == ["share-a"]
                assert env_of(spec_of(where, "uid-b")) == {
                    "ENFLAME_CONTAINER_SUB_CARD": "true",
                    "ENFLAME_CONTAINER_USABLE_PROCESSOR": "3/6",
                    "ENFLAME_VISIBLE_DEVICES": "0",
                }
                over = await env.kubelet.prepare(DRIVER, [("enflame", "c", "uid-c")])
                assert "has 6 slices and prepared claims would hold 7" in over.claims["uid-c"].error
                whole = await env.kubelet.prepare(DRIVER, [("enflame", "whole", "uid-w")])
                assert "already prepared for claim enflame/pair-a" in whole.claims["uid-w"].error

    run(main())


def test_health_stream_reports_every_device_and_follows_changes_both_ways() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            async with harness.running(where, harness.FakeClaims(), watch_health=True) as env:
                await env.kubelet.wait_registered(DRIVER)
                stream = env.kubelet.watch_health(DRIVER)
                first = await asyncio.wait_for(stream.__anext__(), 5)
                states = {d.device.device_name: d.health for d in first.devices}
                assert states == {f"gcu-{i}": 1 for i in range(8)}
                assert {d.device.pool_name for d in first.devices} == {harness.NODE}
                simulate.unplug(where.root, 3)
                second = await asyncio.wait_for(stream.__anext__(), 5)
                bad = {d.device.device_name: d for d in second.devices if d.health != 1}
                assert list(bad) == ["gcu-3"] and bad["gcu-3"].health == 2
                assert "0000:19:00.0" in bad["gcu-3"].message
                assert len(second.devices) == 8  # always the complete list
                simulate.replug(where.root, 3)
                third = await asyncio.wait_for(stream.__anext__(), 5)
                assert all(d.health == 1 for d in third.devices)
                await stream.aclose()

    run(main())


def test_a_deleted_registration_socket_is_served_again_and_re_registered() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = harness.FakeClaims()
            two_card_claim(source, A, 0, 1)
            async with harness.running(where, source) as env:
                plugin = await env.kubelet.wait_registered(DRIVER)
                os.unlink(plugin.socket)
                await env.kubelet.wait_registered(DRIVER, count=2, timeout=10)
                answer = await env.kubelet.prepare(DRIVER, [A])
                assert answer.claims["uid-a"].error == ""

    run(main())


def test_identifiers_that_would_lead_out_of_the_cdi_dir_are_refused() -> None:
    """Issue 22 item 6: a claim UID ``x/../../victim/important`` made Prepare overwrite and
    Unprepare delete a ``.json`` outside the CDI dir; a request name goes into a CDI name."""
    evil = ("enflame", "evil", "x/../../victim/important")

    async def main() -> None:
        with harness.simulated_node() as where:
            victim = os.path.join(where.work, "victim")
            os.makedirs(victim)
            # Where the unchecked path led: <cdi>/<prefix>x/../../victim/important.json
            target = os.path.join(victim, "important.json")
            with open(target, "w", encoding="utf-8") as handle:
                handle.write("{}\n")
            os.makedirs(os.path.join(where.cdi, "k8s.gcu.enflame.com-claim_x"))
            source = harness.FakeClaims()
            two_card_claim(source, evil, 0, 1)
            source.add(harness.claim_document("enflame", "bad-req", "uid-r", [("A/b", "gcu-2")]))
            async with harness.running(where, source) as env:
                await env.kubelet.wait_registered(DRIVER)
                answer = await env.kubelet.prepare(DRIVER, [evil])
                assert "is not a UID" in answer.claims[evil[2]].error
                gone = await env.kubelet.unprepare(DRIVER, [evil])
                assert "is not a UID" in gone.claims[evil[2]].error
                bad = await env.kubelet.prepare(DRIVER, [("enflame", "bad-req", "uid-r")])
                assert "is not a DNS label" in bad.claims["uid-r"].error
                assert env.driver.prepared == {}
            with open(target, encoding="utf-8") as handle:
                assert handle.read() == "{}\n"

    run(main())


@pytest.mark.parametrize(
    ("namespace", "name", "uid"),
    [
        ("Enflame", "c", "uid-a"),
        ("enflame", "c/..", "uid-a"),
        ("enflame", "c", ".."),
        ("enflame", "c", "a" * 129),
    ],
)
def test_claim_references_are_checked_field_by_field(namespace: str, name: str, uid: str) -> None:
    with pytest.raises(ClaimError, match="refused a claim the kubelet named"):
        claims.check_ref(claims.ClaimRef(namespace, name, uid))
    claims.check_ref(claims.ClaimRef("enflame", "c.d-1", "0f8c2f4e-1d2b-4c5a-9e7f-1234567890ab"))
