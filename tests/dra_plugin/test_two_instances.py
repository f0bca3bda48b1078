"""Two ``enflame-dra-plugin`` processes on one node without a pod UID: one serves, one stands by.

Without a pod UID both use the same socket names; whoever holds ``dra.sock.lock`` serves both
sockets and publishes, the other says once who holds it and waits, and takes over (sockets,
registration, publishing) as soon as the holder stops, even when it is killed. Each instance
talks to its own fake API server, so what a standby sends there is seen apart. With pod UIDs
nothing of this applies: both serve side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import checkpoint, claim_cdi, claims, kubelet
from enflame_gcu.simulation.testing.dra_kubelet_stub import DraKubeletStub
from enflame_gcu.support import unix_sockets
from tests.dra_plugin import harness
from tests.dra_plugin.fake_apiserver import FakeApiServer
from tests.dra_plugin.test_process import command, eventually

DRIVER = resourceslices.DRIVER
NODE = harness.NODE
A = ("enflame", "pair-a", "uid-a")
B = ("enflame", "pair-b", "uid-b")
REGISTERED = f"the kubelet registered {DRIVER}"
STANDBY = "this instance stands by and takes over when that one stops"


@dataclass
class Instance:
    """One driver process with its own log and its own fake API server."""

    name: str
    where: harness.Node
    fake: FakeApiServer
    extra: tuple[str, ...] = ()
    process: asyncio.subprocess.Process | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.where.work, f"driver-{self.name}.log")

    async def start(self) -> None:
        kubeconfig = self.fake.kubeconfig(os.path.join(self.where.work, f"kube-{self.name}"))
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *command(self.where, kubeconfig, *self.extra),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def slice_requests(self) -> list[tuple[str, str, int]]:
        return [r for r in self.fake.requests if "resourceslices" in r[1]]

    async def signal(self, signum: int) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        return await asyncio.wait_for(self.process.wait(), 20)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def two_instances(
    extra_a: tuple[str, ...] = (), extra_b: tuple[str, ...] = ()
) -> AsyncIterator[tuple[harness.Node, DraKubeletStub, Instance, Instance]]:
    """A simulated node, the stub kubelet, two driver processes (not started), each with its
    own fake API server holding the node and claims A (gcu-0, gcu-1) and B (gcu-2, gcu-3)."""
    with harness.simulated_node() as where, FakeApiServer() as fa, FakeApiServer() as fb:
        for fake in (fa, fb):
            fake.add_node(NODE)
            fake.add_claim(harness.claim_document(*A, [("gcus", "gcu-0"), ("gcus", "gcu-1")]))
            fake.add_claim(harness.claim_document(*B, [("gcus", "gcu-2"), ("gcus", "gcu-3")]))
        a, b = Instance("a", where, fa, extra_a), Instance("b", where, fb, extra_b)
        stub = DraKubeletStub(where.registry)
        await stub.start()
        try:
            yield where, stub, a, b
        finally:
            await stub.stop()
            for instance in (a, b):
                await instance.stop()


def sockets(where: harness.Node) -> tuple[str, str]:
    """The shared socket names: service, registration."""
    return (
        os.path.join(where.plugins, "dra.sock"),
        os.path.join(where.registry, f"{DRIVER}-reg.sock"),
    )


async def devices_of(stub: DraKubeletStub, claim: tuple[str, str, str]) -> list[str]:
    answer = (await stub.prepare(DRIVER, [claim], timeout=20)).claims[claim[2]]
    assert answer.error == ""
    return [d.device_name for d in answer.devices]


@pytest.mark.parametrize(
    ("order", "stop_with"),
    [("one after the other", signal.SIGTERM), ("together", signal.SIGKILL)],
    ids=["a-then-b-SIGTERM", "together-SIGKILL"],
)
def test_one_instance_serves_the_other_stands_by_and_takes_over(
    order: str, stop_with: signal.Signals
) -> None:
    async def main() -> None:
        async with two_instances() as (where, stub, a, b):
            if order == "together":
                await asyncio.gather(a.start(), b.start())
            else:
                await a.start()
                await eventually(lambda: REGISTERED in a.log(), "a registered", 30)
                await b.start()
            both = (a, b)
            await eventually(
                lambda: (
                    sum(REGISTERED in i.log() for i in both) == 1
                    and sum(STANDBY in i.log() for i in both) == 1
                ),
                "one instance registered, the other standing by",
                30,
            )
            holder = a if REGISTERED in a.log() else b
            standby = b if holder is a else a
            # Not flapping: the same socket files, one registration, over a few seconds.
            before = [unix_sockets.identity(path) for path in sockets(where)]
            assert None not in before
            await asyncio.sleep(3)
            assert [unix_sockets.identity(path) for path in sockets(where)] == before
            assert stub.registrations == 1 and stub.refused == []
            text = standby.log()
            assert f"served by another enflame-dra-plugin (pid {holder.pid} on " in text, text
            assert text.count(STANDBY) == 1 and REGISTERED not in text
            assert "removing stale socket" not in text
            # The holder publishes; the standby has not said a word to its API server.
            await eventually(lambda: len(holder.fake.node_slices(NODE)) == 1, "holder published")
            assert standby.fake.requests == []
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]

            stopped_at = time.monotonic()
            code = await holder.signal(stop_with)
            assert code == (0 if stop_with == signal.SIGTERM else -signal.SIGKILL)
            await stub.wait_registered(DRIVER, count=2, timeout=10)
            took = time.monotonic() - stopped_at
            print(f"takeover after {stop_with.name}: {took:.2f} s")
            text = standby.log()
            assert "taking over" in text and REGISTERED in text, text
            assert "does not take" not in text  # the dying holder's sockets are not "older"
            # The new holder answers from the shared checkpoint and prepares more.
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]
            assert await devices_of(stub, B) == ["gcu-2", "gcu-3"]
            await eventually(lambda: len(standby.fake.node_slices(NODE)) == 1, "it publishes")
            await asyncio.sleep(1.5)
            assert stub.registrations == 2 and stub.refused == []
            assert await standby.signal(signal.SIGTERM) == 0
            assert os.listdir(where.registry) == []
            left = [n for n in os.listdir(where.plugins) if n.endswith((".sock", ".lock"))]
            assert left == ["serialize.lock"]  # no socket, no dra.sock.lock left behind

    asyncio.run(main())


def test_with_pod_uids_both_serve_side_by_side() -> None:
    uids = ("0f3c7e1e-5b8a-4b7e-9d5c-3a2f1e0d9c8b", "7d2e9a4b-1c3f-4e5d-8a6b-9c0d1e2f3a4b")

    async def main() -> None:
        async with two_instances(("--pod-uid", uids[0]), ("--pod-uid", uids[1])) as (
            where,
            stub,
            a,
            b,
        ):
            await asyncio.gather(a.start(), b.start())
            await eventually(
                lambda: REGISTERED in a.log() and REGISTERED in b.log(), "both registered", 30
            )
            assert stub.registrations == 2 and len(stub.plugins) == 2
            for instance in (a, b):
                assert STANDBY not in instance.log()
                await eventually(
                    lambda i=instance: len(i.fake.node_slices(NODE)) == 1,
                    f"{instance.name} published",
                )
            assert sorted(os.listdir(where.registry)) == sorted(
                f"{DRIVER}-{uid}-reg.sock" for uid in uids
            )
            assert not [n for n in os.listdir(where.plugins) if n.endswith(".sock.lock")]
            assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]
            for instance in (a, b):
                assert await instance.signal(signal.SIGTERM) == 0
            assert os.listdir(where.registry) == []

    asyncio.run(main())


# --- in one process: the lock's corner cases --------------------------------------------------


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


def test_a_live_socket_nobody_locked_is_left_alone_until_it_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older driver (no lock) serves dra.sock: we neither delete it nor register over it."""

    async def main() -> None:
        with harness.simulated_node() as where:
            endpoint, registration = sockets(where)
            os.makedirs(where.plugins)
            older = socket.socket(socket.AF_UNIX)
            older.bind(endpoint)
            older.listen()
            try:
                async with harness.running(where, harness.FakeClaims()) as run:
                    await _until(lambda: "does not take" in caplog.text, "it says why it waits")
                    await asyncio.sleep(0.6)  # past a standby retry
                    assert unix_sockets.listening(endpoint) and run.kubelet.registrations == 0
                    assert not os.path.exists(registration)
                    assert not run.plugin.serving.is_set() and run.plugin.standing_by.is_set()
                    assert caplog.text.count("does not take") == 1
                    os.unlink(endpoint)  # the older driver stops: its socket goes first
                    older.close()
                    await run.kubelet.wait_registered(DRIVER, timeout=10)
                    assert run.plugin.serving.is_set() and not run.plugin.standing_by.is_set()
            finally:
                older.close()

    with caplog.at_level(logging.INFO, logger="enflame_gcu.dra_plugin"):
        asyncio.run(main())


