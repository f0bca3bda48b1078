"""Real runc + busybox-static containers on a simulated node, started through our runtime.

Missing runc or busybox is a failure, not a skip: ``make test`` installs both (scripts/
bootstrap.sh), and a runtime wrapper that was never run in front of runc is untested.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.shim import launch

BUSYBOX_APPLETS = ("sh", "ls", "cat", "true", "echo", "env", "sleep")
INSTALL_HINT = "run `make setup` as root (scripts/bootstrap.sh installs runc and busybox-static)"


@dataclass(frozen=True, slots=True)
class Tools:
    """Absolute paths of the real tools the e2e tests use."""

    runc: str
    busybox: str


def _is_static(path: str) -> bool:
    """True when an ELF binary has no PT_INTERP program header (so it runs in an empty rootfs)."""
    with open(path, "rb") as handle:
        data = handle.read(1 << 16)
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    phoff = int.from_bytes(data[32:40], "little")
    size, count = int.from_bytes(data[54:56], "little"), int.from_bytes(data[56:58], "little")
    return all(
        int.from_bytes(data[phoff + i * size : phoff + i * size + 4], "little") != 3
        for i in range(count)
    )


@pytest.fixture(scope="session")
def tools() -> Tools:
    """runc and a static busybox, or a loud failure saying how to get them."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the runc tests must run as root")
    runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    if not runc:
        problems.append("runc is not installed")
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        problems.append("busybox is not installed")
    elif not _is_static(busybox):
        problems.append(f"{busybox} is not statically linked (install busybox-static)")
    if problems:
        pytest.fail(f"cannot run real containers: {'; '.join(problems)}; {INSTALL_HINT}")
    return Tools(str(runc), busybox)


@pytest.fixture(scope="session")
def base_spec(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The spec `runc spec` writes, loaded once."""
    directory = str(tmp_path_factory.mktemp("runc-spec"))
    subprocess.run([tools.runc, "spec", "--bundle", directory], check=True)
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as handle:
        spec: dict[str, Any] = json.load(handle)
    return spec


@dataclass
class Node:
    """One test's containers: a rootfs, a runc state root, our runtime config and launcher."""

    tools: Tools
    base: dict[str, Any]
    workdir: str
    root: str
    wrapper: str
    config: str
    state: str
    log: str
    created: list[str] = field(default_factory=list)

    def ignore_envvar_when_unprivileged(self) -> None:
        """Rewrite the runtime config with ``accept-envvar-when-unprivileged = false``."""
        write_runtime_config(
            self.config,
            runtimes=[self.tools.runc],
            root=self.root,
            accept_envvar_when_unprivileged=False,
            log_file=os.path.join(self.workdir, "runtime.log"),
        )

    def new_id(self) -> str:
        """A container id unique across parallel test runs."""
        cid = f"enf-e2e-{uuid.uuid4().hex[:12]}"
        self.created.append(cid)
        return cid

    def bundle(
        self,
        args: list[str],
        *,
        env: list[str] | None = None,
        mounts: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None,
        privileged: bool = False,
        edit: Any = None,
    ) -> str:
        """A bundle dir whose config.json runs ``args`` in the busybox rootfs."""
        bundle = os.path.join(self.workdir, f"bundle-{uuid.uuid4().hex[:8]}")
        rootfs = os.path.join(bundle, "rootfs")
        os.makedirs(os.path.join(rootfs, "bin"))
        shutil.copy2(self.tools.busybox, os.path.join(rootfs, "bin", "busybox"))
        for applet in BUSYBOX_APPLETS:
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
        spec = copy.deepcopy(self.base)
        spec["process"].update(terminal=False, args=args)
        spec["process"]["env"].extend(env or [])
        spec["mounts"].extend(mounts or [])
        if annotations:
            spec["annotations"] = dict(annotations)
        if privileged:
            for key in ("bounding", "effective", "permitted"):
                spec["process"]["capabilities"][key].append("CAP_SYS_ADMIN")
        if edit is not None:
            edit(spec)
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=1)
        return bundle

    def runtime_args(self, *args: str) -> list[str]:
        """Global flags as the containerd shim passes them, then ``args``."""
        return ["--root", self.state, "--log", self.log, "--log-format", "json", *args]

    def wrapped(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Call our runtime (the installed launcher) with shim-style global flags."""
        return launch.run(self.wrapper, self.runtime_args(*args), self.config)

    def plain(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Call runc directly with the same global flags."""
        return subprocess.run(
            [self.tools.runc, *self.runtime_args(*args)], capture_output=True, check=False
        )

    def run(self, bundle: str, through_wrapper: bool = True) -> subprocess.CompletedProcess[bytes]:
        """``run --bundle B ID`` in the foreground; the container's stdout is the result's."""
        call = self.wrapped if through_wrapper else self.plain
        return call("run", "--bundle", bundle, self.new_id())

    def exists(self, cid: str) -> bool:
        """Whether runc knows the container."""
        return self.plain("state", cid).returncode == 0

    def wait_stopped(self, cid: str, timeout: float = 20) -> None:
        """Poll runc state until the container has stopped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.plain("state", cid)
            if result.returncode == 0 and json.loads(result.stdout)["status"] == "stopped":
                return
            time.sleep(0.05)
        raise AssertionError(f"container {cid} did not stop within {timeout}s")


def gcu_nodes(output: bytes) -> list[str]:
    """The GCU device names in ``ls /dev`` output."""
    return [name for name in output.decode().split() if "gcu" in name]


def write_runtime_config(path: str, **values: Any) -> str:
    """A runtime config.toml from keyword values (underscores become dashes)."""
    lines = [f"{key.replace('_', '-')} = {json.dumps(value)}" for key, value in values.items()]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


@pytest.fixture
def node(
    tools: Tools, base_spec: dict[str, Any], vendor_node: str, tmp_path: os.PathLike[str]
) -> Iterator[Node]:
    """A simulated vendor 8-card node with our runtime in front of the real runc."""
    workdir = str(tmp_path)
    config = write_runtime_config(
        os.path.join(workdir, "config.toml"),
        runtimes=[tools.runc],
        root=vendor_node,
        log_file=os.path.join(workdir, "runtime.log"),
    )
    result = Node(
        tools=tools,
        base=base_spec,
        workdir=workdir,
        root=vendor_node,
        wrapper=launch.write_launcher(workdir),
        config=config,
        state=os.path.join(workdir, "runc-state"),
        log=os.path.join(workdir, "runc-log.json"),
    )
    yield result
    for cid in result.created:
        subprocess.run(
            [tools.runc, "--root", result.state, "delete", "--force", cid],
            capture_output=True,
            check=False,
        )
