"""drs-gcu under the real 1.20 kubelet: a kubelet restart with a DRS pod running keeps its
instance (issue 34 point 4).

That kubelet deletes the files of its device-plugin directory when it starts; the DRS record
used to live there, so the plugin's next start destroyed the instance a running container
used. The record now sits in the host's /var/lib/enflame-gcu.
"""

from __future__ import annotations

import os

import pytest

from enflame_gcu.device_plugin import drs_instances
from enflame_gcu.simulation import efsmi_sim
from tests.kubelet import harness

pytestmark = pytest.mark.kubelet

DRS = "enflame.com/drs-gcu"
REGISTRATION = f'Got registration request from device plugin with resource name "{DRS}"'


def test_a_kubelet_restart_with_a_drs_pod_running_keeps_its_instance(node: harness.Node) -> None:
    node.simulate()
    # What the chart's hostPath mount (DirectoryOrCreate) provides.
    state = os.path.join(node.host_root, drs_instances.STATE_DIR.lstrip("/"))
    os.makedirs(state, exist_ok=True)
    args = [
        "--resources",
        "gcu,drs-gcu",
        "--drs",
        "gcu0",
        "--efsmi",
        efsmi_sim.install(node.host_root),
    ]
    node.up(args, expect_devices=7)
    kubelet = node.running_kubelet
    harness.wait_for("the kubelet to take drs-gcu", lambda: REGISTRATION in kubelet.log(), 30)
    node.pods.create(harness.pod_manifest("part", [harness.container(resources={DRS: "2"})]))
    node.pods.wait_running("part")
    (made,) = efsmi_sim.instances(node.host_root)
    assert (made["index"], made["profile"]) == (0, "2g.16gb")
    record = os.path.join(state, drs_instances.RECORD_FILE)
    with open(record, encoding="utf-8") as handle:
        assert made["uuid"] in handle.read()

    offset = kubelet.restart()  # 1.20: every file of the device-plugin dir is deleted
    harness.wait_for(
        "the restarted kubelet to take drs-gcu again",
        lambda: REGISTRATION in kubelet.log(offset),
        60,
    )
    node.plugin.stop()  # and the plugin starts again, as after an upgrade
    plugin_offset = len(node.plugin.log())
    node.plugin.start(args)
    harness.wait_for(
        "the plugin to serve again",
        lambda: "drs-gcu=enflame.com/drs-gcu" in node.plugin.log()[plugin_offset:],
        60,
    )
    # (not node.wait_registered: its checkpoint reader sorts IDs as gcuN, and the kubelet's
    # checkpoint now also holds the pod's gcu0-sliceK IDs)
    node.pods.wait_running("part")
    assert efsmi_sim.instances(node.host_root) == [made], node.plugin.log()[-3000:]
    assert "destroyed orphan" not in node.plugin.log()
