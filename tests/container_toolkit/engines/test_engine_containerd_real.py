"""A real containerd (Debian's 1.6) started on a private root with a config our editor wrote."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import tomlkit

from enflame_gcu.container_toolkit import engines
from tests.conftest import MakeNode
from tests.container_toolkit.engines.helpers import read

pytestmark = pytest.mark.containerd

CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
BUSYBOX = "/bin/busybox"
CRI = 'plugins."io.containerd.grpc.v1.cri"'
IMAGE = "docker.io/enflame-test/busybox:latest"
SHIM_SOCKET_DIR = "/run/containerd/s"


def base_config(directory: str) -> str:
    """A version 2 config with everything private, as an operator's config.toml would look."""
    return f"""version = 2
# private instance for the engine tests
root = "{directory}/root"
state = "{directory}/state"

[grpc]
  address = "{directory}/containerd.sock"

[ttrpc]
  address = "{directory}/containerd.sock.ttrpc"

[plugins]
  [{CRI}]
    # runc on this VM cannot lower the OOM score adjustment of containers
    restrict_oom_score_adj = true
    [{CRI}.containerd]
      default_runtime_name = "runc"
      [{CRI}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{CRI}.containerd.runtimes.runc.options]
          SystemdCgroup = true
"""


@dataclasses.dataclass(frozen=True)
class Containerd:
    """A running private containerd."""

    directory: str
    config: str
    socket: str
    namespace: str
    pid: int

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ctr against this instance in its own namespace."""
        command = [CTR, "--address", self.socket, "--namespace", self.namespace, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _shim_pids(socket: str) -> list[int]:
    """Shims this containerd started (they name its socket on their command line)."""
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


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _remove_namespace_cgroups(namespace: str) -> None:
    """runc removes each container's cgroup, but not the ``/<namespace>`` parent containerd puts
    them under (cgroupfs driver): remove it in every hierarchy when empty, so no run of this
    file leaves a top-level cgroup on the machine."""
    root = "/sys/fs/cgroup"
    candidates = [os.path.join(root, namespace)]
    with contextlib.suppress(OSError):
        candidates += [os.path.join(root, h, namespace) for h in sorted(os.listdir(root))]
    for path in candidates:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _unmount_under(directory: str) -> None:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted((p for p in points if p.startswith(directory + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    """Configure a base config with our editor, start containerd on it, stop it by PID after."""
    if not os.access(CONTAINERD, os.X_OK) or not os.access(CTR, os.X_OK):
        pytest.fail(
            f"containerd and ctr are required ({CONTAINERD}, {CTR}); run scripts/bootstrap.sh"
        )
    # A short directory: unix socket paths are limited to 107 bytes.
    # containerd 1.6 fixes the shim socket directory at /run/containerd/s: remember whether it
    # was there so teardown removes it only if this test created it (and it is empty).
    shim_dirs_existed = os.path.isdir(SHIM_SOCKET_DIR)
    directory = tempfile.mkdtemp(prefix="enflame-ctd-", dir="/tmp")
    config = os.path.join(directory, "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(base_config(directory))
    engines.configure("containerd", config, engines.RuntimeOptions(runtime_path=RUNC))
    socket = os.path.join(directory, "containerd.sock")
    log = open(os.path.join(directory, "containerd.log"), "wb")  # noqa: SIM115 - closed below
    # containerd hands its environment to the shims, and they to the runtime binary: this is
    # how the GCU runtime finds its (test) config when ctr runs it.
    env = {
        **os.environ,
        "ENFLAME_CONTAINER_RUNTIME_CONFIG": os.path.join(directory, "runtime.toml"),
    }
    process = subprocess.Popen([CONTAINERD, "--config", config], stdout=log, stderr=log, env=env)
    instance = Containerd(
        directory, config, socket, f"enflame-test-{uuid.uuid4().hex[:8]}", process.pid
    )
    try:
        deadline = time.monotonic() + 30
        while instance.ctr("version").returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(directory, "containerd.log"), encoding="utf-8") as handle:
                    pytest.fail(f"containerd did not come up:\n{handle.read()[-3000:]}")
            time.sleep(0.2)
        yield instance
    finally:
        shims = _shim_pids(socket)
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        for pid in shims:
            _stop(pid)
        log.close()
        _remove_namespace_cgroups(instance.namespace)
        _unmount_under(directory)
        shutil.rmtree(directory, ignore_errors=True)
        if not shim_dirs_existed:
            for leftover in (SHIM_SOCKET_DIR, os.path.dirname(SHIM_SOCKET_DIR)):
                with contextlib.suppress(OSError):
                    os.rmdir(leftover)


def test_config_dump_shows_the_runtime_with_runc_options(containerd: Containerd) -> None:
    dump = subprocess.run(
        [CONTAINERD, "--config", containerd.config, "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    cri = tomlkit.parse(dump).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]
    runtime = cri["containerd"]["runtimes"]["enflame"]
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"]["BinaryName"] == RUNC
    assert runtime["options"]["SystemdCgroup"] is True
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["default_runtime_name"] == "runc"


def _blob(files: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    files[f"blobs/sha256/{digest}"] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def busybox_image_tar(path: str) -> None:
    """Write an OCI image layout archive whose only layer holds busybox-static at /bin."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        for directory in ("bin", "dev", "proc", "sys", "tmp"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(info)
        layer.add(BUSYBOX, arcname="bin/busybox")
    layer_data = layer_buffer.getvalue()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    files: dict[str, bytes] = {}
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/busybox", "sh"]},
        "rootfs": {
            "type": "layers",
            "diff_ids": [f"sha256:{hashlib.sha256(layer_data).hexdigest()}"],
        },
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _blob(
            files, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"
        ),
        "layers": [_blob(files, layer_data, "application/vnd.oci.image.layer.v1.tar")],
    }
    descriptor = _blob(files, json.dumps(manifest).encode(), manifest["mediaType"])  # type: ignore[arg-type]
    descriptor["platform"] = {"architecture": arch, "os": "linux"}
    descriptor["annotations"] = {
        "io.containerd.image.name": IMAGE,
        "org.opencontainers.image.ref.name": "latest",
    }
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [descriptor]}).encode()
    files["oci-layout"] = b'{"imageLayoutVersion": "1.0.0"}'
    with tarfile.open(path, "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def run_container(containerd: Containerd, runtime: str, env: dict[str, str], *argv: str) -> str:
    """Import the test image and run ``argv`` in a throwaway container; returns its stdout."""
    archive = os.path.join(containerd.directory, "busybox.tar")
    busybox_image_tar(archive)
    imported = containerd.ctr("images", "import", archive)
    assert imported.returncode == 0, imported.stderr
    env_flags = [flag for key, value in env.items() for flag in ("--env", f"{key}={value}")]
    name = f"enflame-{uuid.uuid4().hex[:8]}"
    # Private FIFO and runc state dirs; only the shim's socket dir (/run/containerd/s) is
    # fixed in containerd 1.6, and the shim removes its socket when it exits.
    private = [
        "--fifo-dir",
        f"{containerd.directory}/fifo",
        "--runc-root",
        f"{containerd.directory}/runc",
    ]
    # The command then waits a moment before it exits with the command's status: ctr can lose
    # the output of a process that exits right after printing (containerd's IO copy racing the
    # task's exit; make test lost a whole `ls /dev` once under load, exit status 0).
    held = ("/bin/busybox", "sh", "-c", '"$@"; status=$?; sleep 0.3; exit $status', "sh", *argv)
    result = containerd.ctr(
        "run", "--rm", *private, "--runc-binary", runtime, *env_flags, IMAGE, name, *held
    )
    assert result.returncode == 0, f"ctr run failed ({result.returncode}): {result.stderr}"
    return result.stdout


def test_ctr_runs_a_container_through_the_configured_runtime_binary(containerd: Containerd) -> None:
    # The runtime entry our editor wrote names runc here; ctr takes the binary directly.
    cri = tomlkit.parse(read(containerd.config)).unwrap()
    runtime = cri["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["enflame"]
    listing = run_container(
        containerd, runtime["options"]["BinaryName"], {}, "/bin/busybox", "ls", "/dev"
    )
    entries = listing.split()
    assert {"null", "zero", "urandom", "pts", "shm"} <= set(entries)
    assert not [e for e in entries if e.startswith("gcu")]


def test_ctr_run_with_the_gcu_runtime_sees_the_selected_card(
    containerd: Containerd, make_node: MakeNode
) -> None:
    # The console script next to this interpreter: the venv's enflame-container-runtime.
    runtime = os.path.join(sys.prefix, "bin", "enflame-container-runtime")
    assert os.access(runtime, os.X_OK), f"{runtime} is not installed (pip install -e .)"
    node = make_node("vendor-8card")
    with open(os.path.join(containerd.directory, "runtime.toml"), "w", encoding="utf-8") as handle:
        handle.write(
            f'root = "{node}"\n'
            f'log-file = "{containerd.directory}/runtime.log"\n'
            'log-level = "debug"\n'
            f'runtimes = ["{RUNC}"]\n'
        )
    listing = run_container(
        containerd, runtime, {"ENFLAME_VISIBLE_DEVICES": "0"}, "/bin/busybox", "ls", "/dev"
    )
    entries = set(listing.split())
    assert {"gcu0", "gcuctl"} <= entries, listing
    assert not {f"gcu{n}" for n in range(1, 8)} & entries


def test_containerd_1x_imports_replace_whole_plugin_tables(tmp_path: os.PathLike[str]) -> None:
    # Why --drop-in is refused for version 2 configs: this containerd drops the main config's
    # CRI settings as soon as an imported file names the same plugin.
    main = os.path.join(str(tmp_path), "config.toml")
    drop_in = os.path.join(str(tmp_path), "99-enflame.toml")
    with open(main, "w", encoding="utf-8") as handle:
        handle.write(f'version = 2\nimports = ["{drop_in}"]\n[{CRI}]\n  sandbox_image = "mine:1"\n')
    with open(drop_in, "w", encoding="utf-8") as handle:
        handle.write(f'version = 2\n[{CRI}.containerd]\n  default_runtime_name = "enflame"\n')
    dump = subprocess.run(
        [CONTAINERD, "--config", main, "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    cri = tomlkit.parse(dump).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "enflame"
    assert cri["sandbox_image"] != "mine:1"


def test_containerd_16_reads_the_annotation_pass_through_we_write(
    tmp_path: os.PathLike[str],
) -> None:
    # containerd's own config loader keeps container_annotations (a key it knows) and drops
    # the pod_annotations patterns that would name devices (we never write them).
    config = os.path.join(str(tmp_path), "config.toml")
    typed = 'runtime_type = "io.containerd.runc.v2"\n'
    text = base_config(str(tmp_path)).replace(
        typed, typed + '        pod_annotations = ["cdi.k8s.io/*", "io.kata.*"]\n', 1
    )
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(text)
    options = engines.RuntimeOptions(runtime_path=RUNC, cdi_annotations=True)
    engines.configure("containerd", config, options)
    dump = subprocess.run(
        [CONTAINERD, "--config", config, "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    runtimes = tomlkit.parse(dump).unwrap()["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "runtimes"
    ]
    assert runtimes["enflame"]["container_annotations"] == ["cdi.k8s.io/*"]
    assert runtimes["enflame"]["pod_annotations"] == ["io.kata.*"]
    assert runtimes["runc"]["pod_annotations"] == ["cdi.k8s.io/*", "io.kata.*"]
