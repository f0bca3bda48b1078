"""A private containerd 1.6 and Kubernetes' own kubelet, running our plugin on a simulated node.

Everything is private (a short dir under /tmp) except what the kubelet fixes itself: the
device-plugin dir ``/var/lib/kubelet/device-plugins``, ``/var/log/pods`` and
``/var/log/containers``; containerd 1.6 fixes ``/run/containerd/s``. Every change to the host
goes through the :class:`tests.kubelet.host.Ledger` first. Processes are started in their own
session (a Ctrl-C reaches pytest, whose teardown stops them) and stopped by PID.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from enflame_gcu.shim import launcher
from enflame_gcu.simulation import simulate, topofile
from enflame_gcu.simulation.testing import oci_image, podresources
from tests.kubelet.host import Ledger

T = TypeVar("T")

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
CHECKPOINT = os.path.join(PLUGIN_DIR, "kubelet_internal_checkpoint")
KUBELET_SOCKET = os.path.join(PLUGIN_DIR, "kubelet.sock")
PLUGIN_SOCKET = os.path.join(PLUGIN_DIR, "enflame.sock")
POD_LOGS = "/var/log/pods"
NODE_NAME = "enflame-e2e"
NAMESPACE = "default"
RESOURCE = "enflame.com/gcu"
IMAGE = "docker.io/enflame-e2e/busybox:1"
PAUSE_IMAGE = "docker.io/enflame-e2e/pause:1"
CRI = 'plugins."io.containerd.grpc.v1.cri"'
BUSYBOX_APPLETS = (
    "sh", "ls", "cat", "echo", "sleep", "grep", "tr", "env", "head", "sort", "true", "sed",
)  # fmt: skip
BIN = os.path.dirname(sys.executable)


class E2EError(AssertionError):
    """The tier's own failure: a wait that ran out, with what was seen."""


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; E2EError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise E2EError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def listening(path: str) -> bool:
    """Whether a unix socket accepts connections."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        try:
            sock.connect(path)
        except OSError:
            return False
        return True


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> int:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


@dataclass(frozen=True, slots=True)
class Tools:
    """The binaries the tier runs."""

    kubelet: str
    pause: str
    containerd: str
    ctr: str
    runc: str
    busybox: str


# --------------------------------------------------------------------------------------------
# containerd


def containerd_base_config(directory: str, runc_root: str) -> str:
    """A version 2 config with everything private, before ``enflame-ctk runtime configure``."""
    return f"""version = 2
# private containerd of the real-kubelet test tier
root = "{directory}/root"
state = "{directory}/state"

[grpc]
  address = "{directory}/c.sock"

[ttrpc]
  address = "{directory}/c.sock.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{directory}/opt"
  [{CRI}]
    sandbox_image = "{PAUSE_IMAGE}"
    # runc on this VM cannot lower the OOM score adjustment of containers
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [{CRI}.cni]
      bin_dir = "{directory}/cni/bin"
      conf_dir = "{directory}/cni/conf"
    [{CRI}.containerd]
      default_runtime_name = "runc"
      [{CRI}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{CRI}.containerd.runtimes.runc.options]
          # the kubelet here uses the cgroupfs driver (PID 1 is not systemd)
          SystemdCgroup = false
          Root = "{runc_root}"
