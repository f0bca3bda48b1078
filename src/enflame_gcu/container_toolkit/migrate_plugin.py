"""topscloud's device plugin on ``enflame.sock``, handed over to ours with no gap in GCUs.

The kubelet keeps one endpoint per resource: when a plugin registers ``enflame.com/gcu`` again,
the new endpoint replaces the old, and the old one's stream ending then changes nothing. So the
handover moves the vendor's socket file aside (its server keeps serving the kubelet on the open
connection: the vendor's plugin does not watch its own socket), our plugin, standing by while a
foreign server held the path, serves and registers there at once, and only then may the
vendor's DaemonSet go. Running pods keep their cards when our device IDs (``gcu<minor>``) are
the vendor's: :func:`check_ids` compares them with the kubelet's checkpoint first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time

from enflame_gcu import fileio
from enflame_gcu.errors import InstallError
from enflame_gcu.support import socket_lock, unix_sockets

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
SOCKET = "enflame.sock"
LOCK_SUFFIX = socket_lock.LOCK_SUFFIX  # our plugin holds <socket>.lock while it runs
CHECKPOINT = "kubelet_internal_checkpoint"
RESOURCE = "enflame.com/gcu"
ASIDE = ".topscloud"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginSocket:
    """Who serves ``enflame.sock``: nobody, the vendor (alone or with ours standing by), us."""

    path: str  # as seen from here
    state: str  # "none", "vendor", "vendor-ours-waiting", "ours"


def _lock_mtime(path: str) -> float | None:
    """The time our plugin took the lock (it writes its line then); None when nobody holds it."""
    try:
        fd = os.open(path + LOCK_SUFFIX, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.fstat(fd).st_mtime
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def inspect(root: str, plugin_dir: str = PLUGIN_DIR) -> PluginSocket:
    """Who serves the plugin socket under ``root``.

    A socket that listens while no plugin of ours holds the lock is the vendor's; with our lock
    held, the socket is ours when it was made after the lock was taken (ours binds only once it
    holds the lock), the vendor's when it is older (ours stands by behind it).
    """
    path = fileio.resolve(root, os.path.join(plugin_dir, SOCKET), follow=False)
    if not unix_sockets.listening(path):
        return PluginSocket(path, "none")
    locked_at = _lock_mtime(path)
    if locked_at is None:
        return PluginSocket(path, "vendor")
    made = os.lstat(path).st_ctime
    return PluginSocket(path, "ours" if made >= locked_at else "vendor-ours-waiting")


def held_ids(root: str, plugin_dir: str = PLUGIN_DIR) -> tuple[set[str], set[str]]:
    """(device IDs the kubelet registered for the resource, IDs pods hold) from its checkpoint."""
    path = fileio.resolve(root, os.path.join(plugin_dir, CHECKPOINT))
    try:
        document = fileio.read_json(path)
    except FileNotFoundError:
        return set(), set()
    except (OSError, ValueError) as exc:
        raise InstallError(f"cannot read the kubelet's checkpoint {path}: {exc}") from exc
    data = document.get("Data") if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise InstallError(f"{path} is no kubelet device checkpoint (no Data)")
    registered = set((data.get("RegisteredDevices") or {}).get(RESOURCE) or ())
    held: set[str] = set()
    for entry in data.get("PodDeviceEntries") or ():
        if not isinstance(entry, dict) or entry.get("ResourceName") != RESOURCE:
            continue
        ids = entry.get("DeviceIDs") or ()
        # Kubelets from 1.20 key the IDs by NUMA node; older ones keep a plain list.
        for group in ids.values() if isinstance(ids, dict) else [ids]:
            held.update(str(i) for i in group or ())
    return {str(i) for i in registered}, held


def check_ids(root: str, ours: set[str], plugin_dir: str = PLUGIN_DIR) -> str | None:
    """Why handing over would lose pods their cards (IDs the vendor used that we do not
    advertise); None when every ID the kubelet knows is one of ours."""
    registered, held = held_ids(root, plugin_dir)
    strangers = sorted((registered | held) - ours)
    if not strangers:
        return None
    return (
        f"the kubelet knows {RESOURCE} devices {', '.join(strangers)} from the running plugin "
        f"that ours would not advertise (ours: {', '.join(sorted(ours)) or 'none'}): pods "
        "holding them would lose their accounting; not handed over"
    )


def hand_over(socket: PluginSocket, timeout: float) -> None:
    """Move the vendor's socket aside and wait for ours to serve the path; put it back (and
    raise InstallError) when ours does not within ``timeout`` seconds."""
    aside = socket.path + ASIDE
    vendor = os.lstat(socket.path).st_ino
    os.rename(socket.path, aside)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(socket.path).st_ino != vendor and unix_sockets.listening(socket.path):
                return
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        if not os.path.lexists(socket.path):
            os.rename(aside, socket.path)
    raise InstallError(
        f"our device plugin did not serve {socket.path} within {timeout:.0f} s; the vendor's "
        "socket was put back (is enflame-device-plugin running on this node?)"
    )
