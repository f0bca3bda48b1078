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

import base64
import contextlib
import dataclasses
import fcntl
import os
import socket
import stat
import struct
import time

from enflame_gcu import fileio
from enflame_gcu.errors import InstallError
from enflame_gcu.support import socket_lock, unix_sockets

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
SOCKET = "enflame.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
RESOURCE = "enflame.com/gcu"
ASIDE = ".topscloud"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginSocket:
    """Who serves ``enflame.sock``: nobody, the vendor (alone or with ours standing by), us,
    a listener we cannot see (another PID namespace, gone meanwhile): "unknown", or one that
    bound the file from another mount namespace than the kubelet's without the kubelet's
    plugin directory at the kubelet's path (not the vendor's DaemonSet): "foreign"."""

    path: str  # as seen from here
    state: str  # "none", "vendor", "vendor-ours-waiting", "ours", "unknown", "foreign"
    listener: str = ""  # who listens, for messages: "pid 123 (/usr/bin/x)"


_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags: the socket listens
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CONNECT_TIMEOUT = 2.0


def _peer_pid(path: str) -> int | None:
    """The pid of the process listening on the unix socket file ``path`` (SO_PEERCRED);
    None when nobody accepts or the kernel cannot name it here (pid 0: another namespace)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_CONNECT_TIMEOUT)
    try:
        probe.connect(path)
        raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None
    finally:
        probe.close()
    pid = _PEERCRED.unpack(raw)[0]
    return pid or None


def _listening_names(pid: int, proc: str = "/proc") -> list[str]:
    """The names the listening unix sockets of process ``pid`` were bound at, from its own
    network namespace's table, only for sockets that process holds (by inode)."""
    base = os.path.join(proc, str(pid))
    held = set()
    for fd in os.listdir(os.path.join(base, "fd")):
        with contextlib.suppress(OSError):
            link = os.readlink(os.path.join(base, "fd", fd))
            if link.startswith("socket:[") and link.endswith("]"):
                held.add(link[len("socket:[") : -1])
    table = fileio.read_regular(os.path.join(base, "net", "unix"), 64 << 20)
    names = []
    for line in table.decode("utf-8", "replace").splitlines()[1:]:
        fields = line.split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
        if len(fields) == 8 and fields[6] in held and int(fields[3], 16) & _ACCEPTING:
            names.append(fields[7])
    return names


def _bound_names(path: str, pid: int, proc: str = "/proc") -> list[str]:
    """The names process ``pid`` bound listening sockets at that are the file ``path`` itself
    (as topscloud's plugin binds it; ours binds a private name and renames it into place).

    Each name is looked up in the process's own mount namespace (``/proc/<pid>/root``) and
    compared with the file by device and inode: a socket bound at the same path string in a
    pod's emptyDir or another network namespace is not this file. OSError: cannot tell.
    """
    target = os.lstat(path)
    found = []
    for bound in _listening_names(pid, proc):
        # As bound: gRPC keeps the slashes of its unix:/// address ("///var/lib/...").
        if not bound.startswith("/"):
            continue
        name = os.path.normpath("/" + bound.lstrip("/"))  # POSIX keeps a leading "//"
        with contextlib.suppress(OSError):
            seen = os.lstat(os.path.join(proc, str(pid), "root") + name)
            if (seen.st_dev, seen.st_ino) == (target.st_dev, target.st_ino):
                found.append(name)
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """The mount namespace the plugin socket's listener is judged against: the kubelet's (the
    listener on ``kubelet.sock``, with the directory it bound that in), else PID 1's, else
    ours."""

    namespace: tuple[int, int]  # st_dev, st_ino of /proc/<pid>/ns/mnt
    plugin_dir: str | None  # where the kubelet bound kubelet.sock, as it sees it
    why: str  # whose namespace, for messages


def _namespace(pid: int | str, proc: str = "/proc") -> tuple[int, int]:
    info = os.stat(os.path.join(proc, str(pid), "ns", "mnt"))
    return info.st_dev, info.st_ino


