"""Each node mode with real parts: a GCU pod gets exactly its cards, a non-GCU pod is untouched.

The chain is the production one except the kubelet: the real device plugin service (resolved
from ``--node-mode`` like the DaemonSet's) answers Allocate over its gRPC socket, and that
answer goes into CreateContainer on a real containerd 1.6 through its CRI, as the kubelet
would send it (tests/kubelet runs the real kubelet for device-specs too). The engine config is
the operator's, edited by our own editor as ``enflame-ctk install --mode`` does. CDI is
consumed by podman (containerd 1.6 resolves no CDI); containerd >= 1.7 and CRI-O are not here.
The simulated node's /dev lives under its root, so DeviceSpecs' host paths are read there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import yaml

from enflame_gcu._proto import api_pb2, api_pb2_grpc
from enflame_gcu.container_toolkit import cdi_keeper
from enflame_gcu.device_plugin import kubelet, main, runner
from enflame_gcu.simulation.testing import plugin_process
from tests.e2e.cri import harness

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

CARDS = ["gcu0", "gcu1", "gcuctl"]
ALL_CARDS = [*(f"gcu{n}" for n in range(8)), "gcuctl"]


@pytest.fixture
def node() -> Iterator[tuple[str, str]]:
    """A simulated vendor 8-card node: (host root, plugin dir)."""
    work, root, plugins = plugin_process.make_node("vendor-8card")
    yield root, plugins
    shutil.rmtree(work, ignore_errors=True)


def allocate(root: str, plugins: str, mode: str, ids: list[str]) -> Any:
    """The plugin's Allocate answer for ``ids`` with the DaemonSet's flags for ``mode``."""
    config = main.load_config(
        [f"--node-mode={mode}", f"--host-root={root}", f"--plugin-dir={plugins}"], {}
    )

    async def call() -> Any:
        resource = runner.NodeResources(config)
        server = kubelet.ResourceServer(config, resource.state)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{config.socket_path}") as channel:
                request = api_pb2.AllocateRequest()
                request.container_requests.add(devices_ids=ids)
                answer = await api_pb2_grpc.DevicePluginStub(channel).Allocate(request, timeout=10)
                return answer.container_responses[0]
        finally:
            await server.stop()

    return asyncio.run(call())


def cri_request(root: str, answer: Any) -> dict[str, Any]:
    """What the kubelet puts into CreateContainer from an Allocate answer."""
    return {
        "envs": dict(answer.envs),
        "devices": [
            (d.container_path, os.path.join(root, d.host_path.lstrip("/")), d.permissions)
            for d in answer.devices
        ],
        "mounts": [(m.host_path, m.container_path, m.read_only) for m in answer.mounts],
        "annotations": dict(answer.annotations),
    }


def gcus(pod: harness.Pod) -> list[str]:
    return [d for d in pod.devices() if d.startswith("gcu")]


def through_wrapper(pod: harness.Pod) -> bool:
    """Whether containerd ran this pod's runtime with our wrapper as BinaryName."""
    options = base64.b64decode(pod.runtime.get("Options", {}).get("value", ""))
    return b"enflame-container-runtime" in options


@pytest.fixture
def engine(request: pytest.FixtureRequest, node: tuple[str, str]) -> Iterator[harness.Engine]:
    instance = harness.Engine(request.param, node_root=node[0])
    try:
        instance.configure()
        instance.start()
        yield instance
    finally:
        instance.stop()


@pytest.mark.parametrize("engine", ["device-specs"], indirect=True)
def test_device_specs_gcu_pod_gets_exactly_its_cards_and_nothing_of_ours_runs(
    engine: harness.Engine, node: tuple[str, str]
) -> None:
    root, plugins = node
    with open(engine.config, encoding="utf-8") as handle:
        assert handle.read() == harness.base_config(engine.directory)  # the engine untouched
    answer = allocate(root, plugins, "auto", ["gcu1", "gcu0"])
    assert [d.container_path for d in answer.devices] == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
    pod = engine.run_pod("gcu", **cri_request(root, answer))
    assert pod.exit_code == 0, pod.log
    assert gcus(pod) == CARDS
    assert pod.env("ENFLAME_VISIBLE_DEVICES") == "0,1"
    # containerd itself added the cgroup rules for exactly those nodes.
    allowed = {
        (rule.get("major"), rule.get("minor"))
        for rule in pod.spec["linux"]["resources"]["devices"]
        if rule.get("allow") and rule.get("major") == 238
    }
    assert allowed == {(238, 0), (238, 1), (238, 255)}
    assert not through_wrapper(pod)
    # A pod that asked for no GCU, with the image-style ENFLAME_VISIBLE_DEVICES=all: nothing.
    plain = engine.run_pod("plain", envs={"ENFLAME_VISIBLE_DEVICES": "all"})
    assert plain.exit_code == 0 and gcus(plain) == []
    assert not through_wrapper(plain)
    assert not os.path.exists(engine.launcher)  # no wrapper exists on this node at all


@pytest.mark.parametrize("engine", ["runtimeclass"], indirect=True)
def test_runtimeclass_only_pods_naming_the_handler_run_the_wrapper(
    engine: harness.Engine, node: tuple[str, str]
) -> None:
    root, plugins = node
    answer = allocate(root, plugins, "runtimeclass", ["gcu4", "gcu5"])
    assert list(answer.devices) == []  # the wrapper injects; no DeviceSpecs in this mode
    pod = engine.run_pod("gcu", handler=harness.RUNTIME_NAME, **cri_request(root, answer))
    assert pod.exit_code == 0, pod.log
    assert gcus(pod) == ["gcu4", "gcu5", "gcuctl"]
    assert through_wrapper(pod)
    plain = engine.run_pod("plain", envs={"ENFLAME_VISIBLE_DEVICES": "all"})
    assert plain.exit_code == 0 and gcus(plain) == []
    assert not through_wrapper(plain)
    log = engine.runtime_log_text()
    assert pod.container_id in log
    assert plain.container_id not in log and plain.sandbox_id not in log


