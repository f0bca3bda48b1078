"""Scenarios 6, 7 and 9 on the real cluster (after test_device_plugin.py has deployed the plugin):
a rolling update of the plugin while GCU pods run, a card unplugged and replugged, metrics and
readiness seen from outside the plugin pods."""

from __future__ import annotations

import re
import urllib.request

import pytest

from enflame_gcu.device_plugin import card_metrics
from tests.cluster.cluster import (
    PLUGIN_SELECTOR,
    Cluster,
    cards_in,
    pinned,
    pod_ready,
    wait_for,
)

pytestmark = pytest.mark.cluster
PLUGIN_DS = "enflame-device-plugin-daemonset"
IMAGE = "ghcr.io/enflame-gcu/enflame-gcu-device-plugin"


def plugin_pod_on(cluster: Cluster, node: str) -> dict:  # type: ignore[type-arg]
    """The device plugin pod of ``node``."""
    pods = [
        p for p in cluster.pods("kube-system", PLUGIN_SELECTOR) if p["spec"].get("nodeName") == node
    ]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


# The pod label of the per-card series, by the name the plugin gives it.
HOLDER = f'{card_metrics.POD_LABELS[1]}="metrics-holder"'


def scrape(cluster: Cluster, node: str, path: str = "/metrics") -> str:
    """GET the plugin pod's port 9402 on its pod IP (the tier shares the pod network)."""
    ip = plugin_pod_on(cluster, node)["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:9402{path}", timeout=5) as answer:
        return str(answer.read().decode())


def test_scenario_9_metrics_name_the_pods_and_ready_follows_registration(
    cluster: Cluster, clean_namespace: str
) -> None:
    """Metrics scraped from the plugin pod name the pod holding each card; /readyz is what
    READY shows; `kubectl get pods` READY is 1/1 while registered."""
    cluster.kubectl("apply", "-f", "-", stdin=pinned("metrics-holder", "gcu-node-2", 2))
    cluster.wait_pod("enflame", "metrics-holder")
    held = cards_in(cluster.kubectl("-n", "enflame", "logs", "metrics-holder"))
    assert len(held) == 2

    def allocated() -> list[str]:
        return [
            line
            for line in scrape(cluster, "gcu-node-2").splitlines()
            if line.startswith("enflame_gcu_card_allocated{")
        ]

    def named() -> str | None:
        text = scrape(cluster, "gcu-node-2")
        lines = [
            line
            for line in text.splitlines()
            if line.startswith("enflame_gcu_card_allocated{") and HOLDER in line
        ]
        return text if len(lines) == 2 else None

    text = wait_for(
        "the metrics to name metrics-holder's two cards",
        named,
        60,
        detail=lambda: "\n".join(allocated()),
    )
    for card in held:
        series = [
            line
            for line in text.splitlines()
            if line.startswith("enflame_gcu_card_allocated{")
            and f'card="{card}"' in line
            and HOLDER in line
        ]
        assert len(series) == 1 and series[0].split()[-1] in ("1", "1.0"), series
    assert re.search(r'enflame_gcu_registered\{resource="enflame.com/gcu"\} 1', text)
    assert scrape(cluster, "gcu-node-2", "/readyz").strip()
    listing = cluster.kubectl("-n", "kube-system", "get", "pods", "-l", PLUGIN_SELECTOR)
    assert listing.count("1/1") == 2, listing


def test_scenario_7_unplug_drops_allocatable_and_replug_restores(cluster: Cluster) -> None:
    """A card taken off gcu-node-2's simulated bus: the Node's allocatable drops in the API;
    put back: it returns."""
    node = next(n for n in cluster.nodes if n.name == "gcu-node-2")
    assert cluster.gcus("gcu-node-2") == (4, 4)
    node.unplug(3)
    try:
        wait_for(
            "gcu-node-2's allocatable to drop to 3",
            lambda: cluster.gcus("gcu-node-2")[1] == 3,
            60,
            detail=lambda: str(cluster.gcus("gcu-node-2")),
        )
    finally:
        node.replug(3)
    wait_for(
        "gcu-node-2's allocatable to return to 4",
        lambda: cluster.gcus("gcu-node-2") == (4, 4),
        60,
        detail=lambda: str(cluster.gcus("gcu-node-2")),
    )


def test_scenario_6_rolling_update_keeps_running_pods_cards(
    cluster: Cluster, clean_namespace: str
) -> None:
    """A new plugin image tag rolls the DaemonSet while GCU pods run: they keep their cards,
    no card is given twice, new pods get the free cards."""
    before = {}
    for name in ("roll-a", "roll-b"):
        cluster.kubectl("apply", "-f", "-", stdin=pinned(name, "gcu-node-1", 2))
        cluster.wait_pod("enflame", name)
        before[name] = cards_in(cluster.kubectl("-n", "enflame", "logs", name))
    old_uid = plugin_pod_on(cluster, "gcu-node-1")["metadata"]["uid"]
    # The "new release": the same image under a new tag, present on every node (no registry).
    for node in cluster.nodes:
        node.ctr("images", "tag", "--force", f"{IMAGE}:0.1.0", f"{IMAGE}:0.1.1-rolled")
    cluster.kubectl(
        "-n", "kube-system", "set", "image", f"ds/{PLUGIN_DS}",
        f"enflame-device-plugin={IMAGE}:0.1.1-rolled",
    )  # fmt: skip
    cluster.kubectl(
        "-n", "kube-system", "rollout", "status", f"ds/{PLUGIN_DS}", "--timeout=240s"
    )  # fmt: skip
    new = plugin_pod_on(cluster, "gcu-node-1")
    assert new["metadata"]["uid"] != old_uid
    assert new["spec"]["containers"][0]["image"].endswith(":0.1.1-rolled")
    assert pod_ready(new)
    for name, cards in before.items():
        pod = cluster.pod("enflame", name)
        assert pod is not None and pod["status"]["phase"] == "Running"
        listed = cluster.kubectl("-n", "enflame", "exec", name, "--", "sh", "-c", "ls /dev")
        assert sorted(re.findall(r"\bgcu\d+\b", listed), key=lambda n: int(n[3:])) == cards
    cluster.kubectl("apply", "-f", "-", stdin=pinned("roll-new", "gcu-node-1", 4))
    cluster.wait_pod("enflame", "roll-new")
    fresh = cards_in(cluster.kubectl("-n", "enflame", "logs", "roll-new"))
    taken = {c for cards in before.values() for c in cards}
    assert len(fresh) == 4 and not taken & set(fresh), (before, fresh)
    assert sorted(taken | set(fresh), key=lambda n: int(n[3:])) == [f"gcu{i}" for i in range(8)]
    # A fifth pod finds no free card on gcu-node-1.
    cluster.kubectl("apply", "-f", "-", stdin=pinned("roll-none", "gcu-node-1", 1))
    wait_for(
        "roll-none to be refused: every card of gcu-node-1 is held",
        lambda: any(
            "Insufficient enflame.com/gcu" in e for e in cluster.events("enflame", "roll-none")
        ),
        60,
    )
