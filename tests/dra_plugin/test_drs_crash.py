"""``enflame-dra-plugin --drs`` killed with SIGKILL at every step of a DRS Prepare/Unprepare.

The real process runs with the simulated efsmi, so instances are created and destroyed by a
separate program and outlive the driver, as on a real card. After each kill the driver starts
again; whatever the step, the node must converge: no instance without a prepared claim on
record (no orphan), never two instances for one claim (no double create), and the kubelet's
retry must succeed with exactly one instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from enflame_gcu import fileio, resourceslices
from enflame_gcu.simulation import efsmi_sim
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_crash_process import Driver, record, restart, specs
from tests.dra_plugin.test_process import command

DRIVER = resourceslices.DRIVER
PART = ("enflame", "part", "uid-part")
DEVICE = "gcu-2-2g-16gb-0"


class DrsDriver(Driver):
    """The driver process with ``--drs all`` and the node's simulated efsmi."""

    async def start(self, kill_at: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != fileio.FAULT_ENV}
        if kill_at:
            env[fileio.FAULT_ENV] = f"dra-{kill_at}"
        tool = efsmi_sim.install(self.where.root)
        args = command(self.where, self.kubeconfig, "--no-publish", "--drs", "all")
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *args, "--efsmi", tool, stdout=log, stderr=log, env=env
            )
        self.starts += 1


@contextlib.asynccontextmanager
async def drs_node() -> AsyncIterator[tuple[harness.Node, DrsDriver, DraKubeletStub]]:
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        fake.add_claim(harness.claim_document(*PART, [("part", DEVICE)]))
        driver = DrsDriver(where, fake.kubeconfig(os.path.join(where.work, "kubeconfig")))
        stub = DraKubeletStub(where.registry)
        await stub.start()
        try:
            yield where, driver, stub
        finally:
            await driver.stop()
            await stub.stop()


def instances(where: harness.Node) -> list[dict[str, Any]]:
    return efsmi_sim.instances(where.root)


def recorded_uuids(where: harness.Node) -> list[str]:
    path = os.path.join(where.plugins, "checkpoint.json")
    with open(path, encoding="utf-8") as handle:
        claims = json.load(handle)["claims"]
    return [d["drsUUID"] for c in claims.values() for d in c["devices"] if d.get("drsUUID")]


async def prepared_once(where: harness.Node, stub: DraKubeletStub) -> None:
    """The kubelet's retry succeeds, twice (idempotent), with exactly one instance on record."""
    for _ in range(2):
        answer = (await stub.prepare(DRIVER, [PART])).claims[PART[2]]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == [DEVICE]
    (made,) = instances(where)
    assert recorded_uuids(where) == [made["uuid"]]
    assert record(where) == {PART[2]: ("prepared", [DEVICE])} and specs(where) == [PART[2]]


@pytest.mark.parametrize(
    ("point", "kept"),
    [
        ("after-checkpoint", False),  # recorded as preparing, nothing created yet
        ("drs-after-create", False),  # the instance exists, not recorded: an orphan
        ("drs-after-record", False),  # recorded on a claim still preparing: rolled back
        ("after-cdi", False),  # spec written too: rolled back, instance destroyed
        ("after-prepared", True),  # prepared, answer never sent: kept with its instance
    ],
)
def test_sigkill_inside_a_drs_prepare_leaves_no_orphan_and_no_double(
    point: str, kept: bool
) -> None:
    async def main() -> None:
        async with drs_node() as (where, driver, stub):
            await driver.start(kill_at=point)
            await stub.wait_registered(DRIVER, timeout=60)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.prepare(DRIVER, [PART], timeout=60)
            await driver.wait_killed()
            created = point != "after-checkpoint"
            assert len(instances(where)) == (1 if created else 0)

            await restart(driver, stub)
            assert len(instances(where)) == (1 if kept else 0), driver.log()
            assert record(where) == ({PART[2]: ("prepared", [DEVICE])} if kept else {})
            if created and not kept:
                assert "which no prepared claim holds" in driver.log()
            await prepared_once(where, stub)
            assert (await stub.unprepare(DRIVER, [PART])).claims[PART[2]].error == ""
            assert instances(where) == [] and record(where) == {} and specs(where) == []

    asyncio.run(main())


@pytest.mark.parametrize("point", ["unprepare-after-cdi", "unprepare-after-destroy"])
def test_sigkill_inside_a_drs_unprepare_converges(point: str) -> None:
    async def main() -> None:
        async with drs_node() as (where, driver, stub):
            await driver.start(kill_at=point)
            await stub.wait_registered(DRIVER, timeout=60)
            await prepared_once(where, stub)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.unprepare(DRIVER, [PART], timeout=60)
            await driver.wait_killed()
            destroyed = point == "unprepare-after-destroy"
            assert len(instances(where)) == (0 if destroyed else 1)
            assert record(where) == {PART[2]: ("prepared", [DEVICE])}

            await restart(driver, stub)
            if destroyed:
                # The record outlived its instance: reported, and a Prepare is refused rather
                # than handed a fresh instance under the same claim.
                assert "is gone" in driver.log() and "not re-created" in driver.log()
                answer = (await stub.prepare(DRIVER, [PART])).claims[PART[2]]
                assert "is not re-created" in answer.error
                assert instances(where) == []
            else:
                assert len(instances(where)) == 1
            # The kubelet insists on Unprepare; it completes and nothing is left.
            assert (await stub.unprepare(DRIVER, [PART])).claims[PART[2]].error == ""
            assert instances(where) == [] and record(where) == {} and specs(where) == []

    asyncio.run(main())


def test_a_deadline_that_expires_mid_create_leaves_one_instance_and_no_orphan() -> None:
    """The kubelet gives up while efsmi is still creating: the create, its lookup and its
    record finish as one step, the retry finds the claim prepared (no second instance), and a
    deadline shorter than a create is refused by name before anything is created."""

    async def main() -> None:
        async with drs_node() as (where, driver, stub):
            # Far apart, so that a loaded machine's overheads (efsmi is a Python program here)
            # cannot move the call to the other side of the 1 s floor.
            efsmi_sim.set_fault(where.root, "create", "slow:8")
            await driver.start()
            await stub.wait_registered(DRIVER, timeout=60)
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await stub.prepare(DRIVER, [PART], timeout=4)
            assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await prepared_once(where, stub)  # the retry: the same, single instance
            assert (await stub.unprepare(DRIVER, [PART])).claims[PART[2]].error == ""
            assert instances(where) == [] and record(where) == {}

            # The driver now knows a create takes about 8 s: 4 s left is refused at once.
            answer = (await stub.prepare(DRIVER, [PART], timeout=4)).claims[PART[2]]
            assert "the kubelet's deadline leaves" in answer.error
            assert "the create was not started" in answer.error
            assert instances(where) == [] and record(where) == {}
            efsmi_sim.set_fault(where.root, "create", None)
            await prepared_once(where, stub)
            assert (await stub.unprepare(DRIVER, [PART])).claims[PART[2]].error == ""
            assert instances(where) == [] and record(where) == {} and specs(where) == []

    asyncio.run(main())