@pytest.mark.parametrize("engine", ["default-runtime"], indirect=True)
def test_default_runtime_runs_every_pod_through_the_wrapper(
    engine: harness.Engine, node: tuple[str, str]
) -> None:
    root, plugins = node
    answer = allocate(root, plugins, "default-runtime", ["gcu2"])
    pod = engine.run_pod("gcu", **cri_request(root, answer))
    assert pod.exit_code == 0, pod.log
    assert gcus(pod) == ["gcu2", "gcuctl"]
    plain = engine.run_pod("plain")
    assert plain.exit_code == 0 and gcus(plain) == []
    assert through_wrapper(plain)  # the cost every container pays in this mode
    # The guarantee this mode (with the vendor-compatible defaults) does not give: a pod that
    # asked for no GCU but carries ENFLAME_VISIBLE_DEVICES=all sees every card.
    greedy = engine.run_pod("greedy", envs={"ENFLAME_VISIBLE_DEVICES": "all"})
    assert gcus(greedy) == ALL_CARDS


# --- cdi: podman consumes the specs the keeper writes -------------------------------------------

PODMAN = shutil.which("podman") or "/usr/bin/podman"
CDI_DIR = "/var/run/cdi"  # podman 4.3 reads only /etc/cdi and /var/run/cdi
SHELL = ("/bin/sh", "-c", harness.REPORT)


@pytest.fixture
def podman_env() -> Iterator[tuple[list[str], str]]:
    """(podman argv prefix, rootfs) with private storage; the rootfs holds busybox."""
    if not os.access(PODMAN, os.X_OK):
        pytest.fail(f"podman is required ({PODMAN}); run scripts/bootstrap.sh")
    base = tempfile.mkdtemp(prefix="enf-pm-", dir="/tmp")  # podman wants a runroot < 50 bytes
    rootfs = os.path.join(base, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"))
    shutil.copy(harness.BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
    for applet in harness.APPLETS:
        os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    prefix = [
        PODMAN,
        "--root",
        os.path.join(base, "storage"),
        "--runroot",
        os.path.join(base, "run"),
        "--storage-driver",
        "vfs",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "none",
    ]
    # podman keeps runc's state in runc's default root whatever --runroot says: made here when
    # missing, so removed again (when empty) after.
    runc_root_existed = os.path.isdir(harness.RUNC_DEFAULT_ROOT)
    yield prefix, rootfs
    subprocess.run([*prefix, "rm", "--all", "--force"], capture_output=True, check=False)
    _unmount_under(base)
    shutil.rmtree(base, ignore_errors=True)
    if not runc_root_existed:
        with contextlib.suppress(OSError):
            os.rmdir(harness.RUNC_DEFAULT_ROOT)


def _unmount_under(directory: str) -> None:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted((p for p in points if p.startswith(directory + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def podman_run(prefix: list[str], rootfs: str, *args: str) -> subprocess.CompletedProcess[str]:
    # This VM forbids raising rlimits (no CAP_SYS_RESOURCE): ask for lower ones explicitly.
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    return subprocess.run(
        [*prefix, "run", "--rm", "--network", "none", *limits, *args, "--rootfs", rootfs, *SHELL],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cdi_podman_injects_exactly_the_named_cards_from_the_kept_spec(
    node: tuple[str, str], podman_env: tuple[list[str], str], tmp_path: Any
) -> None:
    root, plugins = node
    prefix, rootfs = podman_env
    answer = allocate(root, plugins, "cdi", ["gcu6", "gcu3"])
    names = [d.name for d in answer.cdi_devices]
    assert names == ["enflame.com/gcu=3", "enflame.com/gcu=6"]
    assert list(answer.devices) == []
    # The spec as the keeper writes it; installed under a vendor of this test's own, since
    # podman reads only the fixed system dirs and other runs may share them.
    output = os.path.join(str(tmp_path), "cdi")
    assert cdi_keeper.refresh(root, output)
    with open(os.path.join(output, "enflame.com-gcu.yaml"), encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    vendor = f"t{uuid.uuid4().hex[:10]}.enflame.com"
    spec["kind"] = f"{vendor}/gcu"
    # The host may have no CDI dir: one made here goes again after (make test's host check).
    made = not os.path.isdir(CDI_DIR)
    os.makedirs(CDI_DIR, exist_ok=True)
    installed = os.path.join(CDI_DIR, f"{vendor}.yaml")
    with open(installed, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    try:
        flags = [f for n in names for f in ("--device", n.replace("enflame.com", vendor, 1))]
        env = [f for k, v in answer.envs.items() for f in ("--env", f"{k}={v}")]
        result = podman_run(prefix, rootfs, *flags, *env)
        assert result.returncode == 0, result.stderr
        seen = sorted(line.split()[-1] for line in result.stdout.splitlines() if "dev: gcu" in line)
        assert seen == ["gcu3", "gcu6", "gcuctl"]
        assert "env: ENFLAME_VISIBLE_DEVICES=3,6" in result.stdout
        plain = podman_run(prefix, rootfs, "--env", "ENFLAME_VISIBLE_DEVICES=all")
        assert plain.returncode == 0, plain.stderr
        assert "dev: gcu" not in plain.stdout
    finally:
        os.unlink(installed)
        if made:
            with contextlib.suppress(OSError):  # another run's spec may be there now
                os.rmdir(CDI_DIR)
