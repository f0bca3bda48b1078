"""What the real-kubelet tier changes on the host, written down before it changes it, and undone.

The kubelet uses fixed host paths (``/var/lib/kubelet/device-plugins``, ``/var/log/pods``,
``/var/log/containers``), sets kernel sysctls, makes cgroups and a bind mount; containerd 1.6
fixes its shim socket dir at ``/run/containerd/s``; the ``--pass-device-specs`` scenario needs
real ``/dev/gcuN`` nodes. A :class:`Ledger` is saved to disk *before* each change, so that a
run killed half way is undone by the next one (or by ``python -m tests.kubelet.host restore``,
which ``make e2e`` runs on exit). :func:`snapshot` and :func:`differences` are the evidence
that the host is as it was.

Usage: ``python -m tests.kubelet.host {restore|check}`` (the ledger and the snapshot live in
the build cache, see scripts/e2e.sh).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

KUBELET_ROOT = "/var/lib/kubelet"
FIXED_DIRS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    # Kubelet defaults the tier moves to private dirs; watched so a regression shows.
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/var/lib/dockershim",
    "/var/lib/cni",
)
# Fixed dirs in which every new entry is the tier's (a host with a kubelet is refused).
KUBELET_OWNED = ("/var/log/pods", "/var/log/containers")
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
CGROUP_MOUNT = "/sys/fs/cgroup"
# The machine is shared with other test runs (their runc containers make cgroups and mounts of
# their own): only cgroups and mounts the kubelet tier could have made count as differences.
_SAVE_LOCK = threading.Lock()  # Ledger.save from several threads
OUR_CGROUPS = ("enflame-e2e-", "kubepods", "pod")
OUR_MOUNTS = ("/var/lib/kubelet", "/var/log", "/run/containerd", "/tmp/enf-kl-", "/usr/libexec")


def cache_dir() -> str:
    """Where the build, the ledger and the host snapshot live (outside the checkout)."""
    explicit = os.environ.get("ENFLAME_E2E_CACHE")
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/cache/enflame-e2e"
    return os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "enflame-e2e"
    )


def ledger_path() -> str:
    """The ledger of the run in progress (absent when nothing is left to undo)."""
    return os.path.join(cache_dir(), "ledger.json")


def snapshot_path() -> str:
    """The host as it was when the last run started."""
    return os.path.join(cache_dir(), "host-before.json")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def cgroup_hierarchies() -> list[str]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers and unified)."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4]
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2") and point.startswith(CGROUP_MOUNT):
                found.append(point)
    return sorted(set(found))


def mount_points() -> list[str]:
    """Every mount point of this mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return sorted({line.split()[4] for line in handle})


def _tree(path: str, limit: int = 2000) -> list[str] | None:
    """Relative paths of everything under ``path`` (None when it does not exist)."""
    if not os.path.lexists(path):
        return None
    entries: list[str] = []
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            entries.append(os.path.relpath(os.path.join(directory, name), path))
            if len(entries) >= limit:
                return sorted(entries)
    return sorted(entries)


def gcu_dev_nodes() -> list[str]:
    """/dev entries whose name says GCU (the host has none unless a test made them)."""
    with contextlib.suppress(OSError):
        return sorted(
            f"/dev/{name}" for name in os.listdir("/dev") if name.startswith(("gcu", "vgcu"))
        )
    return []