def reference(local_dir: str, proc: str = "/proc") -> Reference:
    """The kubelet's mount namespace: that of the process the kernel names as the listener on
    ``kubelet.sock`` in ``local_dir`` (SO_PEERCRED: no process name is trusted). With no
    kubelet listening, PID 1's (the host's init, from the host's PID namespace, which
    SO_PEERCRED needs anyway), and where that cannot be read (no ptrace right over it), ours."""
    registration = os.path.join(local_dir, "kubelet.sock")
    pid = _peer_pid(registration) if unix_sockets.listening(registration) else None
    if pid is not None:
        with contextlib.suppress(OSError):
            names = _bound_names(registration, pid, proc)
            directory = os.path.dirname(names[0]) if names else None
            return Reference(_namespace(pid, proc), directory, f"the kubelet's (pid {pid})")
    with contextlib.suppress(OSError):
        return Reference(_namespace(1, proc), None, "PID 1's (no kubelet listens)")
    return Reference(
        _namespace("self", proc), None, "ours (no kubelet listens, PID 1's is unreadable)"
    )


def _kubelet_s_way(path: str, pid: int, names: list[str], ref: Reference, proc: str) -> bool:
    """Whether listener ``pid`` serves the file the way the vendor's plugin does: from the
    kubelet's mount namespace, or (its DaemonSet's hostPath) seeing the kubelet's plugin
    directory at the kubelet's path and binding ``enflame.sock`` there by name."""
    if _namespace(pid, proc) == ref.namespace:
        return True
    expected = ref.plugin_dir or os.path.dirname(path)
    here = os.lstat(os.path.dirname(path))
    for name in names:
        directory = os.path.dirname(name)
        if os.path.basename(name) != SOCKET or directory != expected:
            continue
        with contextlib.suppress(OSError):
            seen = os.lstat(os.path.join(proc, str(pid), "root") + directory)
            if (seen.st_dev, seen.st_ino) == (here.st_dev, here.st_ino):
                return True
    return False


def _describe(pid: int, proc: str = "/proc") -> str:
    try:
        exe = os.readlink(os.path.join(proc, str(pid), "exe"))
    except OSError:
        exe = "executable unknown"
    return f"pid {pid} ({exe})"


def _lock_held(path: str) -> bool:
    """Whether a process holds the socket's lock now; read with a shared lock tried, never
    waited on."""
    lock = path + socket_lock.LOCK_SUFFIX
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


# Ours, standing by behind a server that takes no lock of ours, takes the lock every 0.5 s and
# holds it 0.1 s while it looks (device_plugin.kubelet STANDBY_INTERVAL, LISTENER_GRACE), then
# lets it go: one look at any moment misses it five times in six.
_STANDBY_WINDOW = 1.6
_STANDBY_POLL = 0.02


