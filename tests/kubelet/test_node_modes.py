"""Node mode device-specs through the real kubelet: containerd 1.6 left exactly as the operator
wrote it (plain runc, no enflame runtime anywhere), the plugin started as the DaemonSet starts it
(``--node-mode=auto``, no installer record, so device-specs). A GCU pod gets exactly its cards
from the kubelet's DeviceSpecs; a pod that asked for none, even with ENFLAME_VISIBLE_DEVICES=all,
gets nothing, and nothing of ours runs for either."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import tomlkit

from tests.kubelet import harness, host
from tests.kubelet.conftest import Tier

pytestmark = pytest.mark.kubelet


class PlainContainerd(harness.Containerd):
    """The tier's containerd without ``enflame-ctk runtime configure``: the operator's config."""

    def configure(self) -> None:
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(harness.containerd_base_config(self.directory, f"{self.directory}/runc"))


@pytest.fixture
def plain_node(tier: Tier) -> Iterator[harness.Node]:
    directory = tempfile.mkdtemp(prefix="pc-", dir=tier.work)
    containerd = PlainContainerd(tier.tools, tier.ledger, directory)
    containerd.configure()
    work = tempfile.mkdtemp(prefix="n-", dir=tier.work)
    instance = harness.Node(tier.tools, tier.ledger, containerd, tier.cgroup_root, work)
    try:
        containerd.start()
        yield instance
    finally:
        try:
            instance.teardown()
            # The kubelet is gone before it collects its exited sandboxes: remove them here so
            # their shims exit and take their sockets in /run/containerd/s with them.
            listed = containerd.ctr("containers", "ls", "-q", check=False).stdout.split()
            for container_id in listed:
                containerd.ctr("tasks", "rm", "-f", container_id, check=False)
                containerd.ctr("containers", "rm", container_id, check=False)
        finally:
            if instance.kubelet is not None:
                harness.unmount_under(instance.kubelet.root_dir)
            containerd.stop()
            harness.unmount_under(directory)
            for path in (work, directory):
                with contextlib.suppress(OSError):
                    shutil.rmtree(path)


def _mirror_dev_nodes(node: harness.Node) -> list[str]:
    """DeviceSpecs name host paths (/dev/gcuN, /dev/gcuctl): make them, as a real node has."""
    made = []
    source_dir = os.path.join(node.host_root, "dev")
    for name in sorted(os.listdir(source_dir)):
        if not name.startswith("gcu"):
            continue
        target = f"/dev/{name}"
        assert not os.path.lexists(target), f"{target} exists on this host"
        info = os.stat(os.path.join(source_dir, name))
        node.ledger.will_mknod(target)
        os.mknod(target, info.st_mode, info.st_rdev)
        made.append(target)
    return made


def test_device_specs_mode_gives_exactly_the_cards_with_plain_runc(
    plain_node: harness.Node,
) -> None:
    node = plain_node
    with open(node.containerd.config, encoding="utf-8") as handle:
        config = tomlkit.parse(handle.read()).unwrap()
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert set(cri["runtimes"]) == {"runc"} and cri["default_runtime_name"] == "runc"
    assert "enflame-container-runtime" not in json.dumps(config)
    node.simulate()
    made = _mirror_dev_nodes(node)
    try:
        node.up(plugin_args=["--node-mode=auto"])
        first = node.pods.run("two-a", 2)
        assert set(first.cards) == {"gcu0", "gcu1"}, first.text
        assert "gcuctl" in first.nodes
        assert first.visible == "0,1"
        second = node.pods.run("two-b", 2)
        assert set(second.cards) == {"gcu4", "gcu5"}, second.text
        # The kubelet checkpointed DeviceSpecs: the engine, not a wrapper, made the nodes.
        uid = node.pods.uid("two-a")
        (entry,) = [e for e in harness.checkpoint()["entries"] if e["pod_uid"] == uid]
        specs = sorted(harness.decode_response(entry["response"])["devices"])
        assert [s[0] for s in specs] == ["/dev/gcu0", "/dev/gcu1", "/dev/gcuctl"]
        # A pod that asked for no GCU, with the variable an image could bake in.
        plain = harness.container()
        plain["env"] = [{"name": "ENFLAME_VISIBLE_DEVICES", "value": "all"}]
        node.pods.create(harness.pod_manifest("no-gcu", [plain]))
        node.pods.wait_running("no-gcu")
        report = node.pods.report("no-gcu")
        assert report.cards == () and "gcuctl" not in report.nodes, report.text
        # Nothing of ours ran: the runtime's log was never written on this node.
        assert not os.path.exists(node.containerd.runtime_log)
        assert "node_mode='device-specs'" in node.plugin.log()
    finally:
        for path in made:
            os.unlink(path)
        assert host.gcu_dev_nodes() == []
