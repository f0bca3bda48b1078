"""``make demo-cluster``: a five-minute tour of the whole system on one machine.

Run by scripts/demo-cluster.sh (the tier lock, the cached builds, a private network namespace,
as ``make e2e-cluster``) as ``python -m tests.cluster.demo``. On the real-cluster tier's session
(tests/cluster/session.py: a real control plane and two simulated GCU nodes), each step prints one
line of what happened:

1. the cluster comes up;
2. the product is installed through the operator's one resource: the chart with the operator
   (``helm install``), then its ``GcuResource`` (``helm upgrade``), whose device plugin and
   toolkit the operator deploys on both nodes;
3. a 2-card pod without a node selector lands switch-local through the scheduler extender (the
   chart's extender beside the cluster's kube-scheduler);
4. card telemetry is scraped from the device plugin's ``/metrics`` and printed as a table;
5. a card is unplugged and the node's GCU count drops;
6. everything is torn down and the host compared with its snapshot.

Telemetry: no pod here has a real libefml. The simulated one (``enflame_gcu.simulation.efmlsim``,
built with the system's C compiler) goes under each node's simulated tree, which the node sees at
``/run/enflame-e2e-sim``; the node's ``/usr/lib64`` gets a read-only overlay (in the node's own
mount namespace, gone with it) holding a ``libefml.so`` link there. The GcuResource names
``/usr/lib64`` as ``telemetry.libraryDir`` and the simulated tree as ``efsmiDir``, so the plugin's
real mounts and its real library search find it, and every number in the table is what the plugin
read through libefml (the simulator's idle readings).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from enflame_gcu.simulation import efmlsim
from tests.cluster.cluster import PLUGIN_SELECTOR, Cluster, wait_for
from tests.cluster.nodes import SIM_MOUNT, ClusterNode
from tests.cluster.service_route import ServiceRoute
from tests.cluster.session import running_cluster
from tests.cluster.test_extender_chart import (
    CONTROL_PLANE_LABEL,
    asked,
    extender_beside_scheduler,
    extender_stats,
    schedule_through_extender,
)
from tests.cluster.test_helm import CHART, HELM_PYTHON, helm
from tests.cluster.test_operator import (
    GROUP,
    NODES,
    RELEASE,
    Bench,
    Operator,
    chart_values,
    ours_spec,
)

HOW = "run `make demo-cluster` (scripts/demo-cluster.sh builds everything and sets the variables)"
RESOURCE_NAME = "enflame-gcu-resource"
TOOLKIT_DS, PLUGIN_DS = "enflame-container-toolkit", "enflame-k8s-device-plugin"
POD = "tour-2gcu"
METRICS_PORT = 9402
LIBRARY_DIR = "/usr/lib64"
TELEMETRY = {
    "enabled": True,
    "interval": 2,
    "libraryDir": LIBRARY_DIR,
    "efsmiDir": SIM_MOUNT,
}


@dataclass(frozen=True)
class Step:
    """One step of the tour: its title (printed) and how the READMEs name it."""

    title: str
    readme_en: str
    readme_zh: str


STEPS = (
    Step("cluster", "real control plane with two simulated nodes", "真实控制面和两个模拟节点"),
    Step("operator", "one `GcuResource`", "一个 `GcuResource`"),
    Step("extender", "switch-local", "同一 PCIe 交换机"),
    Step("telemetry", "telemetry", "遥测"),
    Step("unplug", "unplugged", "拔出"),
    Step("teardown", "host check", "主机检查"),
)


class DemoFailed(Exception):
    """A step did not happen as the tour says; the message names it."""


def fail(message: str) -> NoReturn:
    raise DemoFailed(message)


def say(number: int, text: str, started: float) -> None:
    step = STEPS[number - 1]
    print(f"[{number}/{len(STEPS)} {step.title}] {text} ({time.monotonic() - started:.0f} s)")
    sys.stdout.flush()


def telemetry_library(node: ClusterNode) -> None:
    """The simulated libefml under the node's simulated tree, and in the node's mount namespace
    a read-only overlay on ``/usr/lib64`` adding ``libefml.so`` -> that library."""
    efmlsim.install(node.sim_root)
    extra = os.path.join(node.work, "lib64-extra")
    os.makedirs(extra, exist_ok=True)
    os.symlink(f"{SIM_MOUNT}{efmlsim.LIBRARY_PATH}", os.path.join(extra, "libefml.so"))
    node.run_in(
        "mount", "-t", "overlay", "overlay", "-o", f"lowerdir={extra}:{LIBRARY_DIR}", LIBRARY_DIR
    )


SAMPLE = re.compile(r"^(\w+)\{(.*)\}\s+(\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of each sample of metric ``name`` in Prometheus text."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1) == name:
            found.append((dict(LABEL.findall(match.group(2))), float(match.group(3))))
    return found


def scrape(cluster: Cluster, pod: dict[str, Any]) -> str:
    """The device plugin pod's ``/metrics``, fetched from inside its container."""
    address = pod["status"].get("podIP") or "127.0.0.1"
    script = (
        "import urllib.request,sys;"
        f"sys.stdout.write(urllib.request.urlopen('http://{address}:{METRICS_PORT}/metrics',"
        "timeout=5).read().decode())"
    )
    return cluster.kubectl(
        "-n", "kube-system", "exec", pod["metadata"]["name"], "--", "python3", "-c", script
    )


