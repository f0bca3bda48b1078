"""Every alert of the chart's PrometheusRule, proven with ``promtool test rules`` against the rules
Helm renders: each fires when it should and stays quiet when it should not, including a card
changing hands, a pod younger than the idle window and a card that drops out of telemetry."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.deploy import helm_render, promtool

NODE = {"node": "n1", "card": "gcu0"}
HOLDER_A = {"pod_namespace": "ml", "pod_name": "a", "container_name": "main"}
HOLDER_B = {"pod_namespace": "ml", "pod_name": "b", "container_name": "main"}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ", ".join(f'{key}="{value}"' for key, value in {**NODE, **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def alert(at: str, name: str, *fired: dict[str, str]) -> dict[str, Any]:
    """``name`` at ``at`` fires exactly for ``fired`` (labels; severity and summary not compared
    by promtool when only labels are listed, so each carries its own)."""
    return {"eval_time": at, "alertname": name, "exp_alerts": list(fired)}


def fired(severity: str, summary: str, **labels: str) -> dict[str, Any]:
    return {
        "exp_labels": {**NODE, **labels, "severity": severity},
        "exp_annotations": {"summary": summary},
    }


IDLE = "Pod ml/{pod} has held GCU gcu0 on n1 with usage below 1 for 2h"
ECC = "GCU gcu0 on n1 had new uncorrectable (double-bit) ECC errors in 30 minutes"
HOT = "GCU gcu0 on n1 has been above 85 °C for 10 minutes"
RESET = (
    "libefml reported reset_start events on n1 in the last 10 minutes (the plugin's log has"
    " each message)"
)
# name -> (input series, alert expectations)
SCENARIOS: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "idle_for_the_whole_window_fires": (
        [series("enflame_gcu_usage", "0x150", **HOLDER_A)],
        [
            alert("1h50m", "EnflameGCUAllocatedButIdle"),
            alert(
                "2h5m",
                "EnflameGCUAllocatedButIdle",
                fired("info", IDLE.format(pod="a"), pod_namespace="ml", pod_name="a"),
            ),
        ],
    ),
    "float_noise_is_idle_and_real_work_is_not": (
        [
            series("enflame_gcu_usage", "0.0001x150", **HOLDER_A),
            series("enflame_gcu_usage", "35x150", card="gcu1", **HOLDER_B),
        ],
        [
            alert(
                "2h5m",
                "EnflameGCUAllocatedButIdle",
                fired("info", IDLE.format(pod="a"), pod_namespace="ml", pod_name="a"),
            )
        ],
    ),
    "a_pod_younger_than_the_idle_window_does_not_fire": (
        [series("enflame_gcu_usage", "0x40", **HOLDER_A)],
        [alert("10m", "EnflameGCUAllocatedButIdle"), alert("40m", "EnflameGCUAllocatedButIdle")],
    ),
    "a_new_holder_starts_the_idle_window_again": (
        [
            series("enflame_gcu_usage", "0x90", **HOLDER_A),
            series("enflame_gcu_usage", "_x91 0x150", **HOLDER_B),
        ],
        [
            alert("2h30m", "EnflameGCUAllocatedButIdle"),
            alert(
                "3h35m",
                "EnflameGCUAllocatedButIdle",
                fired("info", IDLE.format(pod="b"), pod_namespace="ml", pod_name="b"),
            ),
        ],
    ),
    "an_idle_card_that_drops_out_of_telemetry_is_not_called_idle": (
        [series("enflame_gcu_usage", "0x60 _x20 0x60", **HOLDER_A)],
        [alert("2h15m", "EnflameGCUAllocatedButIdle")],
    ),
    "ecc_error_fires_and_a_steady_count_does_not": (
        [
            series("enflame_gcu_ecc_double_bit_errors_total", "2x10 3x30"),
            series("enflame_gcu_ecc_double_bit_errors_total", "5x40", card="gcu1"),
        ],
        [
            alert("8m", "EnflameGCUEccErrorsRising"),
            alert("15m", "EnflameGCUEccErrorsRising", fired("warning", ECC)),
        ],
    ),
    "ecc_error_at_a_handover_fires": (
        # The holder moves from a to b at 10m, when the error arrives: the counter has no holder
        # labels, so its one series sees 2 -> 3; the holder is joined from allocation_info.
        [
            series("enflame_gcu_ecc_double_bit_errors_total", "2x10 3x30"),
            series("enflame_gcu_allocation_info", "1x9", device="gcu0", **HOLDER_A),
            series("enflame_gcu_allocation_info", "_x10 1x30", device="gcu0", **HOLDER_B),
        ],
        [alert("12m", "EnflameGCUEccErrorsRising", fired("warning", ECC))],
    ),
    "ecc_error_while_the_card_was_out_of_telemetry_fires": (
        [series("enflame_gcu_ecc_double_bit_errors_total", "2x10 _x10 3x10")],
        [alert("25m", "EnflameGCUEccErrorsRising", fired("warning", ECC))],
    ),
    "a_reset_event_fires_and_a_reset_finish_does_not": (
        # The counters start at 0 when the events thread starts, so the first event counts.
        [
            {
                "series": 'enflame_gcu_events_total{node="n1", type="reset_start"}',
                "values": "0x5 1x20",
            },
            {
                "series": 'enflame_gcu_events_total{node="n1", type="reset_finish"}',
                "values": "0x5 1x20",
            },
        ],
        [
            alert("4m", "EnflameGCUResetEvents"),
            {
                "eval_time": "8m",
                "alertname": "EnflameGCUResetEvents",
                "exp_alerts": [
                    {
                        "exp_labels": {"node": "n1", "type": "reset_start", "severity": "warning"},
                        "exp_annotations": {"summary": RESET},
                    }
                ],
            },
            alert("20m", "EnflameGCUResetEvents"),  # older than the 10-minute window
        ],
    ),
    "hot_for_ten_minutes_fires_across_a_handover": (
        [
            series("enflame_gcu_temperatures", "90x6", **HOLDER_A),
            series("enflame_gcu_temperatures", "_x6 90x10", **HOLDER_B),
            series("enflame_gcu_temperatures", "84x16", card="gcu1"),
        ],
        [
            alert("9m", "EnflameGCUTemperatureHigh"),
            alert("12m", "EnflameGCUTemperatureHigh", fired("warning", HOT)),
        ],
    ),
    "unhealthy_for_five_minutes_fires": (
        [
            series("enflame_gcu_card_unhealthy", "1x10", reason="link_down"),
            series("enflame_gcu_card_unhealthy", "0x10", card="gcu1", reason=""),
        ],
        [
            alert("4m", "EnflameGCUCardUnhealthy"),
            alert(
                "6m",
                "EnflameGCUCardUnhealthy",
                fired("warning", "GCU gcu0 on n1 is unhealthy: link_down", reason="link_down"),
            ),
        ],
    ),
    "a_card_out_of_telemetry_for_ten_minutes_fires": (
        [
            series("enflame_gcu_telemetry_card_error", "0x2 1x15", reason="timeout"),
            series("enflame_gcu_telemetry_card_error", "0x17", card="gcu1", reason=""),
        ],
        [
            alert("9m", "EnflameGCUTelemetryCardDown"),
            alert(
                "13m",
                "EnflameGCUTelemetryCardDown",
                fired(
                    "warning",
                    "libefml has not answered for GCU gcu0 on n1 for 10 minutes: timeout",
                    reason="timeout",
                ),
            ),
        ],
    ),
}


@pytest.fixture(scope="module")
def rules_file() -> Iterator[str]:
    """The chart's PrometheusRule as a Prometheus rules file (the values' defaults)."""
    if not os.path.exists(helm_render.HELM_SDK):
        pytest.skip(helm_render.NO_HELM_SDK)
    with tempfile.TemporaryDirectory() as workdir:
        rendered = helm_render.render(workdir, {"metrics": {"prometheusRule": {"enabled": True}}})
        [rule] = helm_render.objects(rendered, "PrometheusRule")
        path = os.path.join(workdir, "rules.yaml")
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump({"groups": rule["spec"]["groups"]}, handle, allow_unicode=True)
        yield path


def test_the_rules_pass_promtool_check(rules_file: str) -> None:
    result = promtool.run("check", "rules", rules_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_scenario_that_fires_it(rules_file: str) -> None:
    with open(rules_file, encoding="utf-8") as handle:
        alerts = {r["alert"] for g in yaml.safe_load(handle)["groups"] for r in g["rules"]}
    proven = {
        case["alertname"] for _, cases in SCENARIOS.values() for case in cases if case["exp_alerts"]
    }
    assert alerts == proven


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_alert_rule_scenario(name: str, rules_file: str, tmp_path: Any) -> None:
    inputs, alerts = SCENARIOS[name]
    test = {
        "rule_files": [rules_file],
        "evaluation_interval": "1m",
        "tests": [
            {"name": name, "interval": "1m", "input_series": inputs, "alert_rule_test": alerts}
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, allow_unicode=True), encoding="utf-8")
    result = promtool.run("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_promtool_fails_under_ci_and_skips_elsewhere(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    real_exists = os.path.exists
    monkeypatch.setattr(
        "os.path.exists", lambda path: False if "promtool" in path else real_exists(path)
    )
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no promtool"):
        promtool.binary()
