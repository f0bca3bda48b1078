"""Two plugin processes on one plugin dir: exactly one serves, the other stands by, no fight.

The rule: whoever holds ``<socket>.lock`` serves; another instance says once who does and waits,
and takes over within moments when that one stops (even when it is killed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import time
from collections.abc import Awaitable, Callable

import grpc
import pytest

from enflame_gcu.device_plugin import config, kubelet, runner, service
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub
from enflame_gcu.support import inotify, unix_sockets

STANDBY = "this instance stands by and takes over when that one stops"
Start = Callable[[plugin_process.PluginProcess, plugin_process.PluginProcess], Awaitable[None]]


def two_plugins(plugins: str, root: str) -> tuple[plugin_process.PluginProcess, ...]:
    """Two plugin processes on the same dirs, each logging to its own file."""
    result = []
    for name in ("a", "b"):
        plugin = plugin_process.PluginProcess(plugins, root)
        plugin.log_path = os.path.join(os.path.dirname(plugins), f"plugin-{name}.log")
        result.append(plugin)
    return tuple(result)


async def first_a_then_b(a: plugin_process.PluginProcess, b: plugin_process.PluginProcess) -> None:
    """A starts and registers; B comes later (a manual run, a second manifest)."""
    await a.start()
    for _ in range(400):
        if "registered enflame.com/gcu" in a.log_text():
            break
        await asyncio.sleep(0.025)
    await b.start()


async def first_b_then_a(a: plugin_process.PluginProcess, b: plugin_process.PluginProcess) -> None:
    """The same the other way round."""
    await first_a_then_b(b, a)


async def together(a: plugin_process.PluginProcess, b: plugin_process.PluginProcess) -> None:
    """Both at once (a DaemonSet surge pod starting while the old one comes up)."""
    await asyncio.gather(a.start(), b.start())


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 25 ms; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.025)


@pytest.mark.parametrize("start", [first_a_then_b, first_b_then_a, together])
def test_exactly_one_instance_serves_the_other_stands_by_and_takes_over(start: Start) -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        a, b = two_plugins(plugins, root)
        try:
            async with KubeletStub(plugins) as kubelet:
                await start(a, b)
                both = (a, b)
                await until(
                    lambda: (
                        sum("registered enflame.com/gcu" in p.log_text() for p in both) == 1
                        and sum(STANDBY in p.log_text() for p in both) == 1
                    ),
                    15,  # process start-up alone takes seconds on a loaded machine
                    "one instance registered, the other standing by",
                )
                serving = a if "registered enflame.com/gcu" in a.log_text() else b
                standby = b if serving is a else a
                await kubelet.wait_for(lambda k: k.capacity() == 4, 5, "four cards")
                settled = len(kubelet.registrations)
                await asyncio.sleep(1.5)  # a fight re-registers about once a second
                assert len(kubelet.registrations) == settled == 1
                assert kubelet.stream_ends == []
                pod = await kubelet.allocate_pod("p", {"main": 1})
                assert pod["main"].device_ids == ("gcu0",)
                assert "served by another enflame-device-plugin (pid " in standby.log_text()
                assert standby.log_text().count(STANDBY) == 1  # said once, not per retry
                assert all(p.process and p.process.returncode is None for p in both)

                # The serving one stops (rolling update deletes the old pod): the other takes over.
                stopped_at = time.monotonic()
                assert await serving.stop() == 0
                await kubelet.wait_for(
                    lambda k: len(k.registrations) == 2 and len(k.allocatable()) == 4,
                    5,
                    "the standby instance registered",
                )
                assert kubelet.registrations[-1].at - stopped_at < 2.0
                assert "taking over" in standby.log_text()
                assert await standby.stop() == 0
            assert os.listdir(plugins) == []  # no socket, no lock file left behind
        finally:
            for plugin in (a, b):
                await plugin.stop()
            shutil.rmtree(work)

    asyncio.run(main())


def test_a_killed_holder_is_replaced_by_the_standby() -> None:
    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        a, b = two_plugins(plugins, root)
        try:
            async with KubeletStub(plugins) as kubelet:
                await first_a_then_b(a, b)
                await until(lambda: STANDBY in b.log_text(), 15, "b standing by")
                killed_at = time.monotonic()
                a.send(signal.SIGKILL)  # no cleanup at all: stale socket and lock file stay
                await a.wait(5)
                await kubelet.wait_for(
                    lambda k: len(k.registrations) == 2 and len(k.allocatable()) == 4,
                    5,
                    "b registered",
                )
                assert kubelet.registrations[-1].at - killed_at < 2.0
                # The killed holder's lock goes a moment before its listener: not "an older
                # plugin", just the one that died.
                assert "does not take" not in b.log_text()
                assert await b.stop() == 0
        finally:
            for plugin in (a, b):
                await plugin.stop()
            shutil.rmtree(work)

    asyncio.run(main())


def test_a_live_socket_nobody_locked_is_left_alone_until_it_goes() -> None:
    """An older plugin without the lock serves enflame.sock: we do not delete its socket."""

    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        path = os.path.join(plugins, "enflame.sock")
        older = socket.socket(socket.AF_UNIX)
        older.bind(path)
        older.listen()
        plugin = plugin_process.PluginProcess(plugins, root)
        try:
            async with KubeletStub(plugins) as kubelet:
                await plugin.start()
                await until(
                    lambda: "does not take" in plugin.log_text(), 15, "the plugin says why it waits"
                )
                await asyncio.sleep(0.5)
                assert os.path.exists(path) and kubelet.registrations == []
                # The older plugin stops: its socket file goes first (unlinking after close
                # would race our plugin, which rightly removes a socket nobody answers on).
                os.unlink(path)
                older.close()
                await kubelet.wait_for(lambda k: k.capacity() == 4, 5, "registration")
        finally:
            older.close()
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


def test_a_kubelet_wiping_every_file_still_leaves_exactly_one_instance_serving() -> None:
    """Older kubelets removed every file in the plugin dir on restart, our lock file too."""

    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        a, b = two_plugins(plugins, root)
        try:
            async with KubeletStub(plugins) as kubelet:
                await first_a_then_b(a, b)
                await until(lambda: STANDBY in b.log_text(), 15, "b standing by")
                await kubelet.stop()
                for name in os.listdir(plugins):
                    os.unlink(os.path.join(plugins, name))
                await kubelet.start()
                await kubelet.wait_for(
                    lambda k: len(k.registrations) == 2 and len(k.allocatable()) == 4,
                    5,
                    "one re-registration",
                )
                await asyncio.sleep(1.5)
                assert len(kubelet.registrations) == 2
                assert sorted(os.listdir(plugins)) == [
                    "enflame.sock",
                    "enflame.sock.lock",
                    "kubelet.sock",
                ]
                assert all(p.process and p.process.returncode is None for p in (a, b))
        finally:
            for plugin in (a, b):
                assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())


@pytest.mark.parametrize("successor_binds", ["before the old server stops", "as it stops"])
def test_the_old_holder_stopping_never_removes_the_socket_its_successor_bound(
    successor_binds: str,
) -> None:
    """The interleaving behind a rare failure of the wipe test, forced in one process.

    A wipe deletes A's socket and lock; B takes the lock and binds the socket; A stops. gRPC
    deleted the bound path by name when A's server stopped (B's file by then), and A's own
    "still ours?" check ran after its listener closed, when B's new socket could carry A's old
    inode number (ext4 hands it out again at once). Either way the kubelet could not dial B.
    """
    work, root, plugins = plugin_process.make_node("flat-4card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)

    async def main() -> None:
        node = runner.NodeResources(cfg)
        a = kubelet.ResourceServer(cfg, node.state)
        b = kubelet.ResourceServer(cfg, node.state)
        async with KubeletStub(plugins, dial_timeout=2.0) as stub:
            try:
                assert a.lock.try_acquire()
                await a.start()
                for name in os.listdir(plugins):  # an older kubelet restarting: every file goes
                    if name != "kubelet.sock":
                        os.unlink(os.path.join(plugins, name))
                assert not a.lock.held() and b.lock.try_acquire()
                if successor_binds == "before the old server stops":
                    await b.start()
                else:  # B binds right after A's listener closed, before A's stop() returns
                    assert a._server is not None
                    real_stop = a._server.stop

                    async def stop_then_successor_binds(grace: float | None) -> None:
                        await real_stop(grace)
                        await b.start()

                    a._server.stop = stop_then_successor_binds  # type: ignore[method-assign]
                await a.stop()
                a.lock.release()
                assert unix_sockets.listening(cfg.socket_path), os.listdir(plugins)
                with inotify.ChangeWatcher([plugins]) as watcher:
                    assert await asyncio.wait_for(b.register(watcher), 10)
                await stub.wait_for(lambda k: len(k.allocatable()) == 4, 5, "B's four cards")
                assert len(stub.registrations) == 1
            finally:
                for server in (a, b):
                    await server.stop()
                    server.lock.release()
        assert os.listdir(plugins) == []  # B's socket and lock went with B; nothing else left

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(work)


@pytest.mark.parametrize("arrives", ["the successor's socket", "an older plugin's socket"])
def test_an_instance_binding_anew_never_replaces_a_socket_that_arrived_meanwhile(
    arrives: str,
) -> None:
    """The interleaving behind the wipe test's rare "registrations 1", every card Unhealthy.

    A wipe deletes A's socket, then its lock. A sees its socket gone while the lock file is
    still there, stops and binds anew; meanwhile the lock goes, B takes it, publishes its socket
    and calls Register. A's bind, renamed into place, replaced B's socket; A then saw its lock
    gone and removed that socket as its own. The kubelet, dialing inside B's Register, found
    nothing at the path for its whole 10 s timeout: no re-registration, the old stream's cards
    Unhealthy. Forced here in one process; the second case is the same race with an older
    plugin (no lock) binding the path while A binds, which A must not replace either.
    """
    work, root, plugins = plugin_process.make_node("flat-4card")
    cfg = config.PluginConfig(plugin_dir=plugins, host_root=root)
    older = socket.socket(socket.AF_UNIX)
    arrived: list[tuple[int, int] | None] = []

    async def main() -> None:
        node = runner.NodeResources(cfg)
        a = kubelet.ResourceServer(cfg, node.state)
        b = kubelet.ResourceServer(cfg, node.state)
        async with KubeletStub(plugins, dial_timeout=2.0) as stub:
            try:
                assert a.lock.try_acquire()
                await a.start()
                os.unlink(cfg.socket_path)  # the wipe's first file: A serves anew
                await a.stop()
                real_listen = a._listen

                async def listen_while_the_path_is_taken(
                    servicer: service.DevicePluginService,
                ) -> tuple[grpc.aio.Server, str]:
                    bound = await real_listen(servicer)
                    if arrives == "the successor's socket":
                        os.unlink(a.lock.path)  # the wipe's second file
                        assert b.lock.try_acquire()
                        await b.start()
                    else:
                        older.bind(cfg.socket_path)
                        older.listen()
                    arrived.append(unix_sockets.inode(cfg.socket_path))
                    return bound

                a._listen = listen_while_the_path_is_taken  # type: ignore[method-assign]
                try:
                    await a.start()
                except (kubelet.Occupied, kubelet.LockLost):
                    pass  # run() goes back to _take_lock: it stands by
                finally:
                    await a.stop()  # what A's loop does next; it removes only its own file
                    if not a.lock.held():  # as run() does: a wiped lock is let go
                        a.lock.release(unlink=False)
                # The file that arrived is still the one at the path, and it answers.
                assert arrived and unix_sockets.inode(cfg.socket_path) == arrived[0]
                assert unix_sockets.listening(cfg.socket_path), os.listdir(plugins)
                if arrives == "the successor's socket":
                    with inotify.ChangeWatcher([plugins]) as watcher:
                        assert await asyncio.wait_for(b.register(watcher), 10)
                    await stub.wait_for(lambda k: len(k.allocatable()) == 4, 5, "B's four cards")
                    assert len(stub.registrations) == 1
            finally:
                for server in (a, b):
                    await server.stop()
                    server.lock.release()
        if arrives == "the successor's socket":
            assert os.listdir(plugins) == []  # B's socket and lock went with B; nothing else left
        else:
            assert os.listdir(plugins) == ["enflame.sock"]  # the older plugin's, untouched

    try:
        asyncio.run(main())
    finally:
        older.close()
        shutil.rmtree(work)


def test_standing_by_behind_a_lockless_server_does_not_spin_on_its_own_lock_file() -> None:
    """Each look at a socket nobody locked takes and drops our lock, which creates and removes
    the lock file; those events are ours and must not wake the next look at once (they did:
    about ten lock files a second in the kubelet's plugin dir). Moving the socket aside, as
    enflame-ctk migrate does, still wakes the plugin at once."""

    async def main() -> None:
        work, root, plugins = plugin_process.make_node("flat-4card")
        path = os.path.join(plugins, "enflame.sock")
        older = socket.socket(socket.AF_UNIX)
        older.bind(path)
        older.listen()
        plugin = plugin_process.PluginProcess(plugins, root, ["--health-interval", "60"])
        try:
            async with KubeletStub(plugins) as stub:
                await plugin.start()
                await until(lambda: "does not take" in plugin.log_text(), 15, "standing by")
                window = 2.0
                lock_events = 0
                with inotify.ChangeWatcher([plugins]) as watcher:
                    deadline = time.monotonic() + window
                    while (left := deadline - time.monotonic()) > 0:
                        events = await watcher.wait(left)
                        lock_events += sum(1 for _, name in events if name == "enflame.sock.lock")
                # One look per STANDBY_INTERVAL; each creates, writes (close-write) and
                # removes the lock file: three events.
                looks = window / kubelet.STANDBY_INTERVAL + 1
                assert lock_events <= 3 * looks, f"{lock_events} lock file events in {window} s"
                assert stub.registrations == []
                os.rename(path, path + ".topscloud")
                await stub.wait_for(lambda k: k.capacity() == 4, 5, "takeover")
        finally:
            older.close()
            assert await plugin.stop() == 0
            shutil.rmtree(work)

    asyncio.run(main())
