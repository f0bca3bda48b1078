"""Simulated GCU nodes for the real-cluster tier: each a real kubelet with its own containerd 1.6,
both in one private mount namespace per node, registered with a :class:`ControlPlane`.

Per node, a holder process (``unshare --mount``) owns the mount namespace; containerd and the
kubelet enter it (``nsenter --mount``), so the shims, runc and every container of that node see
the same private view:

- ``/var/lib/kubelet`` (the kubelet's fixed device-plugin dir and its default root, which the
  DaemonSets' hostPaths name), ``/var/log/pods``, ``/var/log/containers``, ``/var/lib/cni``,
  ``/etc/enflame-gcu``, ``/etc/kubernetes`` and ``/etc/containerd``: the node's own dirs, bound
  over empty mount points the ledger creates on the host (when missing) and removes after;
- ``/run``: a tmpfs of the node's own, holding ``/run/containerd`` (a private dir bound there,
  so the socket is reachable from outside) and everything containerd keeps there;
- a node with the ``k3s`` layout (:data:`LAYOUTS`) runs its containerd where k3s runs its own:
  the config under a private ``/var/lib/rancher``, the socket in ``/run/k3s/containerd``;
- ``/sys``: the machine's sysfs entries, except that the simulated board's PCI root complexes,
  ``/sys/bus/pci/devices`` and ``/sys/module/enflame`` stand in their places (bound from the
  simulated tree, so unplugging a card there shows at once), so the guide's manifests run
  unchanged: the plugin's ``/sys`` and ``/dev`` hostPaths, the toolkit's ``/``;
- ``/dev``: a tmpfs of the node's own with the machine's entries bound into it and the node's
  simulated ``gcuN``/``gcuctl``/``vgcuN`` bound from its tree, so the kubelet's DeviceSpecs
  (``/dev/gcuN``) resolve to this node's cards and no node sees another's.

The whole tier runs in a private network namespace (``scripts/e2e-cluster.sh``), so the CNI
bridges, veths and routes of the pod network vanish with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing import oci_image
from tests.cluster.controlplane import ControlPlane, free_port
from tests.kubelet import harness
from tests.kubelet.host import Ledger

SIM_MOUNT = "/run/enflame-e2e-sim"
# Host paths each node sees privately (bound over mount points the ledger creates if missing).
PRIVATE_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/etc/enflame-gcu",
    "/etc/kubernetes",
    "/etc/containerd",
)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a node's containerd reads its config and listens (host paths inside the node)."""

    config: str
    socket: str
    private: tuple[str, ...] = ()  # more host paths the node keeps privately
    binary: str = ""  # where containerd's binary is (the machine's own where empty)

    @property
    def run_dir(self) -> str:
        """The socket's directory, made inside the node's own tmpfs at /run (the machine's /run
        is shared with other jobs, whose containerd tests create and remove /run/containerd)."""
        return os.path.dirname(self.socket)


LAYOUTS = {
    # Debian's (and kubeadm's) containerd.
    "stock": Layout("/etc/containerd/config.toml", "/run/containerd/containerd.sock"),
    # k3s's embedded containerd: the config.toml k3s renders (from its template, when there is
    # one) and the socket k3s gives it; k3s itself is not here, so nothing renders a template.
    # Its binary is k3s's own, not on PATH: the machine's /usr/bin/containerd is masked there.
    "k3s": Layout(
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "/run/k3s/containerd/containerd.sock",
        ("/var/lib/rancher",),
        "/var/lib/rancher/k3s/data/current/bin/containerd",
    ),
}


@dataclass(frozen=True, slots=True)
class Binaries:
    """Everything a node runs."""

    kubelet: str
    pause: str
    cni_dir: str
    containerd: str
    ctr: str
    runc: str
    busybox: str


