"""Observing the GCUs under the real kubelet: ``enflame-ctk allocations`` and the per-card
metrics name the manual's two pods, the probes follow the kubelet, the NFD feature file follows
an unplug, and every Grafana dashboard query resolves against the plugin's scrape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu.simulation import simulate
from tests.deploy import dashboard
from tests.kubelet import harness

pytestmark = pytest.mark.kubelet
SUFFIX = f"-{harness.NODE_NAME}"


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def metric_holders(text: str) -> dict[str, str]:
    """``{card: pod}`` of every held card in enflame_gcu_card_allocated."""
    return {
        sample.labels["card"]: sample.labels["pod_name"]
        for family in text_string_to_metric_families(text)
        if family.name == "enflame_gcu_card_allocated"
        for sample in family.samples
        if sample.labels["pod_name"]
    }


def test_allocations_metrics_probes_labels_and_dashboard(node: harness.Node) -> None:
    port = harness.free_port()
    features = os.path.join(node.work, "nfd", "enflame-gcu")
    node.up(plugin_args=["--feature-file", features])  # creates the kubelet (its socket path)
    kubelet = node.running_kubelet
    args = [
        f"--metrics-port={port}",
        "--pod-resources-interval=0.5",
        "--pod-resources-socket",
        kubelet.pod_resources_socket,
        "--feature-file",
        features,
    ]
    # Again with metrics, started while the kubelet is away: not ready before registration.
    node.plugin.stop()
    kubelet.stop()
    node.plugin.start(args)
    harness.wait_for("/healthz", lambda: probe(port, "/healthz") == 200, 30)
    assert probe(port, "/readyz") == 503
    kubelet.start()
    harness.wait_for("/readyz after registration", lambda: probe(port, "/readyz") == 200, 30)
    node.wait_registered(8)

    # The manual's two pods.
    assert set(node.pods.run("pod1", 2).cards) == {"gcu0", "gcu1"}
    assert set(node.pods.run("pod2", 2).cards) == {"gcu4", "gcu5"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "enflame_gcu.container_toolkit.cli",
            "allocations",
            "--root",
            node.host_root,
            "--pod-resources-socket",
            kubelet.pod_resources_socket,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    held = {
        card["name"]: [f"{h['namespace']}/{h['pod']}/{h['container']}" for h in card["holders"]]
        for card in document["cards"]
        if card["holders"]
    }
    assert held == {
        "gcu0": [f"default/pod1{SUFFIX}/main"],
        "gcu1": [f"default/pod1{SUFFIX}/main"],
        "gcu4": [f"default/pod2{SUFFIX}/main"],
        "gcu5": [f"default/pod2{SUFFIX}/main"],
    }
    assert document["summary"]["byLocality"]["switch"] == 2
    # Kubernetes 1.20: List only; GetAllocatableResources came in 1.21.
    assert document["podResources"]["allocatable"] is None
    assert "1.21" in document["podResources"]["allocatableNote"]

    expected = {"gcu0": "pod1", "gcu1": "pod1", "gcu4": "pod2", "gcu5": "pod2"}
    expected = {card: pod + SUFFIX for card, pod in expected.items()}
    harness.wait_for(
        "the metrics to name both pods", lambda: metric_holders(scrape(port)) == expected, 30
    )

    # The feature file follows an unplug within a second.
    with open(features, encoding="utf-8") as handle:
        assert "enflame.com/gcu.count.healthy=8\n" in handle.read()
    unplugged = time.monotonic()
    simulate.unplug(node.host_root, 7)

    def follows() -> bool:
        with open(features, encoding="utf-8") as handle:
            text = handle.read()
        # The cards present stay 8 (no label churn); the healthy count follows.
        return "enflame.com/gcu.count.healthy=7\n" in text and "enflame.com/gcu.count=8\n" in text

    harness.wait_for("the feature file to say count.healthy=7", follows, 10, 0.01)
    delay = time.monotonic() - unplugged
    print(f"feature file followed the unplug after {delay * 1000:.0f} ms")
    assert delay < 1.0, f"the feature file took {delay:.2f} s"

    # Every dashboard query resolves against this plugin's scrape.
    harness.wait_for(
        "the unhealthy card in the metrics",
        lambda: "enflame_gcu_card_unhealthy{" in scrape(port),
        10,
    )
    # (This plugin has no libefml: the card telemetry panels are checked against a real
    # Prometheus with the simulated libefml in tests/deploy/test_prometheus.py.)
    seen = dashboard.scraped_labels(scrape(port))
    allocation = [q for q in dashboard.queries() if not dashboard.is_telemetry(q)]
    assert dashboard.problems(allocation, seen) == []

    # Not ready while the kubelet is gone; ready again when it is back.
    kubelet.stop()
    harness.wait_for("/readyz to fail", lambda: probe(port, "/readyz") == 503, 30)
    assert probe(port, "/healthz") == 200
    kubelet.start()
    harness.wait_for("/readyz again", lambda: probe(port, "/readyz") == 200, 60)

    # A pod that goes frees its cards in allocations and metrics.
    node.pods.delete("pod1")
    harness.wait_for(
        "pod1's cards to be free in the metrics",
        lambda: metric_holders(scrape(port)) == {k: v for k, v in expected.items() if "pod2" in v},
        30,
    )
