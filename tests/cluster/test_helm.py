"""Scenario 5 on the real cluster: the chart installed, upgraded and uninstalled with Helm's own
Go code (helm-python-sdk, run by .venv-helm/bin/python) against the cluster's kubeconfig. It
replaces the static DaemonSet of scenario 3 (same name, as the guide says) and gives the same
result; after uninstall nothing of the release is left, and the static manifest goes back for
the scenarios that follow."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shlex
import subprocess
from typing import Any

import pytest

from tests.cluster import guide
from tests.cluster.cluster import PLUGIN_SELECTOR, Cluster, cards_in, pod_ready, wait_for
from tests.cluster.controlplane import REPO

pytestmark = pytest.mark.cluster
HELM_PYTHON = os.path.join(REPO, ".venv-helm", "bin", "python")
ACTIONS = os.path.join(os.path.dirname(__file__), "helm_actions.py")
CHART = os.path.join(REPO, "deploy", "helm", "enflame-gcu")
DS = "enflame-device-plugin-daemonset"
SHARED = "enflame.com/shared-gcu"


def helm(cluster: Cluster, *args: str) -> dict[str, Any]:
    """One Helm action; its JSON answer (AssertionError with Helm's error otherwise)."""
    result = subprocess.run(
        [HELM_PYTHON, ACTIONS, cluster.plane.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"helm {args[0]}: {result.stdout}{result.stderr}") from None
    assert answer["ok"], f"helm {args[0]}: {answer.get('error')}\n{result.stderr[-2000:]}"
    return answer


SHARING_LINE = (
    "helm upgrade enflame-gcu deploy/helm/enflame-gcu -n kube-system "
    "--set sharing.enabled=true --set sharing.slicesPerCard=6 --set sharing.policy=packed"
)


def set_values(command: str) -> dict[str, Any]:
    """The values a ``helm ... --set a.b=c`` line gives, as Helm parses the simple cases
    (true/false and integers typed, the rest strings)."""
    values: dict[str, Any] = {}
    words = shlex.split(command)
    for flag, assignment in itertools.pairwise(words):
        if flag != "--set":
            continue
        path, _, raw = assignment.partition("=")
        value: Any = {"true": True, "false": False}.get(raw, raw)
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            value = int(value)
        node = values
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return values


def plugin_pods_ready(cluster: Cluster) -> list[dict[str, Any]] | None:
    pods = cluster.pods("kube-system", PLUGIN_SELECTOR)
    ready = [p for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return ready if len(ready) == 2 == len(pods) else None


@pytest.mark.skipif(
    not os.access(HELM_PYTHON, os.X_OK) and os.environ.get("CI") != "true",
    reason="no .venv-helm (scripts/bootstrap.sh makes it with helm-python-sdk); fails under CI",
)
def test_scenario_5_helm_install_upgrade_uninstall(cluster: Cluster, clean_namespace: str) -> None:
    for name in ("gcu-node-1", "gcu-node-2"):  # as scenario 1 did (this test may run alone)
        cluster.shell(f"kubectl label node {name} enflame.com/gcu.present=true --overwrite")
    cluster.shell(
        guide.line("kubectl delete -f deploy/yaml/enflame-device-plugin.yaml")
        + " --ignore-not-found"
    )
    wait_for(
        "the static plugin pods to go",
        lambda: not cluster.pods("kube-system", PLUGIN_SELECTOR),
        120,
    )

    # `helm install enflame-gcu deploy/helm/enflame-gcu -n kube-system`, as Helm's Go code.
    guide.line("helm install enflame-gcu deploy/helm/enflame-gcu -n kube-system")
    helm(cluster, "install", "enflame-gcu", CHART, "kube-system", "{}")
    pods = wait_for("the chart's plugin pods to be Ready", lambda: plugin_pods_ready(cluster), 180,
                    detail=lambda: cluster.describe("ds", DS, "kube-system"))  # fmt: skip
    ds = cluster.get(f"/apis/apps/v1/namespaces/kube-system/daemonsets/{DS}")
    assert ds["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm"
    for node, count in (("gcu-node-1", 8), ("gcu-node-2", 4)):

        def shows(node: str = node, count: int = count) -> bool:
            return cluster.gcus(node) == (count, count)

        wait_for(f"{node} to show {count} GCUs", shows, 60)
    cluster.shell(guide.line("kubectl apply -f deploy/yaml/examples/pod-gcu-example.yaml"))
    cluster.wait_pod("enflame", "pod-gcu-example")

    def example_logs() -> str | None:
        text = cluster.kubectl("-n", "enflame", "logs", "pod-gcu-example")
        return text if "ENFLAME_VISIBLE" in text else None

    logs = wait_for("the example's logs", example_logs, 60)
    assert len(cards_in(logs)) == 1, logs

    # A changed value rolls the DaemonSet.
    before = {p["metadata"]["uid"] for p in pods}
    generation = ds["metadata"]["generation"]
    helm(cluster, "upgrade", "enflame-gcu", CHART, "kube-system",
         json.dumps({"devicePlugin": {"healthInterval": 3}}))  # fmt: skip

    def rolled_pods() -> list[dict[str, Any]] | None:
        pods = plugin_pods_ready(cluster)
        return pods if pods and not {p["metadata"]["uid"] for p in pods} & before else None

    rolled = wait_for("the DaemonSet to roll both pods", rolled_pods, 240,
                      detail=lambda: cluster.describe("ds", DS, "kube-system"))  # fmt: skip
    args = rolled[0]["spec"]["containers"][0]["args"]
    assert "--health-interval=3" in args, args
    ds = cluster.get(f"/apis/apps/v1/namespaces/kube-system/daemonsets/{DS}")
    assert ds["metadata"]["generation"] > generation
    assert cluster.pod("enflame", "pod-gcu-example")["status"]["phase"] == "Running"  # type: ignore[index]

    # Section 10's line: every card served as time-shared slices; the guide's shared example.
    cluster.delete_pods("enflame", "pod-gcu-example")
    before = {p["metadata"]["uid"] for p in rolled}
    sharing = set_values(guide.line(SHARING_LINE))
    assert sharing == {"sharing": {"enabled": True, "slicesPerCard": 6, "policy": "packed"}}
    helm(cluster, "upgrade", "enflame-gcu", CHART, "kube-system",
         json.dumps({"devicePlugin": {"healthInterval": 3}, **sharing}))  # fmt: skip
    wait_for("the DaemonSet to roll both pods for sharing", rolled_pods, 240,
             detail=lambda: cluster.describe("ds", DS, "kube-system"))  # fmt: skip
    for node, cards in (("gcu-node-1", 8), ("gcu-node-2", 4)):

        def sliced(node: str = node, cards: int = cards) -> bool:
            return cluster.gcus(node, SHARED) == (cards * 6, cards * 6)

        wait_for(f"{node} to show {cards * 6} slices", sliced, 90,
                 detail=functools.partial(cluster.describe, "node", node))  # fmt: skip
    cluster.shell(guide.line("kubectl apply -f deploy/yaml/examples/pod-shared-gcu-example.yaml"))
    cluster.wait_pod("enflame", "pod-shared-gcu-example")
    shared_line = guide.line("kubectl -n enflame logs pod-shared-gcu-example")
    shared_logs = wait_for(
        "the shared example's logs",
        lambda: (
            text
            if "ENFLAME_CONTAINER_USABLE_PROCESSOR" in (text := cluster.shell(shared_line))
            else None
        ),
        60,
    )
    assert len(cards_in(shared_logs)) == 1, shared_logs
    assert "ENFLAME_CONTAINER_SUB_CARD=true" in shared_logs, shared_logs
    assert "ENFLAME_CONTAINER_USABLE_PROCESSOR=2/6" in shared_logs, shared_logs
    cluster.delete_pods("enflame", "pod-shared-gcu-example")

    guide.line("helm uninstall enflame-gcu -n kube-system")
    helm(cluster, "uninstall", "enflame-gcu", "kube-system")
    wait_for(
        "the chart's pods to go", lambda: not cluster.pods("kube-system", PLUGIN_SELECTOR), 180
    )
    assert cluster.get(f"/apis/apps/v1/namespaces/kube-system/daemonsets/{DS}") is None
    kinds = "all,configmaps,secrets,serviceaccounts,roles,rolebindings"
    selector = "app.kubernetes.io/instance=enflame-gcu"
    left = cluster.kubectl("get", kinds, "-A", "-l", selector, "-o", "name")
    assert left.strip() == "", left
    secrets = cluster.kubectl("-n", "kube-system", "get", "secrets", "-o", "name")
    assert "sh.helm.release" not in secrets, secrets

    # Back to the static manifest for the scenarios that follow.
    cluster.shell(guide.line("kubectl apply -f deploy/yaml/enflame-device-plugin.yaml"))
    wait_for("the static plugin pods to be Ready again", lambda: plugin_pods_ready(cluster), 180)