def _ours_waiting(path: str, within: float = _STANDBY_WINDOW) -> bool:
    """Whether an instance of ours stands by at the socket: holds its lock (socket_lock) at
    some moment within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not _lock_held(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_STANDBY_POLL)
    return True


def inspect(root: str, plugin_dir: str = PLUGIN_DIR) -> PluginSocket:
    """Who serves the plugin socket under ``root``: the process the kernel names as its
    listener is the vendor's when it bound that very file (ours binds a private name first)
    from the kubelet's mount namespace or, as the vendor's DaemonSet does, with the kubelet's
    plugin directory at the kubelet's path (else "foreign"); ours stands by when it holds the
    socket's lock."""
    shown = os.path.join(plugin_dir, SOCKET)
    path = fileio.resolve(root, shown, follow=False)
    if not unix_sockets.listening(path):
        return PluginSocket(path, "none")
    pid = _peer_pid(path)
    if pid is None:
        return PluginSocket(path, "unknown", "a process this PID namespace cannot see")
    who = _describe(pid)
    try:
        names = _bound_names(path, pid)
    except OSError:
        return PluginSocket(path, "unknown", who)
    if not names:
        return PluginSocket(path, "ours", who)
    # The file alone is not enough: a process in a pod's mount namespace that reaches the
    # kubelet's directory by another mount (a hostPath elsewhere) binds that very file too.
    try:
        ref = reference(os.path.dirname(path))
        vendor_s_way = _kubelet_s_way(path, pid, names, ref, "/proc")
    except OSError as exc:
        return PluginSocket(path, "unknown", f"{who}, mount namespace: {exc.strerror or exc}")
    if not vendor_s_way:
        return PluginSocket(
            path,
            "foreign",
            f"{who}, in another mount namespace than {ref.why}, bound it as "
            f"{', '.join(names)}, not in the kubelet's plugin directory seen at "
            f"{ref.plugin_dir or plugin_dir}",
        )
    return PluginSocket(path, "vendor-ours-waiting" if _ours_waiting(path) else "vendor", who)


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


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of a protobuf message (number, bytes); ValueError if the
    bytes are no message. Varint and fixed fields are skipped (none matter here)."""
    fields, at = [], 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("truncated varint")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            varint()
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size = varint()
            if at + size > len(data):
                raise ValueError("truncated field")
            fields.append((number, data[at : at + size]))
            at += size
        else:
            raise ValueError(f"wire type {wire}")
    if at != len(data):
        raise ValueError("truncated message")
    return fields


def needs_the_runtime(response: bytes) -> bool:
    """Whether a checkpointed ContainerAllocateResponse gives its container cards only through
    ``ENFLAME_VISIBLE_DEVICES`` (no DeviceSpec, no CDI device): what topscloud's plugin answers
    without device specs, and what the kubelet hands the container again when it restarts."""
    fields = _fields(response)
    if any(number in (3, 5) for number, _ in fields):  # devices, cdi_devices
        return False
    for number, entry in fields:
        if number == 1:  # envs: map entries of key (1) and value (2)
            key = dict(_fields(entry)).get(1, b"")
            if key == b"ENFLAME_VISIBLE_DEVICES":
                return True
    return False


def env_only_holders(root: str, plugin_dir: str = PLUGIN_DIR) -> list[str]:
    """Containers the kubelet's checkpoint holds ``enflame.com/gcu`` for with an answer that
    needs the runtime to inject the cards (:func:`needs_the_runtime`): ``pod <uid>/<name>``."""
    path = fileio.resolve(root, os.path.join(plugin_dir, CHECKPOINT))
    try:
        document = fileio.read_json(path)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise InstallError(f"cannot read the kubelet's checkpoint {path}: {exc}") from exc
    data = document.get("Data") if isinstance(document, dict) else None
    found = []
    for entry in (data.get("PodDeviceEntries") or ()) if isinstance(data, dict) else ():
        if not isinstance(entry, dict) or entry.get("ResourceName") != RESOURCE:
            continue
        try:
            response = base64.b64decode(str(entry.get("AllocResp") or ""), validate=True)
            needed = needs_the_runtime(response)
        except ValueError:
            needed = True  # unreadable: keep what it might need
        if needed:
            found.append(f"pod {entry.get('PodUID')}/{entry.get('ContainerName')}")
    return sorted(set(found))


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


def hand_over(plugin: PluginSocket, timeout: float) -> None:
    """Move the vendor's socket aside and wait for ours to serve the path; put it back (and
    raise InstallError) when ours does not within ``timeout`` seconds."""
    aside = plugin.path + ASIDE
    vendor = os.lstat(plugin.path).st_ino
    # Checked again just before the move: never move a socket our plugin (or anyone but the
    # vendor's plugin found by survey) serves now.
    again = inspect("/", os.path.dirname(plugin.path))
    if again.path != plugin.path or not again.state.startswith("vendor"):
        raise InstallError(
            f"{plugin.path} is served by {again.listener or 'nobody'} now, not by the vendor's "
            "plugin found before: not moved"
        )
    os.rename(plugin.path, aside)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(plugin.path).st_ino != vendor and unix_sockets.listening(plugin.path):
                return
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        if not os.path.lexists(plugin.path):
            os.rename(aside, plugin.path)
    raise InstallError(
        f"our device plugin did not serve {plugin.path} within {timeout:.0f} s; the vendor's "
        "socket was put back (is enflame-device-plugin running on this node?)"
    )