"""


class Containerd:
    """A private containerd whose config our ``enflame-ctk runtime configure`` edited."""

    def __init__(self, tools: Tools, ledger: Ledger, directory: str) -> None:
        self.tools = tools
        self.ledger = ledger
        self.directory = directory
        self.config = os.path.join(directory, "containerd.toml")
        self.socket = os.path.join(directory, "c.sock")
        self.runtime_config = os.path.join(directory, "runtime.toml")
        self.runtime_log = os.path.join(directory, "runtime.log")
        self.launcher = os.path.join(directory, "enflame-container-runtime")
        self.log_path = os.path.join(directory, "containerd.log")
        self.process: subprocess.Popen[bytes] | None = None
        self.configure_output = ""

    @property
    def endpoint(self) -> str:
        """The CRI endpoint for the kubelet."""
        return f"unix://{self.socket}"

    def configure(self) -> None:
        """Base config, then our own ``enflame-ctk runtime configure`` (default runtime, CDI
        annotations passed through)."""
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(containerd_base_config(self.directory, f"{self.directory}/runc"))
        launcher.write_launcher(
            self.launcher, sys.executable, verdict=os.path.join(self.directory, "front-verdict")
        )
        result = subprocess.run(
            [
                os.path.join(BIN, "enflame-ctk"),
                "runtime",
                "configure",
                "--runtime",
                "containerd",
                "--config",
                self.config,
                "--runtime-path",
                self.launcher,
                "--set-as-default",
                # the cdi-annotations scenario: containerd 1.x passes cdi.k8s.io/* through
                "--cdi-annotations",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.configure_output = result.stdout + result.stderr
        if result.returncode != 0:
            raise E2EError(f"enflame-ctk runtime configure failed: {self.configure_output}")

    def write_runtime_config(self, node_root: str, **extra: Any) -> None:
        """Point our runtime (as containerd's shims start it) at a simulated node."""
        values: dict[str, Any] = {
            "root": node_root,
            "runtimes": [self.tools.runc],
            "log-file": self.runtime_log,
            "log-level": "debug",
            "cdi-spec-dirs": [os.path.join(self.directory, "cdi")],
            "prepared-edits": os.path.join(self.directory, "prepared-edits.json"),
            **extra,
        }
        lines = [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        with open(self.runtime_config, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")

    def start(self) -> None:
        """Start containerd on the private config and import the two test images."""
        for path in ("/run/containerd", "/run/containerd/s"):
            self.ledger.will_create_dir(path)
        self.ledger.containerd_sockets.append(self.socket)
        env = {**os.environ, "ENFLAME_CONTAINER_RUNTIME_CONFIG": self.runtime_config}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.tools.containerd, "--config", self.config],
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self.ledger.started(self.process.pid, self.tools.containerd)

        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise E2EError(f"containerd exited:\n{self.log_tail()}")
            return self.ctr("version", check=False).returncode == 0

        wait_for("containerd to serve its socket", up, 30, 0.2)
        self.import_images()

    def import_images(self) -> None:
        """Build the pause and busybox images from local binaries and import them."""
        images = (
            oci_image.ImageSpec(
                name=PAUSE_IMAGE, files={"/pause": self.tools.pause}, entrypoint=("/pause",)
            ),
            oci_image.ImageSpec(
                name=IMAGE,
                files={"/bin/busybox": self.tools.busybox},
                symlinks={f"/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS},
                cmd=("/bin/sh",),
            ),
        )
        for spec in images:
            archive = os.path.join(self.directory, f"image-{uuid.uuid4().hex[:6]}.tar")
            oci_image.write_archive(archive, spec)
            self.ctr("images", "import", archive)
            os.unlink(archive)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this containerd in the CRI namespace."""
        command = [self.tools.ctr, "--address", self.socket, "--namespace", "k8s.io", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if check and result.returncode != 0:
            raise E2EError(f"{' '.join(command)} failed: {result.stderr}")
        return result

    def running_tasks(self) -> list[str]:
        """IDs of tasks that are not stopped."""
        listing = self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        return [line.split()[0] for line in listing if line.split()[-1:] != ["STOPPED"]]

    def container_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec containerd stored for a container (before our runtime's edits)."""
        info = json.loads(self.ctr("containers", "info", container_id).stdout)
        spec: dict[str, Any] = info["Spec"]
        return spec

    def log_tail(self, size: int = 4000) -> str:
        """The end of containerd's log."""
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-size:]

    def stop(self) -> None:
        """Stop containerd (SIGTERM, then SIGKILL); shims and mounts go with the ledger."""
        if self.process is not None:
            _stop(self.process)


# --------------------------------------------------------------------------------------------
# kubelet


@dataclass
class KubeletOptions:
    """What a scenario may change in the kubelet's configuration."""

    cpu_manager_policy: str = "none"
    extra: dict[str, Any] = field(default_factory=dict)


class Kubelet:
    """Kubernetes' kubelet, standalone (static pods only), on a private root dir."""

    def __init__(
        self,
        tools: Tools,
        ledger: Ledger,
        directory: str,
        containerd: Containerd,
        *,
        cgroup_root: str,
        options: KubeletOptions,
    ) -> None:
        self.tools = tools
        self.ledger = ledger
        self.directory = directory
        self.containerd = containerd
        self.root_dir = os.path.join(directory, "root")
        self.manifests = os.path.join(directory, "manifests")
        self.config_path = os.path.join(directory, "kubelet.yaml")
        self.log_path = os.path.join(directory, "kubelet.log")
        self.read_only_port = free_port()
        self.healthz_port = free_port()
        self.port = free_port()
        self.cgroup_root = cgroup_root
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        os.makedirs(self.manifests)
        self._write_config()

    @property
    def pod_resources_socket(self) -> str:
        """The PodResources socket (under the kubelet's root dir)."""
        return os.path.join(self.root_dir, "pod-resources", "kubelet.sock")

    def _write_config(self) -> None:
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": self.manifests,
            "fileCheckFrequency": "1s",
            "syncFrequency": "2s",
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": self.read_only_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%"},
            "serializeImagePulls": False,
            "cpuManagerPolicy": self.options.cpu_manager_policy,
            "cpuManagerReconcilePeriod": "1s",
            "volumeStatsAggPeriod": "0s",
            # Defaults outside the root dir that the kubelet would create on the host.
            "volumePluginDir": os.path.join(self.directory, "volume-plugins"),
            **self.options.extra,
        }
        if self.options.cpu_manager_policy == "static":
            config["reservedSystemCPUs"] = "0"
        with open(self.config_path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=1)

    def start(self) -> None:
        """Start the kubelet and wait until it serves the device-plugin registration socket."""
        for path in ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers"):
            self.ledger.will_create_dir(path)
        command = [
            self.tools.kubelet,
            f"--config={self.config_path}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.root_dir}/pki",
            f"--seccomp-profile-root={self.root_dir}/seccomp",
            "--container-runtime=remote",
            f"--container-runtime-endpoint={self.containerd.endpoint}",
            f"--hostname-override={NODE_NAME}",
            "--v=4",
            "--logtostderr=true",
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"==== kubelet start {time.time():.3f}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.ledger.started(self.process.pid, self.tools.kubelet)

        def serving() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise E2EError(f"the kubelet exited ({self.process.returncode}):\n{self.tail()}")
            return listening(KUBELET_SOCKET) and self._healthy()

        wait_for("the kubelet to serve kubelet.sock and healthz", serving, 60, 0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.healthz_port}/healthz", timeout=2
            ) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the kubelet (its pods keep running, as on a real node)."""
        if self.process is not None:
            _stop(self.process, sig)
            with open(self.log_path, "ab") as log:
                log.write(f"==== kubelet stopped {time.time():.3f}\n".encode())

    def restart(self) -> int:
        """Stop and start again; returns the log offset where the new run begins."""
        self.stop()
        offset = os.path.getsize(self.log_path)
        self.start()
        return offset

    # -- evidence -------------------------------------------------------------------------

    def log(self, since: int = 0) -> str:
        """The kubelet's log from byte ``since``."""
        with open(self.log_path, "rb") as handle:
            handle.seek(since)
            return handle.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        """Current size of the log (an offset for :meth:`log`)."""
        return os.path.getsize(self.log_path)

    def tail(self, size: int = 6000) -> str:
        """The end of the log, for failure messages."""
        return self.log()[-size:]

    def pods(self) -> list[dict[str, Any]]:
        """The kubelet's pods with their status (read-only API; standalone keeps status here)."""
        url = f"http://127.0.0.1:{self.read_only_port}/pods"
        with urllib.request.urlopen(url, timeout=5) as answer:
            items: list[dict[str, Any]] = json.load(answer).get("items") or []
            return items

    def pod(self, name: str) -> dict[str, Any] | None:
        """One pod by its manifest name (static pods are named ``<name>-<node>``)."""
        for item in self.pods():
            if item["metadata"]["name"] == f"{name}-{NODE_NAME}":
                return item
        return None


