"""``--pass-device-specs`` with ``cpuManagerPolicy: static``: the kubelet rewrites the
container's cgroup (cpuset) every reconcile period; the cards must stay usable.

Observed on this stack (kubelet 1.20, containerd 1.6, runc 1.1.5, cgroupfs): the cards stayed
usable without the flag too, because runc re-applies the device rules our runtime wrote into
config.json; the flag puts them into the spec containerd keeps as well, which is what this
test checks besides the access itself.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.kubelet import harness, host

pytestmark = pytest.mark.kubelet

PROBE = (
    'while true; do echo "probe: $(cat /dev/gcu0 2>&1 | head -1)"; '
    'echo "cpuset: $(cat /sys/fs/cgroup/cpuset/cpuset.cpus)"; sleep 1; done'
)


def _mirror_dev_nodes(node: harness.Node) -> list[str]:
    """The DeviceSpecs name host paths (/dev/gcuN): make them on the host, as a real node has."""
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


def test_pass_device_specs_with_the_static_cpu_manager(node: harness.Node) -> None:
    node.simulate()
    made = _mirror_dev_nodes(node)
    try:
        node.up(
            plugin_args=["--pass-device-specs"],
            options=harness.KubeletOptions(cpu_manager_policy="static"),
        )
        guaranteed = {"cpu": "1", "memory": "64Mi"}
        body = f"{harness.REPORT_SCRIPT}; {PROBE}"
        app = harness.container(gcus=2, script=body, sleep=False, resources=guaranteed)
        node.pods.create(harness.pod_manifest("pinned", [app]))
        node.pods.wait_running("pinned")
        report = node.pods.report("pinned")
        assert set(report.cards) == {"gcu0", "gcu1"}, report.text
        # The kubelet's evidence: an exclusive CPU in its CPU manager state, and DeviceSpecs in
        # the Allocate answer it checkpointed.
        kubelet = node.running_kubelet
        with open(os.path.join(kubelet.root_dir, "cpu_manager_state"), encoding="utf-8") as f:
            state = json.load(f)
        assert state["policyName"] == "static"
        uid = node.pods.uid("pinned")
        assert state["entries"][uid]["main"] == "1", state
        (entry,) = [e for e in harness.checkpoint()["entries"] if e["pod_uid"] == uid]
        specs = harness.decode_response(entry["response"])["devices"]
        assert sorted(specs) == [
            ("/dev/gcu0", "/dev/gcu0", "rw"),
            ("/dev/gcu1", "/dev/gcu1", "rw"),
            ("/dev/gcuctl", "/dev/gcuctl", "rw"),
        ]
        # containerd put them into the spec it keeps (and re-applies on every update).
        container_id = node.pods.container_ids("pinned")["main"]
        spec = node.containerd.container_spec(container_id)
        allowed = {
            (rule.get("major"), rule.get("minor"))
            for rule in spec["linux"]["resources"]["devices"]
            if rule.get("allow")
        }
        assert {(238, 0), (238, 1), (238, 255)} <= allowed
        # Several CPU-manager reconcile periods (1 s here) later the card still opens: ENXIO
        # ("No such device or address", no driver for the simulated major) means the device
        # cgroup let the open through; a lost rule would say "Operation not permitted".
        time.sleep(4)
        probes = [
            line for line in node.pods.log("pinned").splitlines() if line.startswith("probe:")
        ]
        assert len(probes) >= 4, probes
        assert all("No such device or address" in line for line in probes), probes
        cpusets = {
            line for line in node.pods.log("pinned").splitlines() if line.startswith("cpuset:")
        }
        assert cpusets == {"cpuset: 1"}, cpusets
        # The probe can tell: the same node bound into a pod that was given no GCU is refused
        # by the device cgroup.
        outsider = harness.container(script=PROBE, sleep=False)
        outsider["volumeMounts"] = [{"name": "card", "mountPath": "/dev/gcu0"}]
        manifest = harness.pod_manifest("outsider", [outsider])
        manifest["spec"]["volumes"] = [
            {"name": "card", "hostPath": {"path": "/dev/gcu0", "type": "CharDevice"}}
        ]
        node.pods.create(manifest)
        node.pods.wait_running("outsider")
        refused = harness.wait_for(
            "the outsider's probe",
            lambda: [
                line for line in node.pods.log("outsider").splitlines() if line.startswith("probe:")
            ],
            30,
        )
        assert "Operation not permitted" in refused[0], refused
    finally:
        for path in made:
            os.unlink(path)
        assert host.gcu_dev_nodes() == []