def test_a_cleanup_deleting_sockets_and_lock_still_leaves_exactly_one_instance_serving() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            settings = where.settings()
            source = harness.FakeClaims()
            source.add(harness.claim_document(*A, [("gcus", "gcu-0"), ("gcus", "gcu-1")]))
            plugins = []
            for _ in range(2):
                prepare, devices = harness.make_driver(where, source, settings)
                plugins.append(kubelet.KubeletPlugin(settings, prepare, devices))
            stop = asyncio.Event()
            stub = DraKubeletStub(where.registry)
            await stub.start()
            tasks = [asyncio.ensure_future(p.serve_until(stop)) for p in plugins]
            try:
                await stub.wait_registered(DRIVER, timeout=10)
                await _until(
                    lambda: (
                        sum(p.serving.is_set() for p in plugins) == 1
                        and sum(p.standing_by.is_set() for p in plugins) == 1
                    ),
                    "one serving, one standing by",
                )
                for directory in (where.plugins, where.registry):
                    for name in os.listdir(directory):
                        if name.endswith((".sock", ".sock.lock")):
                            os.unlink(os.path.join(directory, name))
                await stub.wait_registered(DRIVER, count=2, timeout=10)
                await asyncio.sleep(1.5)  # a fight would re-register about once a second
                assert stub.registrations == 2 and stub.refused == []
                assert sum(p.serving.is_set() for p in plugins) == 1
                assert sum(p.standing_by.is_set() for p in plugins) == 1
                assert all(unix_sockets.listening(path) for path in sockets(where))
                assert await devices_of(stub, A) == ["gcu-0", "gcu-1"]
            finally:
                await stub.stop()
                stop.set()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            assert [r for r in results if isinstance(r, BaseException)] == []
            assert os.listdir(where.registry) == []
            assert not [n for n in os.listdir(where.plugins) if n.endswith((".sock", ".sock.lock"))]

    asyncio.run(main())


