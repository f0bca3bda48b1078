"""A private containerd 1.6 driven through its CRI (as a kubelet drives it), per node mode.

The CRI client is compiled at first use from ``runtime_subset.proto`` (grpcio-tools, a dev
dependency) into a temporary directory. Pods run with the node's network namespace, so no CNI
is needed; the sandbox image is busybox sleeping. The engine config starts as an operator's
plain runc config and is then edited by our own ``engines.configure`` exactly as
``enflame-ctk install --mode`` would for the mode (device-specs: not at all). Everything lives
under one short directory in /tmp except containerd 1.6's fixed shim socket dir
/run/containerd/s and runc's default root /run/runc (removed again when this engine made them);
processes are stopped by PID and mounts under the directory are undone.

Shared by ``test_node_modes_cri.py`` and ``benchmarks/bench_modes.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from enflame_gcu import devices
from enflame_gcu.container_toolkit import cdi, engines
from enflame_gcu.shim import launcher
from enflame_gcu.simulation.testing import oci_image

CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
RUNC = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin") or "/usr/sbin/runc"
BUSYBOX = shutil.which("busybox") or "/bin/busybox"
IMAGE = "docker.io/enflame-modes/busybox:1"
SANDBOX_IMAGE = "docker.io/enflame-modes/sandbox:1"
CRI = 'plugins."io.containerd.grpc.v1.cri"'
SHIM_SOCKET_DIR = "/run/containerd/s"
# runc's default state root: the runtimes our install adds (enflame, in runtimeclass and
# default-runtime modes) carry no Root option, so runc keeps their containers' state there.
RUNC_DEFAULT_ROOT = "/run/runc"
# Host dirs containerd and runc make when missing; removed again (when empty) if they were.
# Engines overlap (one per mode), so what existed is taken when the first live engine starts
# and the dirs go when the last one stops.
HOST_DIRS = (SHIM_SOCKET_DIR, os.path.dirname(SHIM_SOCKET_DIR), RUNC_DEFAULT_ROOT)
_live_engines: set[int] = set()
_host_dirs_existed: dict[str, bool] = {}
APPLETS = ("sh", "ls", "cat", "echo", "true", "sleep", "env", "grep", "tr", "sort")
RUNTIME_NAME = "enflame"


@functools.cache
def stubs() -> tuple[ModuleType, ModuleType]:
    """(messages, services) of the CRI subset, compiled once per process."""
    # dev dependency: only the tests and the benchmark need it
    from grpc_tools import protoc  # type: ignore[import-untyped]

    here = os.path.dirname(os.path.abspath(__file__))
    out = tempfile.mkdtemp(prefix="enflame-cri-stubs-")
    atexit.register(shutil.rmtree, out, True)
    code = protoc.main(
        [
            "protoc",
            f"-I{here}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "runtime_subset.proto",
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed on runtime_subset.proto ({code})")
    sys.path.insert(0, out)
    try:
        return importlib.import_module("runtime_subset_pb2"), importlib.import_module(
            "runtime_subset_pb2_grpc"
        )
    finally:
        sys.path.remove(out)


def base_config(directory: str) -> str:
    """An operator's plain config: runc is the default runtime; CRI on, everything private."""
    return f"""version = 2
# private containerd for the node-mode tests
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
    sandbox_image = "{SANDBOX_IMAGE}"
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
          SystemdCgroup = false
          Root = "{directory}/runc"
"""


@dataclass(frozen=True, slots=True)
class Pod:
    """What one pod's single container did and how containerd ran it."""

    sandbox_id: str
    container_id: str
    exit_code: int
    log: str
    spec: dict[str, Any]  # the OCI spec containerd stored (before any wrapper edits)
    runtime: dict[str, Any]  # containerd's runtime record: name + options (BinaryName)
    seconds: float  # RunPodSandbox until the container has exited

    def devices(self) -> list[str]:
        """The /dev entries the container listed (``ls /dev`` lines in its log)."""
        return sorted(
            line.split()[-1] for line in self.log.splitlines() if line.startswith("dev: ")
        )

    def env(self, key: str) -> str | None:
        """A variable the container printed as ``env: KEY=VALUE``."""
        prefix = f"env: {key}="
        return next(
            (line[len(prefix) :] for line in self.log.splitlines() if line.startswith(prefix)), None
        )