def capacity_in(log: str) -> tuple[int, int] | None:
    """``(capacity, allocatable)`` of enflame.com/gcu from the last node status in ``log``.

    The kubelet logs ``Update capacity for R to N`` whenever it builds the node status (in
    standalone mode: on every admission) and ``Update allocatable for R to N`` only when the
    allocatable count differs from the capacity (unhealthy devices).
    """
    capacity = allocatable = None
    for line in log.splitlines():
        if f"Update capacity for {RESOURCE} to " in line:
            capacity = allocatable = int(line.rsplit(" to ", 1)[1])
        elif f"Update allocatable for {RESOURCE} to " in line:
            allocatable = int(line.rsplit(" to ", 1)[1])
    return None if capacity is None or allocatable is None else (capacity, allocatable)


def checkpoint() -> dict[str, Any]:
    """The device manager's checkpoint: ``{"entries": [...], "registered": {resource: ids}}``."""
    with open(CHECKPOINT, encoding="utf-8") as handle:
        data = json.load(handle)["Data"]
    entries = []
    for entry in data.get("PodDeviceEntries") or []:
        ids = entry["DeviceIDs"]
        if isinstance(ids, dict):  # newer kubelets group the IDs by NUMA node
            ids = [i for group in ids.values() for i in group]
        entries.append(
            {
                "pod_uid": entry["PodUID"],
                "container": entry["ContainerName"],
                "resource": entry["ResourceName"],
                "ids": sorted(ids, key=lambda name: int(name.lstrip("gcu") or 0)),
                "response": entry.get("AllocResp", ""),
            }
        )
    return {"entries": entries, "registered": data.get("RegisteredDevices") or {}}


