"""Scenario 2 on the real cluster: the toolkit DaemonSet of the guide's section 3b installs onto
both nodes in the mode `auto` chooses for containerd, records it, doctor passes through
`kubectl exec`, and deleting the DaemonSet undoes everything (engine configs byte-identical).

Each node's containerd listens at the stock socket and reads the stock config path inside the
node's own mount namespace (tests/cluster/nodes.py), so the installer finds and may touch only
the tier's containerd, never the machine's. A third node keeps its containerd where k3s keeps
its own, and the toolkit is pointed there the way the guide tells a k3s operator to."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from tests.cluster import guide
from tests.cluster.cluster import PLUGIN_SELECTOR, Cluster, dir_files, pod_ready, wait_for

pytestmark = pytest.mark.cluster
SELECTOR = "app.kubernetes.io/name=enflame-container-toolkit"
MANIFEST = "deploy/yaml/enflame-container-toolkit.yaml"


def test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes(cluster: Cluster) -> None:
    nodes = {n.name: n for n in cluster.nodes if n.name in ("gcu-node-1", "gcu-node-2")}
    configs = {name: n.private("/etc/containerd") for name, n in nodes.items()}
    records = {name: n.private("/etc/enflame-gcu") for name, n in nodes.items()}

    def snapshot() -> dict[str, dict[str, bytes]]:
        return dir_files(configs)

    for name in nodes:  # as scenarios 1 and 3 did (idempotent; this test may run alone)
        cluster.shell(f"kubectl label node {name} enflame.com/gcu.present=true --overwrite")
    cluster.shell("kubectl apply -f deploy/yaml/enflame-device-plugin.yaml")
    wait_for(
        "the device plugin pods to be Ready (doctor checks the plugin too)",
        lambda: len(cluster.ready_pods("kube-system", PLUGIN_SELECTOR)) == 2,
        180,
    )
    before = snapshot()
    for directory in records.values():
        assert not os.path.exists(os.path.join(directory, "node-mode.json"))

    cluster.shell(guide.line(f"kubectl apply -f {MANIFEST}"))
    wait_for(
        "both toolkit pods to be Ready (the runtime installed, the engine configured)",
        lambda: len([p for p in cluster.pods("kube-system", SELECTOR) if pod_ready(p)]) == 2,
        180,
        detail=lambda: cluster.kubectl(
            "-n", "kube-system", "describe", "pods", "-l", SELECTOR, check=False
        ),
    )
    logs = cluster.shell(
        guide.line("kubectl -n kube-system logs ds/enflame-container-toolkit-daemonset")
    )
    assert "device-specs" in logs, logs
    for name, directory in records.items():
        with open(os.path.join(directory, "node-mode.json"), encoding="utf-8") as handle:
            record = json.load(handle)
        assert record["mode"] == "device-specs", (name, record)
    # containerd behind a kubelet: device-specs changes no engine config.
    assert snapshot() == before

    doctor = guide.line(
        "kubectl -n kube-system exec ds/enflame-container-toolkit-daemonset -- "
        "enflame-ctk doctor --host-root /host"
    )
    fix = guide.line(
        "kubectl -n kube-system exec ds/enflame-container-toolkit-daemonset -- "
        "enflame-ctk system create-dev-char-symlinks --host-root /host"
    )
    for pod in cluster.pods("kube-system", SELECTOR):
        name = pod["metadata"]["name"]
        # Debian 12's runc 1.1.5 (runc issue 3671): doctor fails until the /dev/char links exist
        # and prints the fix the guide's section 3b runs in the toolkit pod.
        first = cluster.kubectl("-n", "kube-system", "exec", name, "--",
                                *doctor.split(" -- ", 1)[1].split(), check=False)  # fmt: skip
        failed = [line for line in first.splitlines() if line.startswith("FAIL")]
        assert [line.split()[1] for line in failed] in ([], ["runc"]), first
        cluster.kubectl("-n", "kube-system", "exec", name, "--", *fix.split(" -- ", 1)[1].split())

        # The installer's SIGHUP makes the plugin register afresh: doctor may catch the moment
        # its socket is being replaced (WARN plugin-socket), so it gets a few tries.
        def clean(name: str = name) -> str | None:
            text = cluster.kubectl("-n", "kube-system", "exec", name, "--",
                                   *doctor.split(" -- ", 1)[1].split(), check=False)  # fmt: skip
            return text if "0 warning(s), 0 failed" in text else None

        report = wait_for(f"doctor to pass in {name}", clean, 30, 2)
        assert "PASS  driver" in report, report
        assert "node mode device-specs, recorded by the installer" in report, report
    cluster.shell(doctor)

    cluster.shell(guide.line(f"kubectl delete -f {MANIFEST}") + " --wait=true --timeout=180s")
    wait_for("the toolkit pods to go", lambda: not cluster.pods("kube-system", SELECTOR), 180)
    for name, directory in records.items():
        assert not os.path.exists(os.path.join(directory, "node-mode.json")), name
    assert snapshot() == before


K3S_NODE = "gcu-node-k3s"
K3S_CONTAINERD = "/var/lib/rancher/k3s/agent/etc/containerd"
COMMENTED_ENV = """          # env:
          #   - name: ENFLAME_PRESET
          #     value: k3s    # or rke2
