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


def held(holder: dict[str, str], values: str, card: str = "gcu0") -> dict[str, str]:
    """enflame_gcu_allocation_info of a whole card held by ``holder``."""
    return series("enflame_gcu_allocation_info", values, card=card, device=card, **holder)


def events(kind: str, values: str, **labels: str) -> dict[str, str]:
    text = ", ".join(f'{k}="{v}"' for k, v in {"node": "n1", "type": kind, **labels}.items())
    return {"series": f"enflame_gcu_events_total{{{text}}}", "values": values}


def reset_fired() -> dict[str, Any]:
    return {
        "exp_labels": {"node": "n1", "type": "reset_start", "severity": "warning"},
        "exp_annotations": {"summary": RESET},
    }


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
    # The holder is a label of enflame_gcu_allocation_info only; usage has one series per card.
    "idle_for_the_whole_window_fires": (
        [series("enflame_gcu_usage", "0x150"), held(HOLDER_A, "1x150")],
        [
            alert("1h50m", "EnflameGCUAllocatedButIdle"),
            alert(
                "2h5m",
                "EnflameGCUAllocatedButIdle",
                fired("info", IDLE.format(pod="a"), pod_namespace="ml", pod_name="a"),
            ),
        ],
    ),
    "one_failed_scrape_in_an_idle_stretch_still_fires_on_time": (
        # A failed scrape marks every series of the target stale: before, the "for" started
        # again there and the alert fired an hour late.
        [series("enflame_gcu_usage", "0x60 stale 0x90"), held(HOLDER_A, "1x60 stale 1x90")],
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
            series("enflame_gcu_usage", "0.0001x150"),
            held(HOLDER_A, "1x150"),
            series("enflame_gcu_usage", "35x150", card="gcu1"),
            held(HOLDER_B, "1x150", card="gcu1"),
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
        [series("enflame_gcu_usage", "0x150"), held(HOLDER_A, "_x110 1x40")],
        [alert("2h5m", "EnflameGCUAllocatedButIdle"), alert("2h30m", "EnflameGCUAllocatedButIdle")],
    ),
    "a_new_holder_starts_the_idle_window_again": (
        [
            series("enflame_gcu_usage", "0x240"),
            held(HOLDER_A, "1x90"),
            held(HOLDER_B, "_x91 1x150"),
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
        [series("enflame_gcu_usage", "0x60 _x20 0x60"), held(HOLDER_A, "1x141")],
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
    "ecc_error_while_the_plugin_pod_is_replaced_fires": (
        # The old plugin pod's series ends (stale) at 10m, the new pod's starts at 12m with the
        # card's count, already 3 on gcu0: before, increase() on each series saw nothing.
        [
            series("enflame_gcu_ecc_double_bit_errors_total", "2x10 stale", pod="plugin-a"),
            series("enflame_gcu_ecc_double_bit_errors_total", "_x12 3x20", pod="plugin-b"),
            series(
                "enflame_gcu_ecc_double_bit_errors_total", "5x10 stale", card="gcu1", pod="plugin-a"
            ),
            series(
                "enflame_gcu_ecc_double_bit_errors_total", "_x12 5x20", card="gcu1", pod="plugin-b"
            ),
        ],
        [
            alert("9m", "EnflameGCUEccErrorsRising"),
            alert("15m", "EnflameGCUEccErrorsRising", fired("warning", ECC)),
        ],
    ),
    "a_double_bit_count_that_goes_down_does_not_fire": (
        [series("enflame_gcu_ecc_double_bit_errors_total", "4x10 0x20")],  # a driver reload
        [alert("15m", "EnflameGCUEccErrorsRising"), alert("25m", "EnflameGCUEccErrorsRising")],
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
    "a_reset_event_counted_at_a_new_plugin_pods_first_scrape_fires": (
        # The new plugin pod (perhaps restarted by the reset) counts the event before its first
        # scrape: its series starts at 1. Before, increase() saw no growth and never fired.
        [
            events("reset_start", "0x10 stale", pod="plugin-a"),
            events("reset_start", "_x12 1x20", pod="plugin-b"),
            events("reset_finish", "_x12 1x20", pod="plugin-b"),
            events("dtu_suspend", "_x12 0x20", pod="plugin-b"),
        ],
        [
            alert("11m", "EnflameGCUResetEvents"),
            alert("15m", "EnflameGCUResetEvents", reset_fired()),
            alert("25m", "EnflameGCUResetEvents"),  # counted once, and now older than the window
        ],
    ),
    "a_plugin_pod_back_after_a_short_gap_does_not_count_its_old_events_again": (
        [events("reset_start", "1x30 _x15 1x30", pod="plugin-a")],
        [alert("50m", "EnflameGCUResetEvents")],
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