def card_table(text: str) -> list[tuple[str, float, float, str]]:
    """``(card, temperature, usage, holder pod)`` per card, from the plugin's metrics."""
    rows: dict[str, dict[str, Any]] = {}
    for metric, key in (("enflame_gcu_temperatures", "temp"), ("enflame_gcu_usage", "usage")):
        for labels, value in samples(text, metric):
            rows.setdefault(labels["card"], {"pod": ""})[key] = value
    # The holder is a label of allocation_info only (one series per held device).
    for labels, _ in samples(text, "enflame_gcu_allocation_info"):
        if labels.get("pod_name") and labels["card"] in rows:
            rows[labels["card"]]["pod"] = f"{labels.get('pod_namespace', '')}/{labels['pod_name']}"
    return sorted(
        (
            (card, row["temp"], row["usage"], row["pod"])
            for card, row in rows.items()
            if "temp" in row and "usage" in row
        ),
        key=lambda r: int(re.sub(r"\D", "", r[0]) or 0),
    )


def tour(cluster: Cluster, started: float) -> None:
    if not os.access(HELM_PYTHON, os.X_OK):
        fail(f"no {HELM_PYTHON}: scripts/bootstrap.sh makes it (helm-python-sdk)")
    say(
        1,
        "control plane (etcd, kube-apiserver, controller-manager, scheduler) and "
        + ", ".join(f"{n} ({c} simulated cards)" for n, c in NODES.items())
        + " Ready",
        started,
    )

    for name in NODES:
        cluster.kubectl("label", "node", name, "enflame.com/gcu.present=true", "--overwrite")
    # The extender's DaemonSet runs on control-plane nodes: gcu-node-2 is labelled one.
    cluster.kubectl("label", "node", "gcu-node-2", f"{CONTROL_PLANE_LABEL}=", "--overwrite")
    cluster.kubectl("apply", "-f", cluster.repo_file("deploy/yaml/examples/namespace.yaml"))
    for node in cluster.nodes:
        telemetry_library(node)
    bench = Bench(cluster, Operator(cluster))
    extender = {"enabled": True, "mode": "daemonset"}
    with ServiceRoute(cluster.plane.port):
        helm(
            cluster,
            "install",
            RELEASE,
            CHART,
            "kube-system",
            json.dumps({**chart_values(cluster, None), "extender": extender}),
        )
        for group in (GROUP, "topsops.enflame.com"):
            cluster.kubectl(
                "wait", "--for=condition=Established", f"crd/gcuresources.{group}", "--timeout=60s"
            )
        bench.operator.wait_ready()
        spec = ours_spec(telemetry=TELEMETRY, nodeState=True)  # the extender reads node state
        helm(
            cluster,
            "upgrade",
            RELEASE,
            CHART,
            "kube-system",
            json.dumps({**chart_values(cluster, spec), "extender": extender}),
        )
        status = bench.wait_running(RESOURCE_NAME)
        plugins = wait_for(
            "a Ready plugin pod on each node",
            lambda: bench.on_each_node(PLUGIN_SELECTOR, PLUGIN_DS),
            180,
        )
        for name, count in NODES.items():

            def shows(name: str = name, count: int = count) -> bool:
                return cluster.gcus(name) == (count, count)

            wait_for(f"{name} to show {count} GCUs", shows, 120)
        say(
            2,
            f"operator installed (helm install, then its GcuResource by helm upgrade): "
            f"{RESOURCE_NAME} {status.get('phase')} {status.get('readyResource')}, toolkit and "
            f"device plugin on both nodes, "
            + ", ".join(f"{n} {cluster.gcus(n)[1]} GCUs" for n in NODES),
            started,
        )

        pod = extender_beside_scheduler(cluster)
        before = asked(extender_stats(cluster, pod))
        node_name, cards = schedule_through_extender(cluster, POD)
        after = asked(extender_stats(cluster, pod))
        if not (after[0] > before[0] and after[1] > before[1]):
            fail(f"the extender was not asked: (filter, prioritize) {before} -> {after}")
        say(
            3,
            f"2-card pod {POD} (no node selector) landed on {node_name} on {'+'.join(cards)}, "
            f"one PCIe switch; the extender was asked (filter, prioritize) "
            f"{after[0] - before[0]}, {after[1] - before[1]} times",
            started,
        )

        # Telemetry and the unplug on the node the scheduler chose for the pod.
        plugin = plugins[node_name]
        count = NODES[node_name]

        def held_in_metrics() -> list[tuple[str, float, float, str]] | None:
            rows = card_table(scrape(cluster, plugin))
            holders = {r[3] for r in rows}
            return rows if len(rows) == count and f"enflame/{POD}" in holders else None

        rows = wait_for(
            f"{node_name}'s card telemetry with the pod as holder",
            held_in_metrics,
            90,
            2,
            detail=lambda: scrape(cluster, plugin)[-3000:],
        )
        say(
            4,
            f"card telemetry of {node_name} scraped from its device plugin's /metrics "
            "(read through the simulated libefml, its idle readings):",
            started,
        )
        print(f"      {'card':<6} {'temp °C':>8} {'usage':>6}  holder pod")
        for card, temp, usage, holder in rows:
            print(f"      {card:<6} {temp:>8.0f} {usage:>6.0f}  {holder or '-'}")

        # The highest-numbered card the pod does not hold.
        minor = max(m for m in range(count) if f"gcu{m}" not in cards)
        node = next(n for n in cluster.nodes if n.name == node_name)
        node.unplug(minor)
        wait_for(
            f"{node_name}'s allocatable GCUs to drop",
            lambda: cluster.gcus(node_name)[1] < count,
            120,
            1,
        )
        capacity, allocatable = cluster.gcus(node_name)
        say(
            5,
            f"gcu{minor} unplugged on {node_name}: its allocatable enflame.com/gcu went "
            f"{count} -> {allocatable} (capacity {capacity}); {POD} runs on",
            started,
        )
        cluster.plane.restart_scheduler(None)


def main() -> int:
    started = time.monotonic()
    teardown: list[str] = []
    print("enflame-gcu cluster tour: a real control plane and two simulated GCU nodes")
    try:
        with running_cluster(fail, teardown.append, HOW) as cluster:
            tour(cluster, started)
    except DemoFailed as exc:
        print(f"demo-cluster FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a harness error (E2EError and the like): said, exit 1
        print(f"demo-cluster FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    line = teardown[-1].strip() if teardown else ""
    match = re.search(r"(\d+) undo steps", line)
    say(
        6,
        f"cluster stopped, {match.group(1) if match else '?'} host changes undone, "
        "host as before (mounts, cgroups, /run, /dev, processes)",
        started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
