"""An API server outage during a Prepare fails each claim that needs the server, not the call."""

from __future__ import annotations

import asyncio

from enflame_gcu.dra_plugin import apiserver
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer

DRIVER = harness.DRIVER
A = ("enflame", "pair-a", "uid-a")
B = ("enflame", "pair-b", "uid-b")


async def outage(where: harness.Node, fake: FakeApiServer) -> None:
    fake.add_node(harness.NODE)
    for (namespace, name, uid), cards in ((A, (0, 1)), (B, (4, 5))):
        results = [("gcus", f"gcu-{c}") for c in cards]
        fake.add_claim(harness.claim_document(namespace, name, uid, results))
    client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
    try:
        async with harness.running(where, apiserver.ApiServer(client, harness.NODE)) as env:
            await env.kubelet.wait_registered(DRIVER)
            first = await env.kubelet.prepare(DRIVER, [A])
            assert first.claims["uid-a"].error == ""
            fake.down = True  # the API server stops answering
            # A is prepared (the driver's record answers it); B must be read.
            answer = await env.kubelet.prepare(DRIVER, [A, B])
            assert answer.claims["uid-a"].error == ""
            assert len(answer.claims["uid-a"].devices) == 2
            error = answer.claims["uid-b"].error
            assert "cannot read claim enflame/pair-b" in error
            assert "unreachable" in error
            assert sorted(env.driver.prepared) == ["uid-a"]  # B holds nothing
            fake.down = False  # back: the kubelet's retry of B succeeds
            retry = await env.kubelet.prepare(DRIVER, [B])
            assert retry.claims["uid-b"].error == ""
    finally:
        await client.close()


def test_an_outage_fails_only_the_claims_that_must_be_read() -> None:
    async def main() -> None:
        with harness.simulated_node() as where, FakeApiServer() as fake:
            await outage(where, fake)

    asyncio.run(asyncio.wait_for(main(), 60))


async def retried(where: harness.Node, fake: FakeApiServer) -> None:
    fake.add_node(harness.NODE)
    fake.add_claim(harness.claim_document(*A, [("gcus", "gcu-0"), ("gcus", "gcu-1")]))
    client = apiserver.connect(fake.kubeconfig(f"{where.work}/kubeconfig"))
    try:
        async with harness.running(where, apiserver.ApiServer(client, harness.NODE)) as env:
            await env.kubelet.wait_registered(DRIVER)
            fake.down = True
            loop = asyncio.get_running_loop()
            loop.call_later(0.5, setattr, fake, "down", False)  # back after half a second
            pod = await env.kubelet.prepare_pod(DRIVER, [A], backoff=0.3)
            assert pod.attempts >= 2 and "unreachable" in pod.errors[0]
            assert [d.device_name for d in pod.devices["uid-a"]] == ["gcu-0", "gcu-1"]
            gone = await env.kubelet.unprepare_pod(DRIVER, [A], backoff=0.3)
            assert gone.attempts == 1 and env.driver.prepared == {}
    finally:
        await client.close()


def test_the_kubelets_retry_prepares_the_claim_once_the_server_is_back() -> None:
    async def main() -> None:
        with harness.simulated_node() as where, FakeApiServer() as fake:
            await retried(where, fake)

    asyncio.run(asyncio.wait_for(main(), 60))
