"""Operators see their GCUs: per-card metrics with the holding pod (PodResources through the
kubelet stub), probes that follow registration, Prometheus naming, JSON logs, bind address."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu.simulation import simulate
from enflame_gcu.simulation.testing import kubelet_stub, plugin_process
from tests.device_plugin.test_metrics import free_port, scrape

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
FAST = ["--pod-resources-interval", "0.2"]


def metrics_args(port: int, *extra: str) -> list[str]:
    return [f"--metrics-port={port}", *FAST, *extra]


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def holders_of(samples: Samples) -> dict[str, set[str]]:
    """``{card: {namespace/pod/container}}``: every card of enflame_gcu_card_healthy, its
    holders from enflame_gcu_allocation_info (the one family with holder labels)."""
    result: dict[str, set[str]] = {
        dict(labels)["card"]: set() for labels in series(samples, "enflame_gcu_card_healthy")
    }
    for labels in series(samples, "enflame_gcu_allocation_info"):
        got = dict(labels)
        result[got["card"]].add(
            "/".join(got[k] for k in ("pod_namespace", "pod_name", "container_name"))
        )
    return result


def probe(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


async def eventually(check: object, what: str, timeout: float = 10.0) -> None:
    """Poll a no-argument callable (run in a thread: it may do HTTP) until it is truthy."""
    assert callable(check)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(check):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def test_cards_carry_the_pod_holding_them_and_lose_it_when_the_pod_goes() -> None:
    port = free_port()

    async def main() -> None:
        args = metrics_args(port)
        async with plugin_process.running_node(args=args, pod_resources=True) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 2})
            await node.kubelet.allocate_pod("pod2", {"main": 2}, namespace="ml")
            expected = {
                "gcu0": {"default/pod1/main"},
                "gcu1": {"default/pod1/main"},
                "gcu4": {"ml/pod2/main"},
                "gcu5": {"ml/pod2/main"},
            }

            def held() -> dict[str, set[str]]:
                return {c: w for c, w in holders_of(scrape(port)).items() if w}

            await eventually(lambda: held() == expected, "the holders in the metrics")
            samples = scrape(port)
            allocated = series(samples, "enflame_gcu_card_allocated")
            gcu4 = [
                dict(labels) for labels, v in allocated.items() if dict(labels)["card"] == "gcu4"
            ]
            assert gcu4 == [
                {
                    "card": "gcu4",
                    "model": "T20-32GB",
                    "resource": "enflame.com/gcu",
                    "pod_namespace": "ml",
                    "pod_name": "pod2",
                    "container_name": "main",
                }
            ]
            free = {dict(k)["card"]: v for k, v in allocated.items() if not dict(k)["pod_name"]}
            assert free == {"gcu2": 0, "gcu3": 0, "gcu6": 0, "gcu7": 0}
            assert samples[("enflame_gcu_cards_allocated", ())] == 4
            assert samples[("enflame_gcu_pod_resources_up", ())] == 1
            switch = (
                "enflame_gcu_allocations_total",
                (("locality", "switch"), ("resource", "enflame.com/gcu")),
            )
            assert samples[switch] == 2
            preferred = (
                "enflame_gcu_preferred_allocations_total",
                (("locality", "switch"), ("resource", "enflame.com/gcu")),
            )
            assert samples[preferred] == 2

            node.kubelet.delete_pod("pod1")
            await eventually(
                lambda: set(held()) == {"gcu4", "gcu5"}, "pod1's cards to be free again"
            )

    asyncio.run(main())


def test_an_unhealthy_card_has_a_reason_and_keeps_its_holder() -> None:
    port = free_port()

    async def main() -> None:
        args = metrics_args(port, "--health-interval", "0.5")
        async with plugin_process.running_node(args=args, pod_resources=True) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 2})
            await eventually(
                lambda: holders_of(scrape(port))["gcu1"] == {"default/pod1/main"}, "the holder"
            )
            simulate.unplug(node.root, 1)

            def reason() -> str | None:
                found = series(scrape(port), "enflame_gcu_card_unhealthy")
                return next((dict(k)["reason"] for k in found if dict(k)["card"] == "gcu1"), None)

            await eventually(reason, "gcu1's unhealthy reason")
            assert "gone" in (reason() or "")
            samples = scrape(port)
            gcu1 = [
                (dict(k), v)
                for k, v in series(samples, "enflame_gcu_card_healthy").items()
                if dict(k)["card"] == "gcu1"
            ]
            # One series per card: the holder is on allocation_info, not repeated here.
            assert [v for _, v in gcu1] == [0] and "pod_name" not in gcu1[0][0]
            assert holders_of(samples)["gcu1"] == {"default/pod1/main"}
            assert samples[("enflame_gcu_cards", (("health", "Unhealthy"),))] == 1
            assert samples[("enflame_gcu_cards", (("health", "Healthy"),))] == 7

    asyncio.run(main())


def test_without_pod_resources_the_plugin_keeps_serving_and_says_so() -> None:
    port = free_port()

    async def main() -> None:
        missing = ["--pod-resources-socket", "/nonexistent/pod-resources/kubelet.sock"]
        async with plugin_process.running_node(args=metrics_args(port, *missing)) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 2})
            samples = scrape(port)
            assert samples[("enflame_gcu_pod_resources_up", ())] == 0
            assert not series(samples, "enflame_gcu_card_allocated")
            assert all(not who for who in holders_of(samples).values())
            assert len(holders_of(samples)) == 8
            log = node.plugin.log_text()
            assert "PodResources API is not available at /nonexistent/pod-resources" in log
            assert "the plugin keeps serving" in log
            assert log.count("PodResources API is not available") == 1  # not once per poll
            assert probe(port, "/readyz")[0] == 200

    asyncio.run(main())


def test_probes_follow_registration_and_the_kubelet() -> None:
    port = free_port()

    async def main() -> None:
        work, root, plugins = plugin_process.make_node()
        plugin = plugin_process.PluginProcess(plugins, root, metrics_args(port))
        kubelet = kubelet_stub.KubeletStub(plugins)
        try:
            await plugin.start()
            await eventually(lambda: probe(port, "/healthz")[0] == 200, "/healthz")
            status, body = await asyncio.to_thread(probe, port, "/readyz")
            assert status == 503
            assert "not registered" in body or "not serving yet" in body

            await kubelet.start()
            await kubelet.wait_for(lambda k: bool(k.registrations), 10, "registration")
            await eventually(lambda: probe(port, "/readyz")[0] == 200, "ready")
            assert (await asyncio.to_thread(probe, port, "/readyz"))[1] == "ok\n"

            await kubelet.stop()  # the kubelet is gone
            await eventually(lambda: probe(port, "/readyz")[0] == 503, "not ready")
            assert "not connected" in (await asyncio.to_thread(probe, port, "/readyz"))[1]
            assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200

            await kubelet.restart()
            await eventually(lambda: probe(port, "/readyz")[0] == 200, "ready again")
            causes = {
                dict(k)["cause"]: v
                for k, v in series(scrape(port), "enflame_gcu_registrations_total").items()
            }
            assert causes == {"start": 1, "kubelet_restart": 1}
        finally:
            await plugin.stop()
            await kubelet.stop()
            shutil.rmtree(work, ignore_errors=True)

    asyncio.run(main())


def test_exposition_follows_prometheus_naming() -> None:
    port = free_port()

    async def main() -> None:
        async with plugin_process.running_node(args=metrics_args(port), pod_resources=True) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 2})
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        samples = [s.name for f in families.values() for s in f.samples]
        assert not [name for name in samples if name.endswith("_created")]
        for family in families.values():
            if family.type == "counter":
                assert all(s.name == f"{family.name}_total" for s in family.samples), family.name
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family.name
        assert families["enflame_gcu_build_info"].samples[0].labels["version"]
        for needed in (
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_cpu_seconds",
            "enflame_gcu_rpc_duration_seconds",
            "enflame_gcu_registered",
        ):
            assert needed in families, needed
        buckets = [
            s
            for s in families["enflame_gcu_rpc_duration_seconds"].samples
            if s.name.endswith("_count") and s.labels["rpc"] == "Allocate"
        ]
        assert buckets and buckets[0].value == 1 and buckets[0].labels["code"] == "OK"

    asyncio.run(main())


def test_bind_address_limits_where_the_port_listens() -> None:
    port = free_port()

    async def main() -> None:
        args = metrics_args(port, "--metrics-bind-address", "127.0.0.1")
        async with plugin_process.running_node(args=args):
            assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200
            if socket.has_ipv6:
                with socket.socket(socket.AF_INET6) as other:
                    assert other.connect_ex(("::1", port)) != 0

    asyncio.run(main())


def test_json_logs_are_one_object_per_line_in_utc() -> None:
    async def main() -> None:
        async with plugin_process.running_node(args=["--log-format", "json"]) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 1})
            lines = [line for line in node.plugin.log_text().splitlines() if line.strip()]
        entries = [json.loads(line) for line in lines]
        assert entries and all(e["time"].endswith("Z") for e in entries)
        assert {"time", "level", "logger", "msg"} <= set(entries[0])
        assert any(e["msg"].startswith("registered enflame.com/gcu") for e in entries)

    asyncio.run(main())


def test_feature_file_follows_unplug_and_is_rewritten_only_on_change(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(str(tmp_path), "features.d", "enflame-gcu")

    async def main() -> None:
        args = ["--feature-file", path, "--health-interval", "0.2"]
        async with plugin_process.running_node(args=args) as node:
            await eventually(lambda: os.path.exists(path), "the feature file")
            with open(path, encoding="utf-8") as handle:
                first = handle.read()
            assert "enflame.com/gcu.count=8\n" in first
            assert "enflame.com/gcu.present=true\n" in first
            assert "enflame.com/gcu.sharing-strategy=none\n" in first
            assert "enflame.com/gcu.replicas=1\n" in first
            inode = os.stat(path).st_ino
            await asyncio.sleep(1.0)  # several rescans that change nothing
            assert os.stat(path).st_ino == inode

            simulate.unplug(node.root, 3)

            def count() -> str:
                with open(path, encoding="utf-8") as handle:
                    return handle.read()

            await eventually(
                lambda: "enflame.com/gcu.count.healthy=7\n" in count(), "count.healthy=7"
            )
            assert "enflame.com/gcu.count=8\n" in count()  # the cards present: no churn
            simulate.replug(node.root, 3)
            await eventually(
                lambda: "enflame.com/gcu.count.healthy=8\n" in count(), "count.healthy=8 again"
            )
            simulate.set_driver_version(node.root, "1.2.3")
            await eventually(
                lambda: "enflame.com/gcu.driver.version=1.2.3\n" in count(), "new driver version"
            )

    asyncio.run(main())


@pytest.mark.parametrize("value", ["", "all", "*"])
def test_empty_bind_address_means_every_address(value: str) -> None:
    from enflame_gcu.device_plugin import main

    assert main.load_config(["--metrics-bind-address", value], {}).metrics_bind_address == ""


def test_json_logs_carry_the_grpc_core_lines_too() -> None:
    # The C-core writes to fd 2 itself (absl's "I1125 ... chttp2_transport.cc:...] ..."); with
    # GRPC_VERBOSITY=debug it says plenty at start and when the kubelet goes away.
    async def main() -> None:
        env = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}
        async with plugin_process.running_node(args=["--log-format", "json"], env=env) as node:
            await node.kubelet.allocate_pod("pod1", {"main": 1})
            await node.kubelet.restart()
            await eventually(
                lambda: node.plugin.log_text().count("registered enflame.com/gcu") >= 2,
                "registered again after the kubelet restart",
            )
            text = node.plugin.log_text()
        lines = [line for line in text.splitlines() if line.strip()]
        not_json = []
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                not_json.append(line)
        assert not not_json, f"{len(not_json)} of {len(lines)} lines are not JSON: {not_json[:5]}"
        core = [json.loads(line) for line in lines if json.loads(line)["logger"] == "grpc.core"]
        assert core, "the C-core said nothing: the test proves nothing"
        assert all(entry["level"] in {"debug", "info", "warning", "error"} for entry in core)
        assert any(".cc:" in entry["msg"] for entry in core)

    asyncio.run(main())
