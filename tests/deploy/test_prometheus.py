"""A real Prometheus (Debian's package) scrapes the plugin on loopback with the scrape config the
Prometheus Operator makes from the chart's ServiceMonitor and PodMonitor (target labels
namespace/pod/container/service/endpoint, the chart's relabelings and metricRelabelings,
honorLabels both ways) and loads the chart's PrometheusRule; then every query of the guides and
of the dashboard returns the right series, and pod attribution survives the target labels."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from enflame_gcu.simulation import efmlsim
from tests.conftest import PROJECT_ROOT
from tests.deploy import dashboard, helm_render, telemetry_scene
from tests.device_plugin.test_metrics import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
NAMESPACE = "gcu-system"
PLUGIN_POD = "enflame-gcu-device-plugin-x7k2p"
NODE = "node-a"
# What the Operator's service discovery knows about the target (kubernetes_sd meta labels).
META = {
    "__meta_kubernetes_namespace": NAMESPACE,
    "__meta_kubernetes_service_name": "enflame-gcu-device-plugin-metrics",
    "__meta_kubernetes_pod_name": PLUGIN_POD,
    "__meta_kubernetes_pod_container_name": "enflame-device-plugin",
    "__meta_kubernetes_pod_node_name": NODE,
}
OVERRIDES = {
    "metrics": {
        "serviceMonitor": {
            "enabled": True,
            "interval": "1s",
            "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}
            ],
            "metricRelabelings": [{"targetLabel": "cluster", "replacement": "lab"}],
        },
        "podMonitor": {"enabled": True, "interval": "1s", "honorLabels": True},
        "prometheusRule": {"enabled": True},
        "telemetry": {"enabled": True},
    }
}
SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def _relabel(config: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator RelabelConfig as Prometheus's relabel_config."""
    return {SNAKE.sub("_", key).lower(): value for key, value in config.items()}


def _operator_job(kind: str, monitor: dict[str, Any], port: int) -> dict[str, Any]:
    """The scrape config the Operator generates for the monitor's first endpoint (the target
    labels it adds, then the monitor's own relabelings)."""
    [endpoint] = monitor["spec"]["endpoints" if kind == "serviceMonitor" else "podMetricsEndpoints"]
    name = monitor["metadata"]["name"]
    relabel = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    if kind == "serviceMonitor":
        relabel += [
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        ]
    else:
        relabel.append({"target_label": "job", "replacement": f"{NAMESPACE}/{name}"})
    relabel += [_relabel(r) for r in endpoint.get("relabelings", [])]
    return {
        "job_name": f"{kind}/{NAMESPACE}/{name}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "scrape_interval": endpoint["interval"],
        "metrics_path": endpoint["path"],
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": META}],
        "relabel_configs": relabel,
        "metric_relabel_configs": [_relabel(r) for r in endpoint.get("metricRelabelings", [])],
    }


