"""A spoofed vendor plugin (issue 48 item 4): migrate and doctor decide by who really listens.

A pod may bind ``/var/lib/kubelet/device-plugins/enflame.sock`` in its own emptyDir (its own
mount namespace, the node's network namespace: the path string then shows in the node's
/proc/net/unix), and name a process ``enflame-device-plugin --plugin-dir ...``. Neither makes
our live socket the vendor's, nor a lone vendor plugin one that ours stands behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from enflame_gcu.container_toolkit import doctor, migrate, migrate_plugin
from enflame_gcu.simulation.testing import plugin_process
from enflame_gcu.simulation.testing.kubelet_stub import KubeletStub
from tests.container_toolkit.test_migrate_handover import CARDS, _serve_vendor

NOBODY = "65534"
# Binds <dir>/enflame.sock in the mount namespace it is started in and listens until killed.
_SPOOF = (
    "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
    "s.bind(sys.argv[1] + '/enflame.sock'); s.listen(); print('ready', flush=True); "
    "time.sleep(120)"
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="needs root, unshare and setpriv (a pod's own mount namespace)",
)


def _spoofer(plugin_dir: str) -> subprocess.Popen[str]:
    """An unprivileged process binding the vendor's path in a mount namespace of its own, over
    an empty directory (as a pod's emptyDir mounted at that path), in the node's network."""
    script = (
        f'mount -t tmpfs -o mode=1777 spoof "$1" && exec setpriv --reuid {NOBODY} '
        f'--regid {NOBODY} --clear-groups /usr/bin/python3 -c "$2" "$1"'
    )
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         plugin_dir, _SPOOF],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        _stop(process)
        pytest.fail("the spoofing listener did not start")
    return process


def _stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


@pytest.fixture
def node() -> Iterator[tuple[str, str]]:
    work, root, _ = plugin_process.make_node("vendor-8card")
    plugin_dir = os.path.join(root, "var/lib/kubelet/device-plugins")
    os.makedirs(plugin_dir)
    # A pod reaches the path through its own mounts; here the test's 0700 work directory
    # must let the unprivileged spoofer through to its own mount at plugin_dir.
    os.chmod(work, 0o755)  # noqa: S103 - root's directory, traversable as /var/lib is
    yield root, plugin_dir
    shutil.rmtree(work, ignore_errors=True)


def test_a_pods_socket_at_the_vendor_path_never_moves_ours(node: tuple[str, str]) -> None:
    root, plugin_dir = node
    socket_path = os.path.join(plugin_dir, "enflame.sock")
    kubelet = KubeletStub(plugin_dir)

    async def main() -> tuple[str, list[str], str]:
        await kubelet.start()
        process = plugin_process.PluginProcess(plugin_dir, root)
        await process.start()
        try:
            await kubelet.wait_for(lambda k: len(k.allocatable()) == 8, timeout=20)
            ours = os.lstat(socket_path).st_ino
            spoof = await asyncio.to_thread(_spoofer, plugin_dir)
            try:
                state = migrate_plugin.inspect(root).state
                done = await asyncio.to_thread(migrate.run, root, handover_timeout=5)
                checked = doctor.run(root)
            finally:
                _stop(spoof)
            assert os.lstat(socket_path).st_ino == ours  # never renamed aside
            assert not os.path.lexists(socket_path + migrate_plugin.ASIDE)
            names = [r.status for r in checked if r.name == "topscloud"]
            return state, done, ",".join(names)
        finally:
            await process.stop()
            await kubelet.stop()

    state, done, migration = asyncio.run(main())
    assert state == "ours"
    assert done == ["nothing of topscloud's left to migrate"]
    assert migration == "pass"
    assert len(kubelet.registrations) == 1


def test_a_process_named_like_our_plugin_is_not_ours_standing_by(node: tuple[str, str]) -> None:
    root, plugin_dir = node
    kubelet = KubeletStub(plugin_dir)
    # argv[0] and --plugin-dir as our plugin's; it is only a Python sleeping.
    named = subprocess.Popen(
        ["enflame-device-plugin", "-c", "import time; time.sleep(120)", "--plugin-dir",
         plugin_dir],
        executable=sys.executable,
    )  # fmt: skip

    async def main() -> tuple[str, list[str]]:
        await kubelet.start()
        server, servicer = await _serve_vendor(plugin_dir, CARDS)
        try:
            state = migrate_plugin.inspect(root).state
            done = await asyncio.to_thread(migrate.run, root, handover_timeout=5)
            return state, done
        finally:
            servicer.stop.set()
            await server.stop(0)
            await kubelet.stop()

    try:
        state, done = asyncio.run(main())
    finally:
        named.kill()
        named.wait()
    assert state == "vendor"
    assert any("left for later" in line and "ours is not running" in line for line in done)
    assert not os.path.lexists(os.path.join(plugin_dir, "enflame.sock" + migrate_plugin.ASIDE))


# Listens, then hands the socket to a child and exits: SO_PEERCRED names a process now gone.
_DAEMON = (
    "import os, socket, sys, time; s = socket.socket(socket.AF_UNIX); "
    "s.bind(sys.argv[1] + '/enflame.sock'); s.listen()\n"
    "if os.fork(): os._exit(0)\n"
    "print('ready', os.getpid(), flush=True); time.sleep(120)"
)


def test_a_listener_that_cannot_be_identified_is_reported_and_never_moved(
    node: tuple[str, str],
) -> None:
    root, plugin_dir = node
    socket_path = os.path.join(plugin_dir, "enflame.sock")
    process = subprocess.Popen(
        [sys.executable, "-c", _DAEMON, plugin_dir], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    child = 0
    try:
        word, child_pid = process.stdout.readline().split()
        assert word == "ready"
        child = int(child_pid)
        # The child says "ready" as its parent exits: a loaded machine may not have run that
        # exit yet, and a live parent still holds the socket (it was the vendor's then).
        assert process.wait(10) == 0
        before = os.lstat(socket_path).st_ino
        found = migrate_plugin.inspect(root)
        assert found.state == "unknown"
        assert main_migrate(root) == ["nothing of topscloud's left to migrate"]
        assert os.lstat(socket_path).st_ino == before
        checked = [r for r in doctor.run(root) if r.name == "topscloud"]
        assert [r.status for r in checked] == ["warn"]
        assert "cannot tell who serves" in checked[0].detail
    finally:
        if child:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        process.stdout.close()
        process.wait()


def main_migrate(root: str) -> list[str]:
    return migrate.run(root, handover_timeout=5)


# Binds <dir>/enflame.sock where it is started (the kubelet's directory reached through a mount
# of its own choosing) and listens until killed.
_ELSEWHERE = (
    "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
    "s.bind(sys.argv[1] + '/enflame.sock'); s.listen(); print('ready', flush=True); "
    "time.sleep(120)"
)


def _in_own_mount_namespace(plugin_dir: str, seen_at: str) -> subprocess.Popen[str]:
    """A root process in a mount namespace of its own (a pod's) that sees the kubelet's plugin
    directory at ``seen_at`` (a hostPath mounted there) and binds ``enflame.sock`` in it."""
    script = (
        'if [ "$3" != "$1" ]; then mount -t tmpfs pod "$(dirname "$3")" && mkdir -p "$3" '
        '&& mount --bind "$1" "$3" || exit 1; fi; exec /usr/bin/python3 -c "$2" "$3"'
    )
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         plugin_dir, _ELSEWHERE, seen_at],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        _stop(process)
        pytest.fail("the listener in its own mount namespace did not start")
    return process


def test_a_pod_binding_the_kubelet_s_file_through_its_own_mount_is_not_the_vendor(
    node: tuple[str, str],
) -> None:
    root, plugin_dir = node
    socket_path = os.path.join(plugin_dir, "enflame.sock")
    kubelet = KubeletStub(plugin_dir)  # the kubelet: this process, in this mount namespace
    elsewhere = os.path.join(os.path.dirname(root), "pod-view", "hostpath")
    os.makedirs(elsewhere)

    async def main() -> tuple[migrate_plugin.PluginSocket, list[str], list[doctor.Result]]:
        await kubelet.start()
        spoof = await asyncio.to_thread(_in_own_mount_namespace, plugin_dir, elsewhere)
        try:
            before = os.lstat(socket_path).st_ino
            found = migrate_plugin.inspect(root)
            done = await asyncio.to_thread(migrate.run, root, handover_timeout=5)
            checked = [r for r in doctor.run(root) if r.name == "topscloud"]
            assert os.lstat(socket_path).st_ino == before  # never moved
            assert not os.path.lexists(socket_path + migrate_plugin.ASIDE)
            return found, done, checked
        finally:
            _stop(spoof)
            await kubelet.stop()

    found, done, checked = asyncio.run(main())
    assert found.state == "foreign", found
    assert "another mount namespace than the kubelet's" in found.listener
    assert os.path.join(elsewhere, "enflame.sock") in found.listener
    assert len(done) == 1 and done[0].startswith("left as is:"), done
    assert "not served by the vendor's device plugin" in done[0]
    assert [r.status for r in checked] == ["warn"]
    assert "not the vendor's device plugin nor ours" in checked[0].detail


def test_the_vendor_s_daemonset_way_from_its_own_mount_namespace_is_the_vendor(
    node: tuple[str, str],
) -> None:
    root, plugin_dir = node
    kubelet = KubeletStub(plugin_dir)

    async def main() -> migrate_plugin.PluginSocket:
        await kubelet.start()
        # The kubelet's directory at the kubelet's path (its hostPath), bound there by name.
        vendor = await asyncio.to_thread(_in_own_mount_namespace, plugin_dir, plugin_dir)
        try:
            return migrate_plugin.inspect(root)
        finally:
            _stop(vendor)
            await kubelet.stop()

    found = asyncio.run(main())
    assert found.state == "vendor", found


def test_the_reference_namespace_is_the_kubelet_s_listener_else_pid_1_s_or_ours(
    node: tuple[str, str],
) -> None:
    _, plugin_dir = node
    ours = os.stat("/proc/self/ns/mnt")
    alone = migrate_plugin.reference(plugin_dir)
    assert alone.plugin_dir is None
    assert alone.why.startswith(("PID 1's", "ours")), alone.why
    # A kubelet in a mount namespace of its own: its namespace, not ours, is the reference.
    script = (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
        "s.bind(sys.argv[1] + '/kubelet.sock'); s.listen(); print('ready', flush=True); "
        "time.sleep(120)"
    )
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/usr/bin/python3", "-c", script,
         plugin_dir],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        found = migrate_plugin.reference(plugin_dir)
        theirs = os.stat(f"/proc/{process.pid}/ns/mnt")
    finally:
        _stop(process)
    assert found.namespace == (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino)
    assert found.plugin_dir == plugin_dir
    assert found.why == f"the kubelet's (pid {process.pid})"
