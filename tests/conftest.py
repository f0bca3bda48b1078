"""Shared fixtures: simulated GCU nodes under temporary directories."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import pytest

from enflame_gcu.simulation import simulate, topofile

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS_DIR = os.path.join(os.path.dirname(PROJECT_ROOT), "shared", "schemas")

MakeNode = Callable[..., str]

# Host dirs that containerd 1.6 (its fixed shim socket dir) and runc (its default state root)
# make when missing. Tests in different xdist workers share them, so no one test can tell when
# the last user is done: the controlling process removes them at the end of the session when
# they did not exist at its start and are empty (anything left inside is a leak and stays, for
# make test's host check to name).
HOST_RUNTIME_DIRS = ("/run/containerd/s", "/run/containerd", "/run/runc")
_host_dirs_before: dict[str, bool] = {}
# The same for the parent cgroups the engines we run put containers under (cgroupfs driver):
# containerd's /<namespace> (the CRI tests' k8s.io) and podman's libpod_parent (with its conmon
# child), in every v1 hierarchy. runc and podman remove each container's own cgroup, never
# these parents; a container's cgroup still inside keeps its parent, for the host check to name.
ENGINE_CGROUPS = ("k8s.io", "libpod_parent")
CGROUP_ROOT = "/sys/fs/cgroup"
_cgroups_before: set[str] = set()


def _engine_cgroups() -> set[str]:
    paths = {os.path.join(CGROUP_ROOT, name) for name in ENGINE_CGROUPS}
    with contextlib.suppress(OSError):
        for hierarchy in os.listdir(CGROUP_ROOT):
            paths |= {os.path.join(CGROUP_ROOT, hierarchy, name) for name in ENGINE_CGROUPS}
    return {path for path in paths if os.path.isdir(path)}


def _remove_empty_cgroup(path: str) -> None:
    """``path`` and the cgroups below it, deepest first, each only when no process is in it
    (the kernel refuses to remove a cgroup with tasks or children: nothing live is lost)."""
    for root, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(root)


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):
        _host_dirs_before.update({path: os.path.isdir(path) for path in HOST_RUNTIME_DIRS})
        _cgroups_before.update(_engine_cgroups())


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _controller(config):
        return
    for path in HOST_RUNTIME_DIRS:
        if _host_dirs_before.get(path) is False:
            # Absent, or not empty: the host check says which.
            with contextlib.suppress(OSError):
                os.rmdir(path)
    for path in sorted(_engine_cgroups() - _cgroups_before):
        _remove_empty_cgroup(path)


@pytest.fixture
def make_node(tmp_path_factory: pytest.TempPathFactory) -> MakeNode:
    """Create a simulated node from a built-in name or description text; returns its root."""

    def make(topology: str = "vendor-8card", *, text: bool = False, **kwargs: object) -> str:
        root = str(tmp_path_factory.mktemp("node"))
        topo = topofile.parse(topology) if text else topofile.load(topology)
        simulate.create(root, topo, **kwargs)  # type: ignore[arg-type]
        return root

    return make


@pytest.fixture
def vendor_node(make_node: MakeNode) -> str:
    """The vendor manual's 8-card machine, simulated."""
    return make_node("vendor-8card")
