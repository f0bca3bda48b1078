"""A container restarted after the move off topscloud keeps its cards (issue 48 point 3b), with
the real kubelet (1.20) and containerd.

topscloud's plugin answers Allocate with ``ENFLAME_VISIBLE_DEVICES`` alone; its ``enflame``
runtime, containerd's default, turns that into ``/dev/gcu*``. The kubelet keeps that answer in
its checkpoint and hands it again to a container that restarts, without asking the plugin that
now serves the resource (ours, after ``enflame-ctk migrate``). So an install whose node mode
wants no wrapper as the default (``device-specs``) keeps the adopted ``enflame`` default while
a pod holds such an answer. A killed container comes back with its cards; so does one whose pod
sandbox was killed as well: containerd starts a container of a live sandbox with the sandbox's
runtime, but a new sandbox with the default of the moment, which only the kept default makes
the wrapper.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import tomlkit

from enflame_gcu.shim import launcher
from tests.kubelet import harness, host
from tests.kubelet.conftest import Tier
from tests.kubelet.test_migration import STANDING_BY, _vendor

pytestmark = pytest.mark.kubelet

SANDBOX_ID = "io.kubernetes.cri.sandbox-id"  # containerd's annotation on a container's spec
CONTAINERD_CONFIG = "/etc/containerd/config.toml"  # in the simulated node's root, as migrate reads


class TopscloudContainerd(harness.Containerd):
    """The tier's containerd as topscloud leaves it: an ``enflame`` runtime entry (the wrapper's
    binary) as the default, written by hand, none of it recorded by us; its config lives at the
    stock path under the simulated node's root, where migrate and install find it."""

    def configure(self) -> None:
        launcher.write_launcher(
            self.launcher, sys.executable, verdict=os.path.join(self.directory, "front-verdict")
        )
        text = harness.containerd_base_config(self.directory, f"{self.directory}/runc")
        text = text.replace('default_runtime_name = "runc"', 'default_runtime_name = "enflame"')
        cri = harness.CRI
        text += (
            f"      [{cri}.containerd.runtimes.enflame]\n"
            '        runtime_type = "io.containerd.runc.v2"\n'
            f"        [{cri}.containerd.runtimes.enflame.options]\n"
            f'          BinaryName = "{self.launcher}"\n'
            "          SystemdCgroup = false\n"
            f'          Root = "{self.directory}/runc"\n'
        )
        os.makedirs(os.path.dirname(self.config), exist_ok=True)
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(text)