def snapshot() -> dict[str, Any]:
    """What the tier could change: sysctls, fixed dirs, cgroups, mounts, /dev nodes."""
    return {
        "sysctls": {name: _read(f"/proc/sys/{name}") for name in SYSCTLS},
        "fixed_dirs": {path: _tree(path) for path in FIXED_DIRS},
        "cgroups": {
            hierarchy: sorted(
                entry
                for entry in os.listdir(hierarchy)
                if os.path.isdir(os.path.join(hierarchy, entry))
            )
            for hierarchy in cgroup_hierarchies()
        },
        "mounts": mount_points(),
        "dev": gcu_dev_nodes(),
    }


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Human-readable differences between two snapshots (empty = the host is as it was)."""
    found = []
    for name, value in before["sysctls"].items():
        if after["sysctls"].get(name) != value:
            found.append(f"sysctl {name}: {value} -> {after['sysctls'].get(name)}")
    for path, tree in before["fixed_dirs"].items():
        now = after["fixed_dirs"].get(path)
        if now != tree:
            if tree is None or now is None:
                found.append(
                    f"{path}: {'absent' if tree is None else 'present'} -> "
                    f"{'absent' if now is None else 'present'}"
                )
            else:
                added = sorted(set(now) - set(tree))
                removed = sorted(set(tree) - set(now))
                found.append(f"{path}: added {added[:5]}, removed {removed[:5]}")
    for hierarchy, groups in before["cgroups"].items():
        added = sorted(set(after["cgroups"].get(hierarchy, [])) - set(groups))
        added = [name for name in added if name.startswith(OUR_CGROUPS)]
        if added:
            found.append(f"cgroups added under {hierarchy}: {added}")
    added_mounts = sorted(
        point
        for point in set(after["mounts"]) - set(before["mounts"])
        if point.startswith(OUR_MOUNTS)
    )
    if added_mounts:
        found.append(f"mounts added: {added_mounts}")
    if after["dev"] != before["dev"]:
        found.append(f"/dev GCU nodes: {before['dev']} -> {after['dev']}")
    return found


@dataclass
class Process:
    """A process we started, with enough of its command line to recognise it (PIDs recycle)."""

    pid: int
    argv0: str


@dataclass
class Ledger:
    """Everything the run changed or started, saved before each change."""

    path: str
    sysctls: dict[str, str | None] = field(default_factory=dict)
    created_dirs: list[str] = field(default_factory=list)
    private_dirs: list[str] = field(default_factory=list)
    dir_entries: dict[str, list[str]] = field(default_factory=dict)
    cgroup_name: str = ""
    dev_nodes: list[str] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    containerd_sockets: list[str] = field(default_factory=list)

    # -- persistence ------------------------------------------------------------------------

    def save(self) -> None:
        """Write the ledger atomically (called before every change it records)."""
        with _SAVE_LOCK:  # the chaos run's fault threads restart daemons concurrently
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            data = asdict(self)
            temporary = f"{self.path}.tmp"
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=1)
            os.replace(temporary, self.path)

    @classmethod
    def load(cls, path: str) -> Ledger | None:
        """The ledger a previous run left behind, if any."""
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return None
        data["processes"] = [Process(**entry) for entry in data.get("processes", [])]
        data["path"] = path
        return cls(**data)

    # -- recording --------------------------------------------------------------------------

    def begin(self) -> None:
        """Record the host values the kubelet may change and which fixed dirs exist."""
        self.sysctls = {name: _read(f"/proc/sys/{name}") for name in SYSCTLS}
        for path in KUBELET_OWNED:
            if os.path.isdir(path):
                self.dir_entries[path] = sorted(os.listdir(path))
        self.save()

    def will_create_dir(self, path: str) -> None:
        """Note a fixed host dir before something creates it (only when it is not there)."""
        known = path in self.dir_entries or path in self.created_dirs
        if not known and not os.path.lexists(path):
            self.created_dirs.append(path)
            self.save()

    def private_dir(self, path: str) -> str:
        """Note a private dir (removed whole at the end)."""
        self.private_dirs.append(path)
        self.save()
        return path

    def started(self, pid: int, argv0: str) -> None:
        """Note a process we started."""
        self.processes.append(Process(pid, argv0))
        self.save()

    def will_mknod(self, path: str) -> None:
        """Note a /dev node before making it."""
        self.dev_nodes.append(path)
        self.save()

    # -- undoing ----------------------------------------------------------------------------

    def restore(self) -> list[str]:
        """Undo everything recorded; returns what was done (for the log)."""
        done: list[str] = []
        done += self._stop_processes()
        done += self._unmount()
        done += self._remove_cgroups()
        for path in self.dev_nodes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                done.append(f"removed {path}")
        for path, entries in self.dir_entries.items():
            with contextlib.suppress(FileNotFoundError):
                for name in sorted(set(os.listdir(path)) - set(entries)):
                    _remove(os.path.join(path, name))
                    done.append(f"removed {os.path.join(path, name)}")
        for path in [*reversed(self.created_dirs), *reversed(self.private_dirs)]:
            if os.path.lexists(path):
                _remove(path)
                done.append(f"removed {path}")
        for name, value in self.sysctls.items():
            if value is not None and _read(f"/proc/sys/{name}") != value:
                with open(f"/proc/sys/{name}", "w", encoding="utf-8") as handle:
                    handle.write(value)
                done.append(f"sysctl {name} = {value}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        return done

    def _stop_processes(self) -> list[str]:
        done = []
        victims = [p.pid for p in self.processes if _matches(p)]
        victims += _shims(self.containerd_sockets)
        victims += _cgroup_tasks(self.cgroup_name)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                done.append(f"killed {pid}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in victims):
            time.sleep(0.05)
        return done

    def _unmount(self) -> list[str]:
        roots = [*self.private_dirs, *self.created_dirs, *self.dir_entries]
        done = []
        for point in sorted(mount_points(), key=len, reverse=True):
            ours = any(point == root or point.startswith(root + "/") for root in roots)
            if ours and subprocess.run(["umount", "-l", point], check=False).returncode == 0:
                done.append(f"unmounted {point}")
        return done

    def _remove_cgroups(self) -> list[str]:
        if not self.cgroup_name:
            return []
        done = []
        for hierarchy in cgroup_hierarchies():
            top = os.path.join(hierarchy, self.cgroup_name)
            if not os.path.isdir(top):
                continue
            for directory, _dirs, _files in sorted(
                os.walk(top), key=lambda item: len(item[0]), reverse=True
            ):
                for _ in range(50):  # a cgroup is busy for a moment after its last task exits
                    try:
                        os.rmdir(directory)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
            done.append(f"removed cgroup {top}")
        return done


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def _matches(process: Process) -> bool:
    argv = _cmdline(process.pid)
    return bool(argv) and argv[0].decode(errors="replace") == process.argv0


def _shims(sockets: list[str]) -> list[int]:
    """Shims started by our containerd (they name its socket on their command line)."""
    found = []
    wanted = [s.encode() for s in sockets]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = _cmdline(int(entry))
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and set(wanted) & set(argv):
                found.append(int(entry))
    return found


def _cgroup_tasks(name: str) -> list[int]:
    if not name:
        return []
    found: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        top = os.path.join(hierarchy, name)
        for directory, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                text = _read(os.path.join(directory, "cgroup.procs")) or ""
                found.update(int(pid) for pid in text.split())
    return sorted(found)


def recover() -> list[str]:
    """Undo what a previous run left recorded (no-op when it finished cleanly)."""
    ledger = Ledger.load(ledger_path())
    return ledger.restore() if ledger is not None else []


def main(argv: list[str]) -> int:
    """``restore``: undo a leftover ledger. ``check``: compare the host with the saved snapshot."""
    command = argv[0] if argv else ""
    if command == "restore":
        for line in recover():
            print(f"e2e host restore: {line}", file=sys.stderr)
        return 0
    if command == "check":
        try:
            with open(snapshot_path(), encoding="utf-8") as handle:
                before = json.load(handle)
        except FileNotFoundError:
            print(f"e2e host check: no snapshot at {snapshot_path()}", file=sys.stderr)
            return 2
        found = differences(before, snapshot())
        if os.path.exists(ledger_path()):
            found.append(f"a ledger of undone changes is left at {ledger_path()}")
        if found:
            print("e2e host check: the host differs from before the run:", file=sys.stderr)
            for line in found:
                print(f"  {line}", file=sys.stderr)
            return 1
        state = before
        print(
            "e2e host check: clean — sysctls "
            + ", ".join(f"{k}={v}" for k, v in state["sysctls"].items())
            + "; fixed dirs "
            + ", ".join(
                f"{path} {'absent' if tree is None else f'{len(tree)} entries'}"
                for path, tree in state["fixed_dirs"].items()
            )
            + f"; {sum(len(v) for v in state['cgroups'].values())} top-level cgroups and "
            + f"{len(state['mounts'])} mounts as before; /dev GCU nodes {state['dev'] or 'none'}"
        )
        return 0
    print("usage: python -m tests.kubelet.host {restore|check}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