REPORT = (
    'for d in $(ls /dev); do echo "dev: $d"; done; '
    'echo "env: ENFLAME_VISIBLE_DEVICES=$ENFLAME_VISIBLE_DEVICES"'
)


class Engine:
    """A private containerd configured for one node mode, driven over its CRI socket."""

    def __init__(self, mode: str, node_root: str | None = None, runtime_log: bool = True) -> None:
        self.mode = mode
        self.directory = tempfile.mkdtemp(prefix="enf-cri-", dir="/tmp")
        self.config = os.path.join(self.directory, "config.toml")
        self.socket = os.path.join(self.directory, "c.sock")
        self.launcher = os.path.join(self.directory, "enflame-container-runtime")
        self.runtime_config = os.path.join(self.directory, "runtime.toml")
        self.runtime_log = os.path.join(self.directory, "runtime.log")
        self.node_root = node_root
        self.process: subprocess.Popen[bytes] | None = None
        if not _live_engines:
            _host_dirs_existed.update({path: os.path.isdir(path) for path in HOST_DIRS})
        _live_engines.add(id(self))
        self._channel: grpc.Channel | None = None
        self._log_runtime = runtime_log

    # --- set-up -------------------------------------------------------------------------------

    def configure(self) -> str:
        """Write the base config, then edit it as the mode's install does; returns the diff."""
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(base_config(self.directory))
        if self.mode in ("device-specs", "cdi"):
            return ""  # no wrapper, no engine change
        # Its own verdict file: engines of different modes use different runtime configs.
        launcher.write_launcher(
            self.launcher, sys.executable, verdict=os.path.join(self.directory, "front-verdict")
        )
        options = engines.RuntimeOptions(
            runtime_path=self.launcher, set_as_default=self.mode == "default-runtime"
        )
        change = engines.configure("containerd", self.config, options)
        prepared = os.path.join(self.directory, "prepared-edits.json")
        if self.node_root is None or not cdi.refresh_prepared_edits(
            prepared, devices.discover(self.node_root)
        ):
            prepared = ""  # as the installer leaves a node without usable cards: discovery
        lines = [
            f"root = {json.dumps(self.node_root or '/')}",
            f"runtimes = {json.dumps([RUNC])}",
            f"prepared-edits = {json.dumps(prepared)}",
        ]
        if self._log_runtime:
            lines += [f"log-file = {json.dumps(self.runtime_log)}", 'log-level = "debug"']
        else:
            lines.append('log-file = ""')
        with open(self.runtime_config, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        return change.diff

    def start(self) -> None:
        """Start containerd and import the two images."""
        log = open(os.path.join(self.directory, "containerd.log"), "ab")  # noqa: SIM115 - closed below
        env = {**os.environ, "ENFLAME_CONTAINER_RUNTIME_CONFIG": self.runtime_config}
        try:
            self.process = subprocess.Popen(
                [CONTAINERD, "--config", self.config],
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not come up:\n{self.log_tail()}")
            time.sleep(0.1)
        sleeper = {"/bin/busybox": BUSYBOX}
        images = (
            oci_image.ImageSpec(
                name=SANDBOX_IMAGE, files=sleeper, entrypoint=("/bin/busybox", "sleep", "100000")
            ),
            oci_image.ImageSpec(
                name=IMAGE,
                files=sleeper,
                symlinks={f"/bin/{applet}": "busybox" for applet in APPLETS},
                cmd=("/bin/sh",),
            ),
        )
        for spec in images:
            archive = os.path.join(self.directory, f"image-{uuid.uuid4().hex[:6]}.tar")
            oci_image.write_archive(archive, spec)
            self.ctr("images", "import", archive)
            os.unlink(archive)
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` in the CRI's namespace."""
        command = [CTR, "--address", self.socket, "--namespace", "k8s.io", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {result.stderr}")
        return result

    def log_tail(self, size: int = 3000) -> str:
        """The end of containerd's log."""
        with open(
            os.path.join(self.directory, "containerd.log"), encoding="utf-8", errors="replace"
        ) as handle:
            return handle.read()[-size:]

    # --- pods ---------------------------------------------------------------------------------

    def run_pod(
        self,
        name: str,
        *,
        handler: str = "",
        envs: Mapping[str, str] | None = None,
        devices: Sequence[tuple[str, str, str]] = (),
        annotations: Mapping[str, str] | None = None,
        mounts: Sequence[tuple[str, str, bool]] = (),
        script: str = REPORT,
        keep: bool = False,
    ) -> Pod:
        """Run a one-container pod to completion as the kubelet would, then remove it."""
        messages, services = stubs()
        assert self._channel is not None, "start() first"
        runtime = services.RuntimeServiceStub(self._channel)
        uid = uuid.uuid4().hex
        logs = os.path.join(self.directory, "pods", uid)
        os.makedirs(logs)
        namespaces = messages.NamespaceOption(network=messages.NODE)
        sandbox = messages.PodSandboxConfig(
            metadata=messages.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
            log_directory=logs,
            linux=messages.LinuxPodSandboxConfig(
                security_context=messages.LinuxSandboxSecurityContext(namespace_options=namespaces)
            ),
        )
        started = time.perf_counter()
        sandbox_id = runtime.RunPodSandbox(
            messages.RunPodSandboxRequest(config=sandbox, runtime_handler=handler), timeout=60
        ).pod_sandbox_id
        try:
            config = messages.ContainerConfig(
                metadata=messages.ContainerMetadata(name="main"),
                image=messages.ImageSpec(image=IMAGE),
                command=["/bin/sh", "-c", script],
                envs=[messages.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
                devices=[
                    messages.Device(container_path=c, host_path=h, permissions=p)
                    for c, h, p in devices
                ],
                mounts=[
                    messages.Mount(container_path=c, host_path=h, readonly=r) for h, c, r in mounts
                ],
                annotations=dict(annotations or {}),
                log_path="main.log",
            )
            container_id = runtime.CreateContainer(
                messages.CreateContainerRequest(
                    pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox
                ),
                timeout=60,
            ).container_id
            runtime.StartContainer(
                messages.StartContainerRequest(container_id=container_id), timeout=60
            )
            deadline = time.monotonic() + 60
            while True:
                status = runtime.ContainerStatus(
                    messages.ContainerStatusRequest(container_id=container_id), timeout=30
                ).status
                if status.state == messages.CONTAINER_EXITED:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pod {name} did not finish: {status}")
                time.sleep(0.002)
            seconds = time.perf_counter() - started
            info: dict[str, Any] = json.loads(self.ctr("containers", "info", container_id).stdout)
            with open(os.path.join(logs, "main.log"), encoding="utf-8") as handle:
                # CRI log lines: "<time> <stream> <tag> <text>"
                text = "\n".join(line.split(" ", 3)[-1] for line in handle.read().splitlines())
            return Pod(
                sandbox_id,
                container_id,
                status.exit_code,
                text,
                info["Spec"],
                info["Runtime"],
                seconds,
            )
        finally:
            if not keep:
                self.remove_pod(sandbox_id)
            shutil.rmtree(logs, ignore_errors=True)

    def remove_pod(self, sandbox_id: str) -> None:
        """Stop and remove a pod sandbox (and its containers)."""
        messages, services = stubs()
        assert self._channel is not None
        runtime = services.RuntimeServiceStub(self._channel)
        with contextlib.suppress(grpc.RpcError):
            runtime.StopPodSandbox(
                messages.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60
            )
        with contextlib.suppress(grpc.RpcError):
            runtime.RemovePodSandbox(
                messages.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60
            )

    def runtime_log_text(self) -> str:
        """What our wrapper logged (empty when it never ran)."""
        try:
            with open(self.runtime_log, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    # --- tear-down ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop containerd and its shims by PID, undo mounts, remove the directory."""
        if self._channel is not None:
            self._channel.close()
        shims = _shim_pids(self.socket)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _unmount_under(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        _live_engines.discard(id(self))
        if not _live_engines:
            for leftover in HOST_DIRS:
                if not _host_dirs_existed.get(leftover, True):
                    with contextlib.suppress(OSError):
                        os.rmdir(leftover)


def _shim_pids(socket: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket.encode() in argv:
            pids.append(int(entry))
    return pids


def _unmount_under(directory: str) -> None:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted((p for p in points if p.startswith(directory + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
