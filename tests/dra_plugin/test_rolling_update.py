"""Two driver instances on one node, as during a rolling update with surge (DRA.md §1).

Both share the plugin directory, hence the checkpoint: each call holds ``serialize.lock`` and
reads the record afresh, so what one instance prepared the other sees at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import threading

import pytest

from enflame_gcu.dra_plugin import claim_cdi, claims, driver, kubelet
from enflame_gcu.dra_plugin import config as dra_config
from enflame_gcu.simulation.testing import dra_kubelet_stub
from tests.dra_plugin import harness

A = claims.ClaimRef("enflame", "pair-a", "uid-a")
B = claims.ClaimRef("enflame", "pair-b", "uid-b")


def source_with_claims() -> harness.FakeClaims:
    source = harness.FakeClaims()
    source.add(
        harness.claim_document(A.namespace, A.name, A.uid, [("gcus", "gcu-0"), ("gcus", "gcu-1")])
    )
    source.add(
        harness.claim_document(B.namespace, B.name, B.uid, [("gcus", "gcu-1"), ("gcus", "gcu-2")])
    )
    return source


def test_what_one_instance_prepared_the_other_refuses_and_can_unprepare() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            source = source_with_claims()
            old, _ = harness.make_driver(where, source)
            new, _ = harness.make_driver(where, source)
            assert isinstance((await old.prepare([A]))["uid-a"], list)
            refused = (await new.prepare([B]))["uid-b"]
            assert isinstance(refused, str)
            assert "gcu-1 is already prepared for claim enflame/pair-a" in refused
            # The kubelet may send Unprepare to the other instance.
            assert await new.unprepare([A]) == {"uid-a": ""}
            assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a"))
            prepared = (await old.prepare([B]))["uid-b"]
            assert [d.device for d in prepared] == ["gcu-1", "gcu-2"]  # type: ignore[union-attr]
            assert set(new.checkpoint.load()) == {"uid-b"} == set(old.prepared)

    asyncio.run(main())


def test_a_call_waits_while_another_instance_holds_the_lock() -> None:
    async def main() -> None:
        with harness.simulated_node() as where:
            driver, _ = harness.make_driver(where, source_with_claims())
            fd = os.open(driver.lock_path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # the other instance, mid-call
                call = asyncio.ensure_future(driver.prepare([A]))
                await asyncio.sleep(0.3)
                assert not call.done()
                assert not os.path.exists(claim_cdi.spec_path(where.cdi, "uid-a"))
            finally:
                os.close(fd)
            outcome = await asyncio.wait_for(call, 10)
            assert [d.device for d in outcome["uid-a"]] == ["gcu-0", "gcu-1"]  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_starting_instance_does_not_roll_back_a_prepare_in_flight() -> None:
    with harness.simulated_node() as where:
        source = source_with_claims()
        first, _ = harness.make_driver(where, source)
        fd = os.open(first.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # an instance inside a Prepare
            recovered: list[list[str]] = []
            second = threading.Thread(
                target=lambda: recovered.append(harness.make_driver(where, source)[0].recover())
            )
            second.start()
            second.join(0.3)
            assert second.is_alive() and not recovered  # it waits for the call to finish
        finally:
            os.close(fd)
        second.join(10)
        assert recovered == [[]]


def test_socket_names_carry_the_pod_uid_as_the_kubelet_expects() -> None:
    settings = dra_config.DraConfig(node_name="n", pod_uid="0f3c7e1e-5b8a-4b7e-9d5c-3a2f1e0d9c8b")
    assert settings.registration_socket == (
        "/var/lib/kubelet/plugins_registry/gcu.enflame.com-0f3c7e1e-5b8a-4b7e-9d5c-3a2f1e0d9c8b"
        "-reg.sock"
    )
    assert settings.endpoint == (
        "/var/lib/kubelet/plugins/gcu.enflame.com/dra-0f3c7e1e-5b8a-4b7e-9d5c-3a2f1e0d9c8b.sock"
    )
    plain = dra_config.DraConfig(node_name="n")
    assert plain.registration_socket == "/var/lib/kubelet/plugins_registry/gcu.enflame.com-reg.sock"
    assert plain.endpoint == "/var/lib/kubelet/plugins/gcu.enflame.com/dra.sock"


def test_a_pod_uid_socket_name_is_shortened_to_fit_the_unix_socket_limit() -> None:
    uid = "0f3c7e1e-5b8a-4b7e-9d5c-3a2f1e0d9c8b"
    deep = "/" + "/".join(["kubelet-root"] * 4)
    settings = dra_config.DraConfig(
        node_name="n", pod_uid=uid, registry_dir=deep, plugin_dir=f"{deep}/plugins/gcu"
    )
    for path in (settings.registration_socket, settings.endpoint):
        assert len(path.encode()) <= dra_config.MAX_SOCKET_PATH
    name = os.path.basename(settings.registration_socket)
    assert name.startswith("gcu.enflame.com-0f3c7e1e") and name.endswith("-reg.sock")
    assert name != "gcu.enflame.com-reg.sock"


def serving(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


@pytest.mark.parametrize("successor_binds", ["before the old servers stop", "as they stop"])
def test_the_old_instance_stopping_never_removes_the_sockets_its_successor_bound(
    successor_binds: str,
) -> None:
    """Two instances on the same socket names (no pod UID), the interleaving forced in one process.

    A wipe deletes A's sockets and its lock file (a cleanup script); B takes the new lock and
    binds both; A notices and stops. gRPC deletes the path it bound, by name, when a server
    stops (B's file by then), and a "still ours?" check made after A's listener closed may see
    B's socket carry A's old inode number.
    """

    async def main() -> None:
        with harness.simulated_node() as where:
            settings = where.settings()

            def instance() -> kubelet.KubeletPlugin:
                prepare, devices = harness.make_driver(where, source_with_claims(), settings)
                return kubelet.KubeletPlugin(settings, prepare, devices)

            a, b = instance(), instance()
            assert a.lock is not None and b.lock is not None
            try:
                assert a.lock.try_acquire() and not b.lock.try_acquire()
                await a.start()
                for directory in (settings.registry_dir, settings.data_dir):
                    for name in os.listdir(directory):  # a cleanup script: sockets and lock go
                        path = os.path.join(directory, name)
                        if name.endswith((".sock", ".lock")) and name != driver.LOCK_FILE:
                            os.unlink(path)
                assert a.restart_reason() is not None and b.lock.try_acquire()
                if successor_binds == "before the old servers stop":
                    await b.start()
                else:  # B binds right after A's listeners closed, before A's stop() returns
                    servers = list(a._servers)
                    real_stop = servers[0].stop

                    async def stop_then_successor_binds(grace: float | None) -> None:
                        await real_stop(grace)
                        await b.start()

                    servers[0].stop = stop_then_successor_binds  # type: ignore[method-assign]
                await a.stop()
                a.lock.release()
                assert b.restart_reason() is None
                for path in (settings.endpoint, settings.registration_socket):
                    assert serving(path), (path, os.listdir(os.path.dirname(path)))
                stub = dra_kubelet_stub.DraKubeletStub(settings.registry_dir)
                await stub.start()
                try:
                    await stub.wait_registered(settings.driver_name)
                    answer = await stub.prepare(
                        settings.driver_name, [(A.namespace, A.name, A.uid)]
                    )
                    assert answer.claims["uid-a"].error == ""
                finally:
                    await stub.stop()
            finally:
                await a.stop()
                await b.stop()
                a.lock.release()
                b.lock.release()
            leftovers = os.listdir(settings.registry_dir) + [
                n for n in os.listdir(settings.data_dir) if n.endswith((".sock", ".sock.lock"))
            ]
            assert leftovers == []  # B's sockets went with B; nothing else is left

    asyncio.run(main())