def make_cgroup(path: str) -> None:
    """A cgroup in every hierarchy (a new v1 cpuset copies its parent's cpus and mems)."""
    from tests.kubelet import host

    for hierarchy in host.cgroup_hierarchies():
        parent = hierarchy
        for part in path.strip("/").split("/"):
            current = os.path.join(parent, part)
            os.makedirs(current, exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                source = os.path.join(parent, knob)
                target = os.path.join(current, knob)
                if os.path.exists(source) and os.path.exists(target):
                    with open(target, encoding="utf-8") as handle:
                        if handle.read().strip():
                            continue
                    with open(source, encoding="utf-8") as handle:
                        value = handle.read().strip()
                    with open(target, "w", encoding="utf-8") as handle:
                        handle.write(value)
            parent = current


# systemd's unit for each daemon on a real node restarts it when it exits: kubeadm's
# kubelet.service and containerd's own containerd.service (Restart=always, RestartSec=10 and 5).
RESTART_SEC = {"kubelet": 10.0, "containerd": 5.0}


@dataclass
class Supervised:
    """One daemon of a node, started again ``restart_sec`` after it exits by itself, as systemd's
    ``Restart=always`` does: a kubelet that exits at its start because containerd is down (a
    kubelet restarted while containerd restarts) comes back once containerd does, as on a node.

    :meth:`stop` (a deliberate stop: a fault's kill, the node's teardown) is never undone;
    :meth:`start` begins supervising a new process. ``exits`` records each exit it restarted
    after (``(monotonic time, exit status)``)."""

    name: str
    spawn: Callable[[], subprocess.Popen[bytes]]
    restart_sec: float
    process: subprocess.Popen[bytes] | None = None
    exits: list[tuple[float, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> subprocess.Popen[bytes]:
        """Spawn the daemon and watch it."""
        with self._lock:
            self._stopped.clear()
            process = self.process = self.spawn()
        threading.Thread(target=self._watch, args=(process,), daemon=True,
                         name=f"supervise-{self.name}-{process.pid}").start()  # fmt: skip
        return process

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        while True:
            status = process.wait()
            with self._lock:
                if self._stopped.is_set() or self.process is not process:
                    return  # stopped on purpose, or replaced by a fault's restart
                self.exits.append((time.monotonic(), status))
            if self._stopped.wait(self.restart_sec):
                return
            with self._lock:
                if self._stopped.is_set() or self.process is not process:
                    return
                process = self.process = self.spawn()

    def stop(self, kill: bool = True, timeout: float = 15) -> None:
        """Stop supervising and end the process (SIGKILL, or SIGTERM then SIGKILL)."""
        with self._lock:
            self._stopped.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if kill:
                process.kill()
            else:
                process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class ClusterNode:
    """One simulated GCU node: mount namespace, containerd, kubelet (registered as ``name``)."""

    def __init__(
        self,
        plane: ControlPlane,
        ledger: Ledger,
        binaries: Binaries,
        work: str,
        name: str,
        *,
        topology: str,
        subnet: str,
        cgroup_root: str,
        node_ip: str,
        layout: str = "stock",
    ) -> None:
        self.plane = plane
        self.ledger = ledger
        self.binaries = binaries
        self.work = work
        self.name = name
        self.topology = topology
        self.subnet = subnet
        self.cgroup_root = cgroup_root
        self.node_ip = node_ip
        self.layout = LAYOUTS[layout]
        self.sim_root = os.path.join(work, "sim")
        self.holder: subprocess.Popen[bytes] | None = None
        self.daemons = {
            "containerd": Supervised("containerd", self._containerd_process,
                                     RESTART_SEC["containerd"]),
            "kubelet": Supervised("kubelet", self._kubelet_process, RESTART_SEC["kubelet"]),
        }  # fmt: skip
        self.kubelet_command: list[str] = []
        self.ctd_dir = os.path.join(work, "ctd")
        # containerd listens where its layout says (on a stock node its own /run/containerd), so
        # the toolkit finds it as on any such node; from outside the node it is the private dir's.
        self.socket = os.path.join(
            self.private(self.layout.run_dir), os.path.basename(self.layout.socket)
        )
        self.kubelet_port = free_port()
        self.healthz_port = free_port()

    # -- the namespace ----------------------------------------------------------------------

    def private(self, path: str) -> str:
        """Where this node's private copy of host ``path`` lives."""
        return os.path.join(self.work, "private", path.strip("/").replace("/", "_"))

    def seen_from_here(self, path: str) -> str:
        """Host ``path`` inside this node, as the tier's own process reaches it (``path`` is
        under one of the node's private dirs)."""
        for top in PRIVATE_PATHS + self.layout.private:
            if path == top or path.startswith(top + "/"):
                return os.path.join(self.private(top), path[len(top) :].lstrip("/"))
        raise ValueError(f"{path} is not in {self.name}'s private dirs")

    @property
    def daemon_cgroup(self) -> str:
        """The cgroup containerd and the kubelet run in (their shims inherit it, so the ledger
        finds every one of them by cgroup, whatever socket they name)."""
        return f"{self.cgroup_root}-daemons"

    def _in_daemon_cgroup(self, command: list[str]) -> list[str]:
        """``command`` run by a shell that first moves itself into the daemon cgroup of every
        hierarchy, then execs (no preexec_fn: the chaos run restarts daemons from a process
        with threads, where running Python between fork and exec is unsafe)."""
        from tests.kubelet import host

        procs = [
            os.path.join(hierarchy, self.daemon_cgroup.strip("/"), "cgroup.procs")
            for hierarchy in host.cgroup_hierarchies()
        ]
        script = (
            'for p in "$@"; do [ "$p" = -- ] && break; echo $$ 2>/dev/null >"$p"; shift; done; '
            'shift; exec "$@"'
        )
        return ["sh", "-c", script, "sh", *procs, "--", *command]

    def _nsenter(self) -> list[str]:
        if self.holder is None:
            raise harness.E2EError(f"{self.name}: no mount namespace yet")
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--"]

    def run_in(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command in this node's mount namespace."""
        result = subprocess.run(
            [*self._nsenter(), *command], capture_output=True, text=True, timeout=120, check=False
        )
        if check and result.returncode != 0:
            raise harness.E2EError(f"{self.name}: {' '.join(command)}: {result.stderr}")
        return result

    def simulate(self) -> None:
        """Write the simulated tree."""
        simulate.create(self.sim_root, topofile.load(self.topology))

    def _device_files(self) -> list[str]:
        return sorted(os.listdir(os.path.join(self.sim_root, "dev")))

    def enter(self) -> None:
        """Create the mount points (ledger first), start the holder, bind the private dirs;
        give the tier's network namespace this node's address (on ``lo``: the kubelet 1.20
        refuses a 127.0.0.0/8 node IP, and the API server reaches kubelets by InternalIP)."""
        shown = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        if f" {self.node_ip}/" not in shown:
            subprocess.run(["ip", "addr", "add", f"{self.node_ip}/32", "dev", "lo"], check=True)
        lines = ["set -e"]
        for path in PRIVATE_PATHS + self.layout.private:
            self.ledger.will_create_dir(path)
            os.makedirs(path, exist_ok=True)
            os.makedirs(self.private(path), exist_ok=True)
            lines.append(f"mount --bind '{self.private(path)}' '{path}'")
        lines.append("mount -t tmpfs -o mode=0755,size=64m enflame-node-run /run")
        path = self.layout.run_dir
        os.makedirs(self.private(path), exist_ok=True)
        lines.append(f"mkdir -p '{path}' && mount --bind '{self.private(path)}' '{path}'")
        lines.append(f"mkdir -p '{SIM_MOUNT}' && mount --bind '{self.sim_root}' '{SIM_MOUNT}'")
        if self.layout.binary:
            binary, machine = self.layout.binary, self.binaries.containerd
            lines += [
                f"mkdir -p '{os.path.dirname(binary)}' && : > '{binary}'",
                f"mount --bind '{machine}' '{binary}' && mount --bind /dev/null '{machine}'",
            ]
        lines += self._sysfs_lines()
        lines += self._dev_lines()
        ready = os.path.join(self.work, "ns.ready")
        lines += [f"touch '{ready}'", "exec sleep infinity"]
        script = os.path.join(self.work, "ns.sh")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        with open(os.path.join(self.work, "ns.log"), "ab") as log:
            self.holder = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", script],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ledger.started(self.holder.pid, "sleep")

        def up() -> bool:
            if self.holder is not None and self.holder.poll() is not None:
                raise harness.E2EError(
                    f"{self.name}: the namespace script failed: {self._ns_log()}"
                )
            return os.path.exists(ready)

        harness.wait_for(f"{self.name}'s mount namespace", up, 30, 0.05)

    def _dev_lines(self) -> list[str]:
        """A /dev of the node's own: a tmpfs holding the machine's entries (bound; symlinks
        copied), this node's simulated gcuN/gcuctl/vgcuN bound from its tree, and its own copy of
        /dev/char (where doctor's runc fix makes its links). Nothing is created in the machine's
        /dev, so one node's devices never show on another (a vGCU node's /dev/vgcuN placeholders
        read as broken vGCUs on a whole-card node's vdevice plugin) and the host stays as it was."""
        machine = self.private("/dev-machine")
        os.makedirs(machine, exist_ok=True)
        lines = [
            f"H='{machine}'",
            'mount --rbind /dev "$H"',
            "mount -t tmpfs -o mode=0755,size=4m enflame-node-dev /dev",
            'for e in $(ls -A "$H"); do',
            '  case "$e" in gcu[0-9]*|vgcu[0-9]*|gcuctl) continue ;; char) continue ;; esac',
            '  if [ -L "$H/$e" ]; then cp -a "$H/$e" "/dev/$e"',
            '  elif [ -d "$H/$e" ]; then mkdir "/dev/$e" && mount --rbind "$H/$e" "/dev/$e"',
            '  else : > "/dev/$e" && mount --bind "$H/$e" "/dev/$e"; fi',
            "done",
            'mkdir /dev/char && if [ -d "$H/char" ]; then cp -a "$H/char/." /dev/char/; fi',
        ]
        for name in self._device_files():
            lines.append(
                f": > '/dev/{name}' && mount --bind '{self.sim_root}/dev/{name}' '/dev/{name}'"
            )
        return lines

    def _sysfs_lines(self) -> list[str]:
        """Shell lines that put the simulated cards into this node's /sys: a tmpfs with the
        machine's /sys entries bound in, except that the simulated tree's PCI root complexes,
        /sys/bus/pci/devices and /sys/module/enflame take their places; moved over /sys.
        Everything else (cgroups, CPUs, the real devices) stays the machine's."""
        staging = os.path.join(self.work, "sysfs")
        os.makedirs(staging, exist_ok=True)
        return [
            f"S='{staging}'; R='{self.sim_root}/sys'",
            'mount -t tmpfs -o mode=0755 enflame-node-sys "$S"',
            "bindall() {  # bindall FROM TO SKIP...: every entry of FROM bound under TO",
            "  from=$1; to=$2; shift 2",
            '  for e in "$from"/*; do',
            "    n=${e##*/}; skip=0",
            '    for s in "$@"; do [ "$n" = "$s" ] && skip=1; done',
            '    [ "$skip" = 1 ] && continue',
            '    if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$to/$n";',
            '    elif [ -d "$e" ]; then mkdir "$to/$n"; mount --rbind "$e" "$to/$n";',
            '    else : >"$to/$n"; mount --bind "$e" "$to/$n"; fi',
            "  done",
            "}",
            'bindall /sys "$S" devices bus module',
            'mkdir "$S/devices" "$S/bus" "$S/module"',
            'bindall /sys/devices "$S/devices" $(ls "$R/devices")',
            'bindall "$R/devices" "$S/devices"',
            'bindall /sys/bus "$S/bus" pci',
            'mkdir "$S/bus/pci"',
            'bindall /sys/bus/pci "$S/bus/pci" devices',
            'mkdir "$S/bus/pci/devices" && mount --bind "$R/bus/pci/devices" "$S/bus/pci/devices"',
            'bindall /sys/module "$S/module" $(ls "$R/module")',
            'bindall "$R/module" "$S/module"',
            'mount --move "$S" /sys',
        ]

    def _ns_log(self) -> str:
        with open(os.path.join(self.work, "ns.log"), encoding="utf-8", errors="replace") as handle:
            return handle.read()[-2000:]

    # -- containerd -------------------------------------------------------------------------

    def _containerd_config(self) -> str:
        base = harness.containerd_base_config(self.ctd_dir, os.path.join(self.ctd_dir, "runc"))
        socket = self.layout.socket
        return (
            base.replace(f'address = "{self.ctd_dir}/c.sock"', f'address = "{socket}"')
            .replace(f'address = "{self.ctd_dir}/c.sock.ttrpc"', f'address = "{socket}.ttrpc"')
            .replace(f'bin_dir = "{self.ctd_dir}/cni/bin"', f'bin_dir = "{self.binaries.cni_dir}"')
            .replace("# private containerd of the real-kubelet test tier", f"# {self.name}")
            # Per-registry settings as a node's admin writes them (certs.d/<host>/hosts.toml:
            # tests/cluster/test_registry.py trusts its loopback registry as plain HTTP there).
            + f'  [{harness.CRI}.registry]\n    config_path = "/etc/containerd/certs.d"\n'
        )

    def start_containerd(self) -> None:
        """Write its config (at its layout's path, in the node's private dirs) and CNI config;
        start it."""
        os.makedirs(os.path.join(self.ctd_dir, "cni", "conf"), exist_ok=True)
        self.config_path = self.seen_from_here(self.layout.config)
        os.makedirs(os.path.dirname(self.config_path), exist_ok=True)
        with open(self.config_path, "w", encoding="utf-8") as handle:
            handle.write(self._containerd_config())
        bridge = f"enf{self.name[-6:].replace('-', '')}"[:15]
        cni = {
            "cniVersion": "0.4.0",
            "name": f"e2e-{self.name}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }
        with open(os.path.join(self.ctd_dir, "cni", "conf", "10-e2e.conflist"), "w") as handle:
            json.dump(cni, handle)
        make_cgroup(self.daemon_cgroup)
        self._spawn_containerd()

    @property
    def containerd(self) -> subprocess.Popen[bytes] | None:
        """The node's containerd process now (restarted when it exits, as systemd does)."""
        return self.daemons["containerd"].process

    @property
    def kubelet(self) -> subprocess.Popen[bytes] | None:
        """The node's kubelet process now (restarted when it exits, as systemd does)."""
        return self.daemons["kubelet"].process

    def _containerd_process(self) -> subprocess.Popen[bytes]:
        binary = self.layout.binary or self.binaries.containerd
        command = [binary, "--config", self.layout.config]
        with open(os.path.join(self.work, "containerd.log"), "ab") as log:
            process = subprocess.Popen(
                self._in_daemon_cgroup([*self._nsenter(), *command]),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ledger.started(process.pid, command[0])
        return process

    def _spawn_containerd(self) -> None:
        """containerd in the node's namespace and daemon cgroup, on its config as it is now
        (the toolkit's edits included); returns once it answers."""
        process = self.daemons["containerd"].start()

        def up() -> bool:
            if process.poll() is not None:
                raise harness.E2EError(f"{self.name}: containerd exited: {self.log('containerd')}")
            return self.ctr("version", check=False).returncode == 0

        harness.wait_for(f"{self.name}'s containerd", up, 30, 0.2)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd (CRI namespace)."""
        command = [self.binaries.ctr, "--address", self.socket, "--namespace", "k8s.io", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if check and result.returncode != 0:
            raise harness.E2EError(f"{self.name}: {' '.join(command)}: {result.stderr}")
        return result

    def import_archive(self, archive: str) -> None:
        """``ctr images import`` an OCI archive (no registry anywhere)."""
        self.ctr("images", "import", archive)

    def import_test_images(self) -> None:
        """The pause image (the sandbox) and busybox, built from local binaries."""
        for spec in (
            oci_image.ImageSpec(
                name=harness.PAUSE_IMAGE,
                files={"/pause": self.binaries.pause},
                entrypoint=("/pause",),
            ),
            oci_image.ImageSpec(
                name=harness.IMAGE,
                files={"/bin/busybox": self.binaries.busybox},
                symlinks={f"/bin/{a}": "busybox" for a in harness.BUSYBOX_APPLETS},
                cmd=("/bin/sh",),
            ),
        ):
            archive = os.path.join(self.work, f"image-{uuid.uuid4().hex[:6]}.tar")
            oci_image.write_archive(archive, spec)
            self.ctr("images", "import", archive)
            os.unlink(archive)

    # -- kubelet ----------------------------------------------------------------------------

    def start_kubelet(self, extra: dict[str, Any] | None = None) -> None:
        """Register with the control plane under its own client certificate."""
        kubeconfig = self.plane.node_kubeconfig(self.name, os.path.join(self.work, "kubelet"))
        make_cgroup(self.cgroup_root)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            # The API server reaches this kubelet on loopback only; no webhook authn/authz.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "4s",
            "volumeStatsAggPeriod": "0s",
            "volumePluginDir": "/var/lib/kubelet/volume-plugins",
            **(extra or {}),
        }  # fmt: skip
        # Where kubeadm puts them: the toolkit and doctor read the kubelet's config and flags there.
        kubelet_dir = self.private("/var/lib/kubelet")
        with open(os.path.join(kubelet_dir, "config.yaml"), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=1)
        runtime_flags = [
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.layout.socket}",
        ]
        with open(os.path.join(kubelet_dir, "kubeadm-flags.env"), "w", encoding="utf-8") as handle:
            handle.write(f'KUBELET_KUBEADM_ARGS="{" ".join(runtime_flags)}"\n')
        command = [
            self.binaries.kubelet,
            "--config=/var/lib/kubelet/config.yaml",
            f"--kubeconfig={kubeconfig}",
            "--root-dir=/var/lib/kubelet",
            *runtime_flags,
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            "--v=2",
        ]
        self.kubelet_command = command
        self._spawn_kubelet()

    def _kubelet_process(self) -> subprocess.Popen[bytes]:
        command = self.kubelet_command
        with open(os.path.join(self.work, "kubelet.log"), "ab") as log:
            process = subprocess.Popen(
                self._in_daemon_cgroup([*self._nsenter(), *command]),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.ledger.started(process.pid, command[0])
        return process

    def _spawn_kubelet(self) -> None:
        self.daemons["kubelet"].start()

    def ready(self) -> bool:
        """Whether the Node object says Ready."""
        node = self.plane.get(f"/api/v1/nodes/{self.name}")
        for condition in (node or {}).get("status", {}).get("conditions", []):
            if condition["type"] == "Ready":
                return bool(condition["status"] == "True")
        return False

    def wait_ready(self, timeout: float = 120) -> None:
        """Wait for the Node to be Ready (E2EError with the kubelet's log tail otherwise)."""

        def probe() -> bool:
            if self.kubelet is not None and self.kubelet.poll() is not None:
                raise harness.E2EError(f"{self.name}: kubelet exited:\n{self.log('kubelet')}")
            return self.ready()

        try:
            harness.wait_for(f"node {self.name} to be Ready", probe, timeout, 0.5)
        except harness.E2EError as exc:
            raise harness.E2EError(f"{exc}\n{self.log('kubelet')}") from None

    def log(self, piece: str, size: int = 4000) -> str:
        """The tail of ``kubelet``, ``containerd`` or ``ns`` log."""
        try:
            with open(os.path.join(self.work, f"{piece}.log"), "rb") as handle:
                return handle.read().decode("utf-8", "replace")[-size:]
        except FileNotFoundError:
            return ""

    def up(self, archives: list[str]) -> None:
        """Everything, in order, until the Node is Ready."""
        self.simulate()
        self.enter()
        self.start_containerd()
        self.import_test_images()
        for archive in archives:
            self.import_archive(archive)
        self.start_kubelet()
        self.wait_ready()

    # -- faults (the chaos run, tests/cluster/chaos.py) -------------------------------------

    def restart_kubelet(self, down_for: float = 0.0) -> None:
        """SIGKILL the kubelet (no clean shutdown), keep it down ``down_for`` seconds, start it
        again with the same command line and config; its containers run on meanwhile. A kubelet
        that then exits by itself (containerd down at its start) is started again 10 s later,
        as kubeadm's systemd unit does."""
        self.daemons["kubelet"].stop(kill=True, timeout=10)
        time.sleep(down_for)
        self._spawn_kubelet()

    def restart_containerd(self, down_for: float = 0.0) -> None:
        """SIGKILL containerd (its shims and containers live on), keep it down ``down_for``
        seconds, start it again on its config file as it is now (the toolkit's edits kept)."""
        self.daemons["containerd"].stop(kill=True, timeout=10)
        time.sleep(down_for)
        self._spawn_containerd()

    # -- the simulated cards ----------------------------------------------------------------

    def unplug(self, minor: int) -> None:
        """Take a card off the simulated bus (as a hot-unplug does)."""
        simulate.unplug(self.sim_root, minor)

    def replug(self, minor: int) -> None:
        """Put it back."""
        simulate.replug(self.sim_root, minor)

    def stop(self) -> None:
        """Kubelet, then containerd, then the holder (the ledger finds shims and containers)."""
        for name in ("kubelet", "containerd"):
            self.daemons[name].stop(kill=False)
        process = self.holder
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def python_for_node() -> str:
    """The interpreter of the checkout (enflame-ctk for doctor runs and the like)."""
    return sys.executable


def remove_tree(path: str) -> None:
    """rm -rf that tolerates busy mount points (unmounted by the ledger)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def elapsed(started: float) -> str:
    """Seconds since ``started`` for log lines."""
    return f"{time.monotonic() - started:.1f} s"