def _default_runtime(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        document = tomlkit.parse(handle.read()).unwrap()
    return document["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"]


@pytest.fixture
def topscloud_node(tier: Tier) -> Iterator[harness.Node]:
    directory = tempfile.mkdtemp(prefix="tc-", dir=tier.work)
    containerd = TopscloudContainerd(tier.tools, tier.ledger, directory)
    work = tempfile.mkdtemp(prefix="n-", dir=tier.work)
    instance = harness.Node(tier.tools, tier.ledger, containerd, tier.cgroup_root, work)
    # migrate and install read the kubelet's directory (its checkpoint, enflame.sock) under
    # the simulated node's root: the kubelet's real one, bound there.
    inside = os.path.join(instance.host_root, harness.PLUGIN_DIR.lstrip("/"))
    try:
        instance.simulate()
        containerd.config = os.path.join(instance.host_root, CONTAINERD_CONFIG.lstrip("/"))
        containerd.configure()
        for path in (host.KUBELET_ROOT, harness.PLUGIN_DIR):
            tier.ledger.will_create_dir(path)  # before the kubelet would: undone by the ledger
        os.makedirs(harness.PLUGIN_DIR, exist_ok=True)
        os.makedirs(inside)
        subprocess.run(["mount", "--bind", harness.PLUGIN_DIR, inside], check=True)
        containerd.start()
        yield instance
    finally:
        try:
            instance.teardown()
            listed = containerd.ctr("containers", "ls", "-q", check=False).stdout.split()
            for container_id in listed:
                containerd.ctr("tasks", "rm", "-f", container_id, check=False)
                containerd.ctr("containers", "rm", container_id, check=False)
        finally:
            if instance.kubelet is not None:
                harness.unmount_under(instance.kubelet.root_dir)
            containerd.stop()
            harness.unmount_under(inside)  # before anything under work is removed
            harness.unmount_under(directory)
            for path in (work, directory):
                with contextlib.suppress(OSError):
                    shutil.rmtree(path)


def _ctk(*args: str) -> str:
    result = subprocess.run(
        [os.path.join(harness.BIN, "enflame-ctk"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise harness.E2EError(f"enflame-ctk {' '.join(args)} failed:\n{output}")
    return output


def _report_of_run(node: harness.Node, name: str, run: int) -> harness.ContainerReport:
    """The report of one run of the pod's container (the kubelet's ``<restarts>.log``)."""
    uid = node.pods.uid(name)
    path = os.path.join(
        harness.POD_LOGS, f"{harness.NAMESPACE}_{name}-{harness.NODE_NAME}_{uid}", "main",
        f"{run}.log",
    )  # fmt: skip

    def done() -> str | None:
        lines = [line.rstrip("\n").split(" ", 3)[-1] for line in harness.read_iter(path)]
        return "\n".join(lines) if "report-done" in lines else None

    return harness.parse_report(harness.wait_for(f"the report of {name}'s run {run}", done, 60))


def test_a_container_of_a_vendor_pod_killed_after_the_switch_comes_back_with_its_cards(
    topscloud_node: harness.Node,
) -> None:
    node = topscloud_node
    root = node.host_root
    config = node.containerd.config
    node.up(plugin=False)
    vendor = _vendor(node)
    try:
        node.wait_registered(8)
        manifest = harness.pod_manifest("held", [harness.container(gcus=2)])
        manifest["spec"]["restartPolicy"] = "Always"
        node.pods.create(manifest)
        node.pods.wait_running("held")
        first = _report_of_run(node, "held", 0)
        assert len(first.cards) == 2 and first.visible != "", first.text

        node.plugin.start()  # ours stands by while the vendor's serves enflame.sock
        harness.wait_for(
            "our plugin to stand by behind the vendor's socket",
            lambda: STANDING_BY in node.plugin.log(),
            30,
        )
        migrated = _ctk("migrate", "--host-root", root, "--handover-timeout", "30")
        assert "handed" in migrated and "adopted containerd's topscloud entries" in migrated
        node.wait_registered(8)
        vendor.send_signal(signal.SIGTERM)  # the vendor's DaemonSet deleted
        vendor.wait(15)

        # The switch: a node mode with no wrapper as the default, the engine reloaded.
        installed = _ctk("install", "--host-root", root, "--mode", "device-specs")
        node.containerd.stop()  # and started again on the edited config, as a reload does
        node.containerd.start()

        # The container killed: containerd (1.5 on) starts the new one with the runtime its pod
        # sandbox was made with, whatever the default says now.
        (container_id,) = node.pods.container_ids("held").values()
        node.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
        _wait_restarted(node, "held", 1)
        again = _report_of_run(node, "held", 1)
        assert again.cards == first.cards, _diagnosis(again, installed, node)
        # The pod's sandbox killed too (as a reboot or a dead pause process does): the kubelet
        # makes a new one with the engine's default runtime now, and hands the container the
        # vendor's checkpointed answer again: only the kept `enflame` default gives its cards.
        (container_id,) = node.pods.container_ids("held").values()
        sandbox = node.containerd.container_spec(container_id)["annotations"][SANDBOX_ID]
        node.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", sandbox)
        _wait_restarted(node, "held", 2)
        (container_id,) = node.pods.container_ids("held").values()
        assert node.containerd.container_spec(container_id)["annotations"][SANDBOX_ID] != sandbox
        anew = _report_of_run(node, "held", 2)
        assert anew.cards == first.cards, _diagnosis(anew, installed, node)
        assert "gcuctl" in anew.nodes and anew.visible == first.visible
        # What kept it: the adopted default, named with the pod that holds the vendor's answer.
        assert _default_runtime(config) == "enflame"
        assert "kept topscloud's containerd entries that migrate adopted" in installed
        assert f"pod {node.pods.uid('held')}/main" in installed
        # The kubelet still counts the same two cards as held.
        held = {d for h in node.holdings() if h.pod.startswith("held") for d in h.device_ids}
        assert held == set(first.cards)
    finally:
        if vendor.poll() is None:
            vendor.kill()
            vendor.wait()


def _wait_restarted(node: harness.Node, name: str, count: int) -> None:
    harness.wait_for(
        f"the kubelet to run {name}'s container again ({count} restarts)",
        lambda: any(
            s.get("restartCount", 0) >= count and "running" in (s.get("state") or {})
            for s in node.pods.status(name).get("containerStatuses") or []
        ),
        90,
        0.5,
    )


def _diagnosis(report: harness.ContainerReport, installed: str, node: harness.Node) -> str:
    return (
        f"restarted: {report.text}\ninstall said:\n{installed}\nruntime log tail:\n"
        f"{_tail(node.containerd.runtime_log)}"
    )


def _tail(path: str, size: int = 2000) -> str:
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()[-size:]
    return "(no runtime log)"