def test_taking_over_rolls_back_the_prepare_the_holder_died_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The standby's own start-up recovery ran long ago: it recovers again when it takes over."""

    async def main() -> None:
        with harness.simulated_node() as where:
            settings = where.settings()
            source = harness.FakeClaims()
            source.add(harness.claim_document(*A, [("gcus", "gcu-0"), ("gcus", "gcu-1")]))
            source.add(harness.claim_document(*B, [("gcus", "gcu-1"), ("gcus", "gcu-2")]))
            stops = (asyncio.Event(), asyncio.Event())
            plugins = []
            for _ in stops:
                prepare, devices = harness.make_driver(where, source, settings)
                plugins.append(kubelet.KubeletPlugin(settings, prepare, devices))
            holder, standby = plugins
            stub = DraKubeletStub(where.registry)
            await stub.start()
            tasks = [asyncio.ensure_future(holder.serve_until(stops[0]))]
            try:
                await stub.wait_registered(DRIVER, timeout=10)
                tasks.append(asyncio.ensure_future(standby.serve_until(stops[1])))
                await _until(standby.standing_by.is_set, "the second instance standing by")

                def crash(at: str) -> None:
                    if at == "after-cdi":
                        raise harness.Crash(at)

                # The holder's Prepare of A dies between its two steps (as if killed there).
                dying, _ = harness.make_driver(where, source, settings, fault=crash)
                with contextlib.suppress(harness.Crash):
                    await dying.prepare([claims.ClaimRef(*A)])
                record = checkpoint.Checkpoint(os.path.join(where.plugins, "checkpoint.json"))
                assert record.load()["uid-a"].state == checkpoint.PREPARING
                stops[0].set()
                await stub.wait_registered(DRIVER, count=2, timeout=10)
                assert standby.serving.is_set()
                assert record.load() == {}
                assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a"))
                assert "rolled back the unfinished prepare of claim enflame/pair-a" in caplog.text
                # gcu-1 is free again for B at once, without waiting for A's retry.
                assert await devices_of(stub, B) == ["gcu-1", "gcu-2"]
            finally:
                await stub.stop()
                for stop in stops:
                    stop.set()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            assert [r for r in results if isinstance(r, BaseException)] == []

    with caplog.at_level(logging.INFO, logger="enflame_gcu.dra_plugin"):
        asyncio.run(main())