def registered_count() -> int:
    """How many healthy GCUs the kubelet's checkpoint holds (-1 if unreadable mid-write)."""
    try:
        return len(checkpoint()["registered"].get(RESOURCE) or [])
    except (OSError, ValueError, KeyError):
        return -1


def decode_response(encoded: str) -> dict[str, Any]:
    """The envs/mounts/devices/annotations of a checkpointed ContainerAllocateResponse."""
    from enflame_gcu._proto import api_pb2

    message = api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(encoded))
    return {
        "envs": dict(message.envs),
        "mounts": [(m.container_path, m.host_path) for m in message.mounts],
        "devices": [(d.container_path, d.host_path, d.permissions) for d in message.devices],
        "annotations": dict(message.annotations),
    }


# --------------------------------------------------------------------------------------------
# the plugin


class Plugin:
    """``enflame-device-plugin`` as its own process in the kubelet's real plugin dir."""

    def __init__(self, directory: str, host_root: str, ledger: Ledger) -> None:
        self.directory = directory
        self.host_root = host_root
        self.ledger = ledger
        self.log_path = os.path.join(directory, "plugin.log")
        self.args: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, args: Sequence[str] = ()) -> None:
        """Start it; it registers with the kubelet on its own."""
        self.args = list(args)
        command = [
            sys.executable,
            "-m",
            "enflame_gcu.device_plugin.main",
            "--plugin-dir",
            PLUGIN_DIR,
            "--host-root",
            self.host_root,
            "--health-interval",
            "1",
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        self.ledger.started(self.process.pid, sys.executable)

    def signal(self, sig: int) -> None:
        """Send a signal to the running plugin."""
        if self.process is None:
            raise E2EError("the plugin was not started")
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap: the socket file stays behind, as after a crash."""
        if self.process is not None:
            _stop(self.process, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s)."""
        if self.process is not None:
            _stop(self.process)

    def log(self) -> str:
        """Everything the plugin logged."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""


# --------------------------------------------------------------------------------------------
# pods

REPORT_SCRIPT = (
    'echo "gcu-nodes: $(ls /dev | grep -E "^v?gcu" | tr "\\n" " ")"; '
    'echo "visible: ${ENFLAME_VISIBLE_DEVICES-unset}"; '
    'echo "mounts: $(ls /var/run/enflame-container-devices 2>/dev/null | tr "\\n" " ")"; '
    'echo "report-done"'
)


def container(
    name: str = "main",
    gcus: int | None = None,
    script: str = REPORT_SCRIPT,
    *,
    sleep: bool = True,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A busybox container that reports what it sees, then sleeps (or exits)."""
    body = f"{script}; exec sleep 100000" if sleep else script
    limits: dict[str, Any] = dict(resources or {})
    if gcus is not None:
        limits[RESOURCE] = str(gcus)
    entry: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", body],
    }
    if limits:
        entry["resources"] = {"limits": limits, "requests": dict(limits)}
    return entry


