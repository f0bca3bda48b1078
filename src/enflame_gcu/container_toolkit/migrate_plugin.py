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
import os
import time

from enflame_gcu import fileio
from enflame_gcu.errors import InstallError
from enflame_gcu.support import unix_sockets

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
SOCKET = "enflame.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
RESOURCE = "enflame.com/gcu"
ASIDE = ".topscloud"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginSocket:
    """Who serves ``enflame.sock``: nobody, the vendor (alone or with ours standing by), us."""

    path: str  # as seen from here
    state: str  # "none", "vendor", "vendor-ours-waiting", "ours"


# A listening unix socket's row in /proc/net/unix: ``... Flags Type St Inode Path``.
_ACCEPTING = 0x10000  # __SO_ACCEPTCON in Flags: the socket listens


def _bound_at(names: set[str], proc: str = "/proc") -> bool:
    """Whether a listening unix socket was bound at one of ``names``, in any network namespace.

    Our plugin binds a private name and renames it into place (device_plugin.kubelet), so
    /proc/net/unix never shows ``enflame.sock`` for ours: a listener bound at that very path is
    another program's (topscloud's binds it directly).
    """
    wanted = {os.path.normpath(name) for name in names}
    seen: set[str] = set()
    try:
        pids = ["self", *(e for e in os.listdir(proc) if e.isdigit())]
    except OSError:
        pids = ["self"]
    for pid in pids:
        try:
            namespace = os.readlink(os.path.join(proc, pid, "ns", "net"))
        except OSError:
            continue
        if namespace in seen:
            continue
        seen.add(namespace)
        try:
            table = fileio.read_regular(os.path.join(proc, pid, "net", "unix"), 64 << 20)
        except OSError:
            continue
        for line in table.decode("utf-8", "replace").splitlines()[1:]:
            fields = line.split(None, 7)
            # As bound: gRPC keeps the slashes of its unix:/// address ("///var/lib/...").
            if (
                len(fields) == 8
                and int(fields[3], 16) & _ACCEPTING
                and os.path.normpath(fields[7]) in wanted
            ):
                return True
    return False


def _ours_running(plugin_dir: str, proc: str = "/proc") -> bool:
    """Whether an enflame-device-plugin of ours runs for ``plugin_dir`` (as seen from here)."""
    wanted = os.path.realpath(plugin_dir)
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return False
    for entry in entries:
        try:
            raw = fileio.read_regular(os.path.join(proc, entry, "cmdline"), 1 << 20)
        except OSError:
            continue
        theirs = _plugin_dir_of([w for w in raw.decode("utf-8", "replace").split("\0") if w])
        if theirs is not None and os.path.realpath(theirs) == wanted:
            return True
    return False


def _plugin_dir_of(argv: list[str]) -> str | None:
    """The --plugin-dir of an enflame-device-plugin command line; None for other programs."""
    names = [os.path.basename(word) for word in argv[:2]]
    if "enflame-device-plugin" not in names and "enflame_gcu.device_plugin.main" not in argv[:4]:
        return None
    for index, word in enumerate(argv):
        if word == "--plugin-dir" and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--plugin-dir="):
            return word.partition("=")[2]
    return PLUGIN_DIR


def inspect(root: str, plugin_dir: str = PLUGIN_DIR) -> PluginSocket:
    """Who serves the plugin socket under ``root``: a listener bound at the socket's own path
    is foreign (ours binds a private name first); whether ours stands by is read off /proc."""
    shown = os.path.join(plugin_dir, SOCKET)
    path = fileio.resolve(root, shown, follow=False)
    if not unix_sockets.listening(path):
        return PluginSocket(path, "none")
    if not _bound_at({shown, path}):
        return PluginSocket(path, "ours")
    waiting = _ours_running(os.path.dirname(path))
    return PluginSocket(path, "vendor-ours-waiting" if waiting else "vendor")


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
