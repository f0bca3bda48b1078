"""``enflame-dra-plugin`` killed with SIGKILL inside Prepare/Unprepare, then started again.

The real process is killed at a fault point (``ENFLAME_TEST_KILL_AT=dra-<point>``, test only)
while the stub kubelet's call is in flight; the kubelet sees the call fail, the driver starts
again on the same directories, re-registers, and the kubelet's retry must succeed. In between,
the state on disk must converge from the checkpoint: a half-done Prepare rolled back, a done
one kept, no card held twice, no CDI spec without a record and no record without its spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from enflame_gcu import fileio, resourceslices
from enflame_gcu.dra_plugin import claim_cdi
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command

DRIVER = resourceslices.DRIVER
A = ("enflame", "pair-a", "uid-a")
B = ("enflame", "pair-b", "uid-b")


class Driver:
    """One ``enflame-dra-plugin`` process at a time on a simulated node, restartable."""

    def __init__(self, where: harness.Node, kubeconfig: str) -> None:
        self.where = where
        self.kubeconfig = kubeconfig
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.log_path = os.path.join(where.work, "driver.log")

    async def start(self, kill_at: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != fileio.FAULT_ENV}
        if kill_at:
            env[fileio.FAULT_ENV] = f"dra-{kill_at}"
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *command(self.where, self.kubeconfig, "--no-publish"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.starts += 1

    async def wait_killed(self) -> None:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), 20)
        assert code == -9, f"exit {code}, not SIGKILL:\n{self.log()}"

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()


@contextlib.asynccontextmanager
async def node_with_claims() -> AsyncIterator[tuple[harness.Node, Driver, DraKubeletStub]]:
    """A simulated node, a fake API server holding claims A (gcu-0, gcu-1) and B (gcu-1)."""
    with harness.simulated_node() as where, FakeApiServer() as fake:
        fake.add_node(harness.NODE)
        fake.add_claim(harness.claim_document(*A, [("gcus", "gcu-0"), ("gcus", "gcu-1")]))
        # B names gcu-1 too: what a stale allocation or a bug upstream would look like.
        fake.add_claim(harness.claim_document(*B, [("gcus", "gcu-1"), ("gcus", "gcu-2")]))
        driver = Driver(where, fake.kubeconfig(os.path.join(where.work, "kubeconfig")))
        stub = DraKubeletStub(where.registry)
        await stub.start()
        try:
            yield where, driver, stub
        finally:
            await driver.stop()
            await stub.stop()


def record(where: harness.Node) -> dict[str, Any]:
    """The checkpoint's claims: ``{uid: (state, [devices])}``."""
    try:
        with open(os.path.join(where.plugins, "checkpoint.json"), encoding="utf-8") as handle:
            claims = json.load(handle)["claims"]
    except FileNotFoundError:
        return {}
    return {uid: (c["state"], [d["device"] for d in c["devices"]]) for uid, c in claims.items()}


def specs(where: harness.Node) -> list[str]:
    """UIDs of the per-claim CDI specs on disk."""
    return sorted(claim_cdi.claim_uids_on_disk(where.cdi))


async def restart(driver: Driver, stub: DraKubeletStub) -> None:
    await driver.start()
    await stub.wait_registered(DRIVER, count=driver.starts, timeout=30)


async def devices_of(stub: DraKubeletStub, claim: tuple[str, str, str]) -> list[str]:
    answer = (await stub.prepare(DRIVER, [claim])).claims[claim[2]]
    assert answer.error == ""
    return [d.device_name for d in answer.devices]


@pytest.mark.parametrize(
    ("point", "kept"),
    [
        ("after-checkpoint", False),  # recorded as preparing, no spec yet: rolled back
        ("after-cdi", False),  # spec written, still preparing: rolled back, spec removed
        ("after-prepared", True),  # recorded as prepared, answer never sent: kept as is
    ],
)
def test_sigkill_inside_prepare_converges_and_the_kubelet_retry_works(
    point: str, kept: bool
) -> None:
    async def main() -> None:
        async with node_with_claims() as (where, driver, stub):
            await driver.start(kill_at=point)
            await stub.wait_registered(DRIVER, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.prepare(DRIVER, [A], timeout=20)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            await driver.wait_killed()
            # The kill left the first step (and maybe the second) on disk.
            state = "prepared" if kept else "preparing"
            assert record(where) == {"uid-a": (state, ["gcu-0", "gcu-1"])}
            assert specs(where) == (["uid-a"] if point != "after-checkpoint" else [])

            await restart(driver, stub)
            assert record(where) == ({"uid-a": ("prepared", ["gcu-0", "gcu-1"])} if kept else {})
            assert specs(where) == (["uid-a"] if kept else [])
            if not kept:
                # Rolled back: the cards are free again, so another claim may have them ...
                assert await devices_of(stub, B) == ["gcu-1", "gcu-2"]
                # ... and the kubelet's retry of A is refused for the card B now holds.
                answer = (await stub.prepare(DRIVER, [A])).claims["uid-a"]
                assert "gcu-1 is already prepared for claim enflame/pair-b" in answer.error
                assert (await stub.unprepare(DRIVER, [B])).claims["uid-b"].error == ""
            # The kubelet retries A until it succeeds: same devices, one spec, recorded once.
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]  # idempotent
            assert record(where) == {"uid-a": ("prepared", ["gcu-0", "gcu-1"])}
            assert specs(where) == ["uid-a"]
            # No double allocation: B wants gcu-1, which A holds.
            answer = (await stub.prepare(DRIVER, [B])).claims["uid-b"]
            assert "gcu-1 is already prepared for claim enflame/pair-a (uid uid-a)" in answer.error
            assert record(where).keys() == {"uid-a"} and specs(where) == ["uid-a"]
            assert kept or "rolled back the unfinished prepare of claim enflame/pair-a" in (
                driver.log()
            )

    asyncio.run(main())


def test_sigkill_inside_unprepare_then_a_reboot_converge_from_the_checkpoint() -> None:
    async def main() -> None:
        async with node_with_claims() as (where, driver, stub):
            await driver.start(kill_at="unprepare-after-cdi")
            await stub.wait_registered(DRIVER, timeout=30)
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.unprepare(DRIVER, [A], timeout=20)
            await driver.wait_killed()
            # Spec gone, record kept: the claim still holds its cards until Unprepare is done.
            assert record(where) == {"uid-a": ("prepared", ["gcu-0", "gcu-1"])}
            assert specs(where) == []

            # The node reboots before the driver comes back: /var/run/cdi is a tmpfs.
            shutil.rmtree(where.cdi)
            await restart(driver, stub)
            assert specs(where) == ["uid-a"]  # re-created from the record
            answer = (await stub.prepare(DRIVER, [B])).claims["uid-b"]
            assert "already prepared for claim enflame/pair-a" in answer.error
            # The kubelet insists on Unprepare; now it completes and frees the cards.
            assert (await stub.unprepare(DRIVER, [A])).claims["uid-a"].error == ""
            assert record(where) == {} and specs(where) == []
            assert await devices_of(stub, B) == ["gcu-1", "gcu-2"]
            assert "re-created the CDI spec of claim enflame/pair-a" in driver.log()

    asyncio.run(main())
