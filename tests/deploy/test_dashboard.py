"""The Grafana dashboard (deploy/grafana): every query's metrics and labels exist in a real
scrape of a running plugin that serves pods, an unhealthy card and preferred allocations."""

from __future__ import annotations

import asyncio
import urllib.request

from tests.deploy import dashboard, telemetry_scene
from tests.device_plugin.test_metrics import free_port


def test_dashboard_is_importable_grafana_json() -> None:
    document = dashboard.load()
    assert document["uid"] == "enflame-gcu" and document["panels"]
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    for panel in document["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["description"]
    names = [v["name"] for v in document["templating"]["list"]]
    assert names == ["datasource", "node"]


def test_telemetry_queries_are_told_apart_from_allocation_ones() -> None:
    queries = dashboard.queries()
    telemetry = [q for q in queries if dashboard.is_telemetry(q)]
    assert any("enflame_gcu_temperatures" in q for q in telemetry)
    assert any("enflame_vgcu_usage" in q for q in telemetry)
    assert not any("enflame_gcu_card_allocated" in q for q in telemetry)
    assert not any("enflame_gcu_cards{" in q for q in telemetry)
    assert len(telemetry) == 17 and len(queries) - len(telemetry) == 15


def test_the_checker_catches_unknown_metrics_and_labels() -> None:
    seen = {"enflame_gcu_cards": {"health"}}
    assert dashboard.problems(['sum by (health) (enflame_gcu_cards{node=~"$node"})'], seen) == []
    found = dashboard.problems(
        [
            "enflame_gcu_card_temperature",
            'enflame_gcu_cards{colour="red"}',
            "sum by (pod) (enflame_gcu_cards)",
            "up",
        ],
        seen,
    )
    assert len(found) == 4, found


def test_every_dashboard_query_resolves_against_a_running_plugin() -> None:
    port = free_port()

    async def main() -> str:
        async with telemetry_scene.scene(port):
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return str(answer.read().decode())

    text = asyncio.run(main())
    seen = dashboard.scraped_labels(text)
    assert dashboard.problems(dashboard.queries(), seen) == []
