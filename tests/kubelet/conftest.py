"""Fixtures of the real-kubelet tier (``make e2e``; excluded from ``make test`` by its marker).

One private containerd per session (configured by our ``enflame-ctk runtime configure``), one
kubelet + plugin + simulated node per scenario. The session's finalizer undoes the ledger and
fails loudly if the host differs from the snapshot taken before the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest

from tests.kubelet import harness, host

KUBELET_DIR_ENV = "ENFLAME_E2E_KUBELET_DIR"
HOW = "run `make e2e` (scripts/e2e.sh builds the kubelet into a cache and sets it)"


@dataclass(frozen=True, slots=True)
class Tier:
    """The session's shared pieces."""

    tools: harness.Tools
    ledger: host.Ledger
    containerd: harness.Containerd
    cgroup_root: str
    work: str


def _tools() -> harness.Tools:
    directory = os.environ.get(KUBELET_DIR_ENV)
    if not directory:
        pytest.fail(f"{KUBELET_DIR_ENV} is not set: {HOW}")
    tools = harness.Tools(
        kubelet=os.path.join(directory, "bin", "kubelet"),
        pause=os.path.join(directory, "bin", "pause"),
        containerd=shutil.which("containerd") or "/usr/bin/containerd",
        ctr=shutil.which("ctr") or "/usr/bin/ctr",
        runc=shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin") or "runc",
        busybox=shutil.which("busybox") or "/bin/busybox",
    )
    missing = [path for path in dataclasses.astuple(tools) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"missing tools {missing}: {HOW}")
    return tools


def _preflight() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("the real-kubelet tier must run as root")
    if harness.listening(harness.KUBELET_SOCKET):
        problems.append(f"a kubelet is already serving {harness.KUBELET_SOCKET}")
    if os.path.exists(host.KUBELET_ROOT):
        problems.append(f"{host.KUBELET_ROOT} exists: this looks like a Kubernetes node")
    if host.gcu_dev_nodes():
        problems.append(f"this host has GCU device nodes {host.gcu_dev_nodes()}")
    if problems:
        pytest.fail("refusing to run the real-kubelet tier here: " + "; ".join(problems))


def _make_cgroup_root(name: str) -> None:
    for hierarchy in host.cgroup_hierarchies():
        path = os.path.join(hierarchy, name)
        os.makedirs(path, exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset starts empty
            source = os.path.join(hierarchy, knob)
            if os.path.exists(source):
                with open(source, encoding="utf-8") as handle:
                    value = handle.read().strip()
                with open(os.path.join(path, knob), "w", encoding="utf-8") as handle:
                    handle.write(value)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def tier() -> Iterator[Tier]:
    """Preflight, ledger, cgroup root and the private containerd; everything undone after."""
    tools = _tools()
    for line in host.recover():
        print(f"recovered from a previous run: {line}")
    _preflight()
    before = host.snapshot()
    os.makedirs(host.cache_dir(), exist_ok=True)
    with open(host.snapshot_path(), "w", encoding="utf-8") as handle:
        json.dump(before, handle, indent=1)
    ledger = host.Ledger(host.ledger_path())
    ledger.begin()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        work = ledger.private_dir(tempfile.mkdtemp(prefix="enf-kl-", dir="/tmp"))
        ledger.cgroup_name = f"enflame-e2e-{os.getpid()}"
        ledger.save()
        _make_cgroup_root(ledger.cgroup_name)
        containerd = harness.Containerd(tools, ledger, os.path.join(work, "ctd"))
        os.makedirs(containerd.directory)
        containerd.configure()
        try:
            containerd.start()
            yield Tier(tools, ledger, containerd, f"/{ledger.cgroup_name}", work)
        finally:
            containerd.stop()
    finally:
        done = ledger.restore()
        signal.signal(signal.SIGTERM, previous)
        left = host.differences(before, host.snapshot())
        print(f"\nreal-kubelet tier teardown: {len(done)} undo steps; host differences: {left}")
        if left:
            pytest.fail(f"the host is not as it was before the run: {left}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item, so the node fixture can attach logs on failure."""
    outcome: Any = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture
def node(tier: Tier, request: pytest.FixtureRequest) -> Iterator[harness.Node]:
    """A fresh simulated node, kubelet and plugin (started by ``node.up()``), torn down after."""
    work = tempfile.mkdtemp(prefix="n-", dir=tier.work)
    instance = harness.Node(tier.tools, tier.ledger, tier.containerd, tier.cgroup_root, work)
    try:
        yield instance
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            kubelet_tail = instance.kubelet.tail(4000) if instance.kubelet else ""
            print(f"--- kubelet log tail ---\n{kubelet_tail}")
            print(f"--- plugin log ---\n{instance.plugin.log()[-4000:]}")
        try:
            instance.teardown()
        finally:
            if instance.kubelet is not None:
                harness.unmount_under(instance.kubelet.root_dir)
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