class Prometheus:
    """A Prometheus server on a loopback port with a temporary data directory."""

    def __init__(self, workdir: str, config: dict[str, Any], rules: dict[str, Any]) -> None:
        self.port = free_port()
        self.workdir = workdir
        with open(os.path.join(workdir, "rules.yaml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(rules, handle)
        with open(os.path.join(workdir, "prometheus.yml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        self.log = open(os.path.join(workdir, "prometheus.log"), "w", encoding="utf-8")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir}/prometheus.yml",
                f"--storage.tsdb.path={workdir}/data",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (http, loopback)
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus never became ready: {self.log_text()}")

    def log_text(self) -> str:
        with open(os.path.join(self.workdir, "prometheus.log"), encoding="utf-8") as handle:
            return handle.read()[-3000:]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


def guide_queries() -> list[str]:
    """Every line of the ```promql blocks in the user guides and docs/metrics.md (EN)."""
    found = []
    for name in ("user-guide.md", "metrics.md"):
        with open(os.path.join(PROJECT_ROOT, "docs", name), encoding="utf-8") as handle:
            text = handle.read()
        for block in re.findall(r"```promql\n(.*?)```", text, re.DOTALL):
            for line in block.splitlines():
                expr = line.split("  #")[0].strip()
                if expr:
                    found.append(expr)
    return found


def eventually(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def rendered() -> Iterator[dict[str, list[Any]]]:
    if helm_render.helm_missing():
        pytest.skip(helm_render.NO_HELM_SDK)
    with tempfile.TemporaryDirectory() as workdir:
        yield helm_render.render(workdir, OVERRIDES)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="no prometheus: make test installs it")
def test_real_prometheus_scrapes_the_plugin_as_the_operator_configures_it(
    rendered: dict[str, list[Any]], tmp_path: Any
) -> None:
    [service_monitor] = helm_render.objects(rendered, "ServiceMonitor")
    [pod_monitor] = helm_render.objects(rendered, "PodMonitor")
    [rule] = helm_render.objects(rendered, "PrometheusRule")
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is False
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    port = free_port()

    async def main() -> None:
        async with telemetry_scene.scene(port) as node:
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": ["rules.yaml"],
                "scrape_configs": [
                    _operator_job("serviceMonitor", service_monitor, port),
                    _operator_job("podMonitor", pod_monitor, port),
                ],
            }
            server = Prometheus(str(tmp_path), config, {"groups": rule["spec"]["groups"]})
            try:
                await asyncio.to_thread(server.wait_ready)
                pm_job = f"{NAMESPACE}/{pod_monitor['metadata']['name']}"
                await asyncio.to_thread(check, server, node.root, pm_job)
            except BaseException:
                print(server.log_text())  # shown by pytest on failure
                raise
            finally:
                server.stop()

    asyncio.run(main())


SM_JOB = "enflame-gcu-device-plugin-metrics"


def check(server: Prometheus, root: str, pm_job: str) -> None:
    """What must hold once Prometheus has scraped a few times."""

    def targets_up() -> list[dict[str, Any]]:
        found = server.query("up == 1")
        return found if len(found) == 2 else []

    up = eventually(targets_up, "both targets up")
    assert {r["metric"]["job"] for r in up} == {SM_JOB, pm_job}
    # The chart's relabelings and metricRelabelings were applied (ServiceMonitor job only).
    sm_up = server.query(f'up{{job="{SM_JOB}"}}')
    assert sm_up[0]["metric"]["instance"] == NODE and sm_up[0]["metric"]["node"] == NODE
    assert server.query(f'enflame_gcu_cards{{job="{SM_JOB}", cluster="lab"}}')
    efmlsim.set_values(root, "card0", {"ecc_dbe": "7"})  # for the ECC alert
    time.sleep(4)  # rate() and increase() need a few samples

    for job in (SM_JOB, pm_job):
        held = server.query(f'enflame_gcu_card_allocated{{job="{job}", pod_namespace="ml"}}')
        # Attribution survives: our holder labels next to the target's own namespace and pod.
        assert sorted(r["metric"]["pod_name"] for r in held) == ["pod2", "vpod"], held
        for series in held:
            assert series["metric"]["namespace"] == NAMESPACE
            assert series["metric"]["pod"] == PLUGIN_POD
            assert series["metric"]["container_name"] == "main"
        # The telemetry has no holder labels: the holder is joined from allocation_info.
        usage = server.query(
            f'enflame_gcu_usage{{job="{job}"}} * on (node, card) group_left (pod_name)'
            f' max by (node, card, pod_name) (enflame_gcu_allocation_info{{job="{job}",'
            ' pod_name="pod2"})'
        )
        assert len(usage) == 1 and "exported_pod" not in usage[0]["metric"]
        card = int(usage[0]["metric"]["card"].removeprefix("gcu"))
        assert float(usage[0]["value"][1]) == 10 * card + 5  # what the sim says for that card
        vgcu = server.query(
            f'enflame_vgcu_usage{{job="{job}"}} * on (node, card) group_left (pod_name)'
            f' max by (node, card, pod_name) (enflame_gcu_allocation_info{{job="{job}",'
            ' pod_name="vpod"})'
        )
        assert sorted({r["metric"]["card"] for r in vgcu}) == ["gcu4"]

    empty = []
    for expr in guide_queries():
        if not server.query(expr):
            empty.append(expr)
    assert empty == [], "guide queries with no result"
    expected_empty = {'enflame_gcu_exporter_up{node=~".*"} == 0'}  # telemetry is up here
    for query in dashboard.queries():
        expr = query.replace("$node", ".*").replace("$__range", "5m")
        if expr.startswith("label_values("):
            metric, label = expr.removeprefix("label_values(").rstrip(")").split(", ")
            values = server.api(f"label/{label}/values", **{"match[]": metric})
            assert values == [NODE], expr
            continue
        got = server.query(expr)
        if expr in expected_empty:
            assert got == [], expr
        elif not got:
            empty.append(expr)
    assert empty == [], "dashboard queries with no result"

    def rules() -> dict[str, tuple[str, str]]:
        groups = server.api("rules")["groups"]
        return {r["name"]: (r["health"], r["state"]) for g in groups for r in g["rules"]}

    def ecc_alert_fired() -> dict[str, tuple[str, str]]:
        found = rules()
        return found if found.get("EnflameGCUEccErrorsRising", ("", ""))[1] == "firing" else {}

    states = eventually(ecc_alert_fired, "the ECC alert to fire")
    assert all(health == "ok" for health, _ in states.values()), states
    assert states["EnflameGCUCardUnhealthy"][1] == "pending"  # gcu2 is unplugged; for: 5m
    assert states["EnflameGCUTelemetryCardDown"][1] == "pending"  # card3 fails; for: 10m
    assert set(states) == {
        "EnflameGCUCardUnhealthy",
        "EnflameGCUEccErrorsRising",
        "EnflameGCUTemperatureHigh",
        "EnflameGCUTelemetryCardDown",
        "EnflameGCUAllocatedButIdle",
        "EnflameGCUResetEvents",
    }