"""


def k3s_manifest(cluster: Cluster) -> str:
    """The guide's toolkit manifest as a k3s operator edits it (section 3f: "uncomment its env
    block"), kept to the k3s node pool (here one node) by a nodeSelector."""
    with open(cluster.repo_file(MANIFEST), encoding="utf-8") as handle:
        text = handle.read()
    assert COMMENTED_ENV in text, "the toolkit manifest's commented env block changed"
    uncommented = "\n".join(
        line.replace("# ", "", 1) for line in COMMENTED_ENV.rstrip("\n").split("\n")
    )
    docs = list(yaml.safe_load_all(text.replace(COMMENTED_ENV, uncommented + "\n")))
    [daemonset] = [d for d in docs if d and d["kind"] == "DaemonSet"]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "ENFLAME_PRESET", "value": "k3s"}], container["env"]
    daemonset["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": K3S_NODE}
    return yaml.safe_dump_all(docs)


def test_scenario_2_on_a_k3s_node_the_preset_finds_its_containerd(cluster: Cluster) -> None:
    """A node whose containerd is where k3s keeps its own (config under /var/lib/rancher, socket
    /run/k3s/containerd/containerd.sock, binary off PATH, no /etc/containerd config): the
    toolkit DaemonSet with the guide's k3s preset asks that containerd for its version (nothing
    else could tell it) and records the mode, doctor passes, and deleting the DaemonSet leaves
    the node's files as they were."""
    node = cluster.add_node(K3S_NODE, "flat-4card", "10.88.5.0/24", "10.99.0.5", layout="k3s")
    cluster.shell(f"kubectl label node {K3S_NODE} enflame.com/gcu.present=true --overwrite")
    cluster.shell("kubectl apply -f deploy/yaml/enflame-device-plugin.yaml")
    wait_for(
        f"the device plugin pod on {K3S_NODE} to be Ready",
        lambda: [
            p
            for p in cluster.ready_pods("kube-system", PLUGIN_SELECTOR)
            if p["spec"].get("nodeName") == K3S_NODE
        ],
        180,
    )
    watched = {
        "k3s": node.seen_from_here(K3S_CONTAINERD),
        "stock": node.private("/etc/containerd"),
        "record": node.private("/etc/enflame-gcu"),
    }

    before = dir_files(watched)
    assert list(before["k3s"]) == ["config.toml"] and before["stock"] == {}, before
    cluster.kubectl("apply", "-f", "-", stdin=k3s_manifest(cluster))
    wait_for(
        f"the toolkit pod on {K3S_NODE} to be Ready",
        lambda: cluster.ready_pods("kube-system", SELECTOR),
        180,
        detail=lambda: cluster.kubectl(
            "-n", "kube-system", "describe", "pods", "-l", SELECTOR, check=False
        ),
    )
    [pod] = cluster.pods("kube-system", SELECTOR)
    assert pod["spec"]["nodeName"] == K3S_NODE
    name = pod["metadata"]["name"]
    with open(os.path.join(watched["record"], "node-mode.json"), encoding="utf-8") as handle:
        record = json.load(handle)
    assert record["mode"] == "device-specs", record
    # device-specs changes no engine config, and nothing appeared at the stock path.
    after = dir_files(watched)
    assert after["k3s"] == before["k3s"] and after["stock"] == {}, after

    doctor = ["enflame-ctk", "doctor", "--host-root", "/host"]
    fix = ["enflame-ctk", "system", "create-dev-char-symlinks", "--host-root", "/host"]
    cluster.kubectl("-n", "kube-system", "exec", name, "--", *fix)

    def clean() -> str | None:
        text = cluster.kubectl("-n", "kube-system", "exec", name, "--", *doctor, check=False)
        return text if "0 warning(s), 0 failed" in text else None

    report = wait_for(
        f"doctor to pass on {K3S_NODE}",
        clean,
        60,
        2,
        detail=lambda: cluster.kubectl(
            "-n", "kube-system", "exec", name, "--", *doctor, check=False
        ),
    )
    # (Its engine line names the CRI endpoint of the first kubelet it finds in /proc: the tier's
    # nodes share the machine's PID namespace, where a real node runs one kubelet.)
    assert re.search(r"^PASS +engine-containerd ", report, re.M), report
    logs = cluster.kubectl("-n", "kube-system", "logs", name)
    print(f"\ntoolkit on {K3S_NODE}:\n{logs}\ndoctor:\n{report}")
    # Only its socket could tell the version here (no containerd binary on the node's PATH).
    assert "node mode device-specs (auto): containerd 1.6:" in logs, logs

    cluster.kubectl("delete", "-f", "-", "--wait=true", "--timeout=180s",
                    stdin=k3s_manifest(cluster))  # fmt: skip
    wait_for("the toolkit pod to go", lambda: not cluster.pods("kube-system", SELECTOR), 180)
    final = dir_files(watched)
    assert "node-mode.json" not in final["record"], final["record"]
    assert final["k3s"] == before["k3s"] and final["stock"] == {}, final
