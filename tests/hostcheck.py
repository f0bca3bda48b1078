"""The host before and after ``make test``: what the unit suite could leave behind, compared.

The tiers (``make e2e``, ``make e2e-cluster``) have their own ledger and check
(``tests.kubelet.host``); this is the same idea for the unit suite, which runs real runc,
containerd, podman and the daemons on simulated nodes and must leave the machine as it found
it. ``scripts/pytest.sh`` takes a snapshot before pytest starts (outside the suite's private
mount namespace) and checks after it ends, when ``ENFLAME_HOST_CHECK=1`` (``make test`` sets
it). A difference is printed one line each and fails the run.

What is compared: the mount points of the host's mount namespace; the CDI directories, the
engines' configuration directories and every ``enflame*`` path under /run, /var/run, /etc,
/var/lib and /var/log; the cgroups directly under each hierarchy; the ``/dev/gcu*`` nodes; and
processes started during the run that are still alive (ours or the tools the tests drive).
Things that only live for a moment (another job's container on a shared machine) are given a
few seconds to go before they count (``ENFLAME_HOST_CHECK_SETTLE``, default 10).

Usage: ``python -m tests.hostcheck snapshot FILE`` then ``python -m tests.hostcheck check FILE``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any

# Whole trees compared entry by entry (absent is a state too).
WATCHED_TREES = (
    "/run/cdi",
    "/var/run/cdi",
    # runc's default state root and containerd's fixed shim socket dir (engines we start).
    "/run/runc",
    "/run/containerd",
    "/etc/cdi",
    "/etc/docker",
    "/etc/containerd",
    "/etc/crio",
    "/etc/containers/oci/hooks.d",
    "/var/lib/kubelet",
)
# Globs whose matches are ours by name.
WATCHED_GLOBS = (
    "/run/enflame*",
    "/var/run/enflame*",
    "/etc/enflame*",
    "/var/lib/enflame*",
    "/var/log/enflame*",
    "/opt/enflame*",
    "/usr/local/bin/enflame*",
    "/etc/systemd/system/enflame*",
)
CGROUP_ROOT = "/sys/fs/cgroup"
# A process started during the run that is still alive counts when its command line names one
# of these (the programs and tools the suite starts).
PROCESS_WORDS = (
    "enflame",
    "runc",
    "containerd",
    "podman",
    "conmon",
    "prometheus",
    "kubelet",
    "efsmi",
    "busybox",
)
TREE_LIMIT = 5000
SETTLE_SECONDS = 10.0


def _tree(path: str) -> list[str] | None:
    """Relative paths under ``path`` (None when it does not exist); a file is ``["."]``."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path) or os.path.islink(path):
        return ["."]
    entries: list[str] = []
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            entries.append(os.path.relpath(os.path.join(directory, name), path))
            if len(entries) >= TREE_LIMIT:
                return sorted(entries)
    return sorted(entries)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return sorted({line.split()[4] for line in handle})


def _cgroups() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    if not os.path.isdir(CGROUP_ROOT):
        return found
    for hierarchy in sorted(os.listdir(CGROUP_ROOT)):
        path = os.path.join(CGROUP_ROOT, hierarchy)
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                found[hierarchy] = sorted(
                    entry for entry in os.listdir(path) if os.path.isdir(os.path.join(path, entry))
                )
            except OSError:
                continue
    return found


def _boot_ticks() -> int:
    """Clock ticks since boot now (the unit of a process's start time in /proc/PID/stat)."""
    with open("/proc/uptime", encoding="ascii") as handle:
        return int(float(handle.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _processes() -> dict[int, tuple[int, str]]:
    """``{pid: (start time in ticks, command line)}`` of every process."""
    found: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry)] = (int(fields[19]), cmdline)  # field 22 of stat: starttime
    return found


def snapshot() -> dict[str, Any]:
    """The host as the unit suite could change it."""
    globbed = sorted({match for pattern in WATCHED_GLOBS for match in glob.glob(pattern)})
    return {
        "taken_at_ticks": _boot_ticks(),
        "mounts": _mount_points(),
        "trees": {path: _tree(path) for path in WATCHED_TREES},
        "ours": {path: _tree(path) for path in globbed},
        "cgroups": _cgroups(),
        "dev": sorted(glob.glob("/dev/gcu*")),
    }


def _tree_change(path: str, before: list[str] | None, after: list[str] | None) -> str | None:
    if before == after:
        return None
    if before is None or after is None:
        return f"{path}: {'absent' if before is None else 'present'} -> " + (
            "absent" if after is None else f"present ({len(after)} entries)"
        )
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    return f"{path}: added {added[:5]}, removed {removed[:5]}"


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per difference (empty: the host is as it was)."""
    found = []
    added_mounts = sorted(set(after["mounts"]) - set(before["mounts"]))
    removed_mounts = sorted(set(before["mounts"]) - set(after["mounts"]))
    if added_mounts:
        found.append(f"mounts added: {added_mounts}")
    if removed_mounts:
        found.append(f"mounts gone: {removed_mounts}")
    for path, tree in before["trees"].items():
        change = _tree_change(path, tree, after["trees"].get(path))
        if change:
            found.append(change)
    for path in sorted(set(before["ours"]) | set(after["ours"])):
        change = _tree_change(path, before["ours"].get(path), after["ours"].get(path))
        if change:
            found.append(change)
    for hierarchy, groups in after["cgroups"].items():
        added = sorted(set(groups) - set(before["cgroups"].get(hierarchy, [])))
        if added:
            found.append(f"cgroups added under {CGROUP_ROOT}/{hierarchy}: {added}")
    if after["dev"] != before["dev"]:
        found.append(f"/dev GCU nodes: {before['dev']} -> {after['dev']}")
    return found


def stray_processes(since_ticks: int) -> list[str]:
    """Processes started since the snapshot, still alive, that the suite could have started."""
    mine = {os.getpid(), os.getppid()}
    found = []
    for pid, (started, cmdline) in sorted(_processes().items()):
        if pid in mine or started < since_ticks:
            continue
        if any(word in cmdline for word in PROCESS_WORDS) and "tests.hostcheck" not in cmdline:
            found.append(f"process {pid} still running: {cmdline[:200]}")
    return found


def check(before: dict[str, Any], settle: float = SETTLE_SECONDS) -> list[str]:
    """Differences that are still there after ``settle`` seconds (transient ones may go)."""
    deadline = time.monotonic() + settle
    while True:
        found = differences(before, snapshot()) + stray_processes(before["taken_at_ticks"])
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print("usage: python -m tests.hostcheck {snapshot|check} FILE", file=sys.stderr)
        return 2
    command, path = argv
    if command == "snapshot":
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(snapshot(), handle)
        return 0
    with open(path, encoding="utf-8") as handle:
        before = json.load(handle)
    found = check(before, float(os.environ.get("ENFLAME_HOST_CHECK_SETTLE", SETTLE_SECONDS)))
    for line in found:
        print(f"host check: {line}", file=sys.stderr)
    print(
        "host check: clean" if not found else f"host check: {len(found)} difference(s)",
        file=sys.stderr,
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