def pod_manifest(
    name: str,
    containers: Sequence[dict[str, Any]],
    init_containers: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A static pod on the host network that never pulls."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "containers": list(containers),
    }
    if init_containers:
        spec["initContainers"] = list(init_containers)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class ContainerReport:
    """What a container printed with :data:`REPORT_SCRIPT`."""

    nodes: tuple[str, ...]
    visible: str
    mounts: tuple[str, ...]
    text: str

    @property
    def cards(self) -> tuple[str, ...]:
        """The card nodes (``gcuN``), without gcuctl."""
        return tuple(n for n in self.nodes if n != "gcuctl")


def parse_report(text: str) -> ContainerReport:
    """Read a container's report lines out of its log text."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("gcu-nodes", "visible", "mounts"):
            values[key] = value.strip()
        elif line.rstrip(":") in ("gcu-nodes", "mounts"):
            values[line.rstrip(":")] = ""
    nodes = tuple(sorted(values.get("gcu-nodes", "").split(), key=_node_key))
    return ContainerReport(
        nodes, values.get("visible", ""), tuple(values.get("mounts", "").split()), text
    )


def _node_key(name: str) -> tuple[int, int]:
    digits = name.lstrip("vgcu")
    return (1, 0) if name == "gcuctl" else (0, int(digits) if digits.isdigit() else 0)


class Pods:
    """Static pods: write a manifest, read the kubelet's status and the container's log."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        # A static pod's UID is a hash of its manifest: without a per-scenario nonce, a pod of
        # the same name in a later scenario would find the earlier one's exited container.
        self.nonce = uuid.uuid4().hex[:12]

    def create(self, manifest: dict[str, Any]) -> str:
        """Write the manifest (atomically, the kubelet watches the dir); returns the pod name."""
        name: str = manifest["metadata"]["name"]
        manifest["metadata"].setdefault("annotations", {})["enflame.com/e2e-scenario"] = self.nonce
        path = os.path.join(self.kubelet.manifests, f"{name}.json")
        temporary = os.path.join(self.kubelet.directory, f".{name}.json")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle)
        os.replace(temporary, path)
        return name

    def delete(self, name: str, timeout: float = 30) -> None:
        """Remove the manifest and wait until the kubelet no longer lists the pod."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.kubelet.manifests, f"{name}.json"))
        wait_for(f"pod {name} to go", lambda: self.kubelet.pod(name) is None, timeout, 0.2)

    def status(self, name: str) -> dict[str, Any]:
        """The pod's status as the kubelet holds it ({} before it is admitted)."""
        pod = self.kubelet.pod(name)
        return dict(pod.get("status") or {}) if pod else {}

    def uid(self, name: str) -> str:
        """The pod's UID."""
        pod = wait_for(f"pod {name} to be known", lambda: self.kubelet.pod(name), 30)
        uid: str = pod["metadata"]["uid"]
        return uid

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """Wait for every container to run; E2EError with the status and log tail otherwise."""

        def running() -> dict[str, Any] | None:
            status = self.status(name)
            if status.get("phase") == "Failed":
                raise E2EError(f"pod {name} failed: {json.dumps(status)[:1500]}")
            states = status.get("containerStatuses") or []
            if states and all("running" in (s.get("state") or {}) for s in states):
                return status
            return None

        try:
            return wait_for(f"pod {name} to run", running, timeout, 0.2)
        except E2EError as exc:
            raise E2EError(
                f"{exc}\nstatus: {json.dumps(self.status(name))[:1500]}\n"
                f"kubelet log tail:\n{self.kubelet.tail(3000)}"
            ) from None

    def wait_failed(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """Wait for the kubelet to fail the pod (e.g. admission)."""
        return wait_for(
            f"pod {name} to fail",
            lambda: s if (s := self.status(name)).get("phase") == "Failed" else None,
            timeout,
            0.2,
        )

    def container_ids(self, name: str) -> dict[str, str]:
        """``{container name: containerd ID}`` from the pod status."""
        status = self.status(name)
        found = {}
        for entry in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            if entry.get("containerID"):
                found[entry["name"]] = entry["containerID"].split("://", 1)[1]
        return found

    def log(self, name: str, container_name: str = "main") -> str:
        """The container's output from the kubelet's own log file (CRI format, stdout only)."""
        uid = self.uid(name)
        directory = os.path.join(POD_LOGS, f"{NAMESPACE}_{name}-{NODE_NAME}_{uid}", container_name)
        lines = []
        with contextlib.suppress(FileNotFoundError):
            for log_name in sorted(os.listdir(directory)):
                with open(os.path.join(directory, log_name), encoding="utf-8") as handle:
                    for line in handle:
                        parts = line.rstrip("\n").split(" ", 3)
                        if len(parts) == 4:
                            lines.append(parts[3])
        return "\n".join(lines)

    def report(
        self, name: str, container_name: str = "main", timeout: float = 30
    ) -> ContainerReport:
        """Wait for the container's report and parse it."""
        text = wait_for(
            f"the report of {name}/{container_name}",
            lambda: t if "report-done" in (t := self.log(name, container_name)) else None,
            timeout,
            0.2,
        )
        return parse_report(text)

    def run(self, name: str, gcus: int, timeout: float = 60) -> ContainerReport:
        """Create a one-container pod asking for ``gcus`` cards, wait, return its report."""
        self.create(pod_manifest(name, [container(gcus=gcus)]))
        self.wait_running(name, timeout)
        return self.report(name)

    def delete_all(self, timeout: float = 60) -> None:
        """Remove every manifest and wait for the pods to go."""
        for entry in os.listdir(self.kubelet.manifests):
            os.unlink(os.path.join(self.kubelet.manifests, entry))
        wait_for("every pod to go", lambda: not self.kubelet.pods(), timeout, 0.2)


# --------------------------------------------------------------------------------------------
# one scenario's node


class Node:
    """One scenario: a simulated node, the real kubelet, our plugin; torn down by the fixture."""

    def __init__(
        self, tools: Tools, ledger: Ledger, containerd: Containerd, cgroup_root: str, work: str
    ) -> None:
        self.tools = tools
        self.ledger = ledger
        self.containerd = containerd
        self.cgroup_root = cgroup_root
        self.work = work
        self.host_root = os.path.join(work, "node")
        self.kubelet: Kubelet | None = None
        self.plugin = Plugin(work, self.host_root, ledger)
        self._pods: Pods | None = None

    def simulate(self, topology: str = "vendor-8card") -> None:
        """Write the simulated node and point our runtime at it."""
        simulate.create(self.host_root, topofile.load(topology))
        self.containerd.write_runtime_config(self.host_root)

    def up(
        self,
        plugin_args: Sequence[str] = (),
        options: KubeletOptions | None = None,
        topology: str = "vendor-8card",
        expect_devices: int = 8,
        *,
        plugin: bool = True,
    ) -> Node:
        """Simulated node + kubelet + plugin, waiting until the kubelet has the cards
        (``plugin=False``: the kubelet alone, for a scenario that starts another plugin)."""
        if not os.path.exists(self.host_root):
            self.simulate(topology)
        self.kubelet = Kubelet(
            self.tools,
            self.ledger,
            os.path.join(self.work, "kubelet"),
            self.containerd,
            cgroup_root=self.cgroup_root,
            options=options or KubeletOptions(),
        )
        self._pods = Pods(self.kubelet)
        self.kubelet.start()
        if plugin:
            self.plugin.start(plugin_args)
            self.wait_registered(expect_devices)
        return self

    @property
    def pods(self) -> Pods:
        """Pod helpers for this node's kubelet."""
        if self._pods is None:
            raise E2EError("the node is not up")
        return self._pods

    @property
    def running_kubelet(self) -> Kubelet:
        """The kubelet (after :meth:`up`)."""
        if self.kubelet is None:
            raise E2EError("the node is not up")
        return self.kubelet

    def wait_registered(self, devices: int, timeout: float = 30) -> None:
        """Wait until the kubelet's checkpoint holds ``devices`` healthy GCUs."""
        try:
            wait_for(
                f"the kubelet to hold {devices} healthy GCUs",
                lambda: registered_count() == devices,
                timeout,
                0.1,
            )
        except E2EError as exc:
            raise E2EError(
                f"{exc} (checkpoint has {registered_count()})\nplugin log:\n"
                f"{self.plugin.log()[-3000:]}\nkubelet log tail:\n"
                f"{self.running_kubelet.tail(3000)}"
            ) from None

    def probe_capacity(self, probe: str) -> tuple[int, int]:
        """Admit a pod without GCUs; the ``(capacity, allocatable)`` the kubelet computed."""
        kubelet = self.running_kubelet
        offset = kubelet.log_size()
        self.pods.create(pod_manifest(probe, [container()]))
        self.pods.wait_running(probe)
        found = capacity_in(kubelet.log(offset))
        if found is None:
            raise E2EError(f"no capacity line after admitting {probe}:\n{kubelet.log(offset)}")
        return found

    def holdings(self) -> list[podresources.Holding]:
        """PodResources ``List`` from the kubelet."""
        return podresources.list_holdings(self.running_kubelet.pod_resources_socket)

    def teardown(self) -> None:
        """Pods first (through the kubelet), then kubelet and plugin; the ledger does the rest."""
        try:
            kubelet = self.kubelet
            if (
                kubelet is not None
                and kubelet.process is not None
                and kubelet.process.poll() is None
            ):
                with contextlib.suppress(Exception):
                    self.pods.delete_all(60)
                with contextlib.suppress(E2EError):
                    wait_for(
                        "containerd tasks of deleted pods to stop",
                        lambda: not self.containerd.running_tasks(),
                        30,
                        0.2,
                    )
        finally:
            if self.kubelet is not None:
                self.kubelet.stop()
            self.plugin.stop()
            # Next scenario starts from an empty device-plugin dir (no old checkpoint).
            with contextlib.suppress(FileNotFoundError):
                for entry in os.listdir(PLUGIN_DIR):
                    path = os.path.join(PLUGIN_DIR, entry)
                    if not os.path.isdir(path):
                        os.unlink(path)


def unmount_under(directory: str) -> None:
    """Lazily unmount everything at or below ``directory``, deepest first."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted(
        (p for p in points if p == directory or p.startswith(directory + "/")),
        key=len,
        reverse=True,
    ):
        subprocess.run(["umount", "-l", point], check=False)


def read_iter(path: str) -> Iterator[str]:
    """Lines of a file, or nothing when it is missing."""
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as handle:
        yield from handle
