"""Card telemetry over HTTP: every gcu-exporter metric (EFML.md §4) set in the simulated libefml
and read back from the plugin's /metrics, pod attribution, and cards that fail or hang dropping
out with a reason while the other cards and allocation go on."""

from __future__ import annotations

import asyncio

from enflame_gcu.device_plugin import card_metrics
from enflame_gcu.simulation import efmlsim, simulate
from enflame_gcu.simulation.testing import plugin_process
from tests.device_plugin.test_metrics import free_port, scrape
from tests.device_plugin.test_observability import Samples
from tests.device_plugin.test_observability import eventually as _eventually

FAST = ["--pod-resources-interval=0.2", "--telemetry-interval=0.2", "--telemetry-timeout=0.5"]
GiB = 1 << 30
MiB = 1 << 20


async def eventually(check: object, what: str, timeout: float = 30.0) -> None:
    """As test_observability's, with room for a busy machine."""
    await _eventually(check, what, timeout)


def args(port: int, *extra: str) -> list[str]:
    return [f"--metrics-port={port}", *FAST, *extra]


def values(samples: Samples, name: str, **match: str) -> list[float]:
    """Values of ``name`` whose labels include ``match``."""
    return [
        value
        for (sample, labels), value in samples.items()
        if sample == name and match.items() <= dict(labels).items()
    ]


def labelled(samples: Samples, name: str, **match: str) -> list[dict[str, str]]:
    return [
        dict(labels)
        for (sample, labels), _ in samples.items()
        if sample == name and match.items() <= dict(labels).items()
    ]


# What the test writes into card1's libefml values, and what each §4 metric must then read.
CARD1 = {
    "usage": "61.5",
    "sip_usage": "33.25",
    "cluster_usage": "10 20",
    "pgs": "2",
    "pg_usage": "5 7",
    "mem_total_bytes": str(32 * GiB),
    "mem_used_mib": "8192",
    "power": "150",
    "power_capability": "300",
    "asic_temp": "81",
    "mem_temp": "70",
    "board_temp": "45",
    "dtu_clock_mhz": "1250",
    "hbm_clock_mhz": "1800",
    "power_mode": "5",
    "ecc_sbe": "12",
    "ecc_dbe": "2",
    "link_speed": "3",
    "max_link_speed": "4",
    "link_width": "8",
    "max_link_width": "16",
    "virt_mode": "1",
    "fw_version": "40.1.0",
    "sn": "SN-TEST-1",
    "slot": "OAM7",
    "vgcu5_usage": "44",
    "vgcu5_mem_total_bytes": str(8 * GiB),
    "vgcu5_mem_used_mib": "2048",
}
CARD1_EXPECTED = {
    "enflame_gcu_usage": 61.5,
    "enflame_gcu_sip_usage": 33.25,
    "enflame_gcu_memory_total_bytes": 32 * GiB,
    "enflame_gcu_memory_used_bytes": 8192 * MiB,
    "enflame_gcu_memory_usage": 0.25,
    "enflame_gcu_power_consumption": 150,
    "enflame_gcu_power_capability": 300,
    "enflame_gcu_power_usage": 50,
    "enflame_gcu_temperatures": 81,
    "enflame_gcu_clock": 1250,
    "enflame_gcu_health": 2,
    "enflame_gcu_ecc_single_bit_error_total_count": 12,
    "enflame_gcu_ecc_double_bit_error_total_count": 2,
    "enflame_gcu_pcie_link_width": 8,  # the current width: gcu-exporter reported the maximum
    "enflame_gcu_pcie_max_link_width": 16,
    "enflame_gcu_virt_mode": 1,
    "enflame_gcu_info": 1,
    "enflame_gcu_memory_clock": 1800,
    "enflame_gcu_pcie_link_generation": 3,
    "enflame_gcu_pcie_max_link_generation": 4,
}
VGCU5_EXPECTED = {
    "enflame_vgcu_usage": 44,
    "enflame_vgcu_memory_total_bytes": 8 * GiB,
    "enflame_vgcu_memory_used_bytes": 2048 * MiB,
    "enflame_vgcu_memory_usage": 0.25,
    # The parent card's values, as gcu-exporter repeats them per vGCU.
    "enflame_vgcu_power_usage": 50,
    "enflame_vgcu_power_consumption": 150,
    "enflame_vgcu_power_capability": 300,
    "enflame_vgcu_temperatures": 81,
    "enflame_vgcu_pcie_link_width": 8,
    "enflame_vgcu_clock": 1250,
    "enflame_vgcu_health": 2,
    "enflame_vgcu_ecc_single_bit_error_total_count": 12,
    "enflame_vgcu_ecc_double_bit_error_total_count": 2,
}


def test_every_gcu_exporter_metric_reads_what_the_library_says() -> None:
    port = free_port()

    async def main() -> None:
        extra = ["--resources=gcu,vgcu"]
        async with plugin_process.running_node(
            "vgcu-2card", args(port, *extra), pod_resources=True, efml=True
        ) as node:
            await eventually(
                lambda: values(scrape(port), "enflame_gcu_count") == [2], "a telemetry pass"
            )
            efmlsim.set_values(node.root, "card1", CARD1)
            await eventually(
                lambda: values(scrape(port), "enflame_gcu_usage", card="gcu1") == [61.5],
                "card1's new values",
            )
            samples = scrape(port)
            wrong = {}
            for name, want in CARD1_EXPECTED.items():
                got = values(samples, name, card="gcu1")
                if got != [want]:
                    wrong[name] = got
            for name, want in VGCU5_EXPECTED.items():
                got = values(samples, name, card="gcu1", vindex="5")
                if got != [want]:
                    wrong[name] = got
            assert wrong == {}
            assert values(samples, "enflame_gcu_cluster_usage", card="gcu1") == [10, 20]
            assert values(samples, "enflame_gcu_pg_usage", card="gcu1", pg="1") == [7]
            assert values(samples, "enflame_gcu_exporter_up") == [1]
            assert values(samples, "enflame_gcu_count") == [2]
            assert values(samples, "enflame_vgcu_count") == [8]
            [clock] = labelled(samples, "enflame_gcu_clock", card="gcu1")
            assert clock["power_mode"] == "suspend"
            [info] = labelled(samples, "enflame_gcu_info", card="gcu1")
            assert info["fw_version"] == "40.1.0" and info["dev_sn"] == "SN-TEST-1"
            assert info["slot"] == "OAM7" and info["pci_bus_id"] == "0000:83:00.0"
            assert info["UUID"].startswith("GCU-") and info["gpu"] == "1"
            temps = {
                d["sensor"]: v
                for d, v in zip(
                    labelled(samples, "enflame_gcu_temperature_celsius", card="gcu1"),
                    values(samples, "enflame_gcu_temperature_celsius", card="gcu1"),
                    strict=True,
                )
            }
            assert temps == {"asic": 81, "memory": 70, "board": 45}
            # The other card keeps its own readings.
            assert values(samples, "enflame_gcu_temperatures", card="gcu0") == [38]

            # The plugin's health is the health metric (gcu-exporter's was stubbed to 2).
            simulate.unplug(node.root, 1)
            await eventually(
                lambda: values(scrape(port), "enflame_gcu_health", card="gcu1") == [1],
                "gcu1 unhealthy in enflame_gcu_health",
            )
            [health] = labelled(scrape(port), "enflame_gcu_health", card="gcu1")
            assert "gone" in health["healthmsg"]

    asyncio.run(main())


def test_telemetry_names_the_pod_holding_the_card_and_the_vgcu() -> None:
    port = free_port()

    async def main() -> None:
        extra = ["--resources=gcu,vgcu"]
        async with plugin_process.running_node(
            "vgcu-2card", args(port, *extra), pod_resources=True, efml=True
        ) as node:
            await node.kubelet.wait_for(
                lambda k: len(k.free("enflame.com/vgcu")) == 8, 10, "the vGCUs listed"
            )
            given = await node.kubelet.allocate_pod(
                "trainer", {"main": 1}, resource="enflame.com/vgcu", namespace="ml"
            )
            [vgcu] = given["main"].device_ids
            index = vgcu.removeprefix("vgcu")

            def held() -> list[dict[str, str]]:
                return labelled(
                    scrape(port), "enflame_gcu_allocation_info", device=vgcu, pod_name="trainer"
                )

            await eventually(held, "the vGCU's holder on allocation_info")
            [labels] = held()
            assert (labels["pod_namespace"], labels["container_name"]) == ("ml", "main")
            card = labels["card"]
            samples = scrape(port)
            # The telemetry joins the holder on (card, Hostname): one series per card and per
            # vGCU, whoever holds them, and none carries holder labels.
            [usage] = labelled(samples, "enflame_vgcu_usage", vindex=index)
            assert usage["card"] == card and labels["Hostname"] == usage["Hostname"]
            for name in ("enflame_gcu_usage", "enflame_gcu_temperatures", "enflame_vgcu_usage"):
                found = labelled(samples, name)
                assert found and not any(set(card_metrics.POD_LABELS) & set(f) for f in found)
            assert len(labelled(samples, "enflame_gcu_usage", card=card)) == 1
            # The Prometheus Operator's target labels are not ours: nothing to overwrite.
            assert not {"namespace", "pod", "container"} & set(labels)

    asyncio.run(main())


def test_a_failing_and_a_hung_card_drop_out_with_a_reason_and_the_rest_goes_on() -> None:
    port = free_port()

    async def main() -> None:
        async with plugin_process.running_node(
            "vendor-8card", args(port), pod_resources=True, efml=True
        ) as node:
            await eventually(
                lambda: len(values(scrape(port), "enflame_gcu_temperatures")) == 8, "8 cards"
            )
            efmlsim.set_values(node.root, "card2", {"fail": "254"})
            efmlsim.set_values(node.root, "card5", {"hang": "1"})

            def errors() -> dict[str, str]:
                samples = scrape(port)
                found = labelled(samples, "enflame_gcu_telemetry_card_error")
                ones = values(samples, "enflame_gcu_telemetry_card_error")
                return {d["card"]: d["reason"] for d, v in zip(found, ones, strict=True) if v == 1}

            await eventually(lambda: len(errors()) == 2, "two cards left out")
            gone = errors()
            assert sorted(gone.values()) == ["EFML_ERROR_FAIL", "timeout"]
            samples = scrape(port)
            read = {d["card"] for d in labelled(samples, "enflame_gcu_temperatures")}
            assert len(read) == 6 and not read & set(gone)
            # A scrape never waits on the hung card (its call never returns while "hang" is
            # set, so a scrape that waited would time out); allocation goes on.
            scrape(port)
            given = await node.kubelet.allocate_pod("p", {"main": 2})
            assert len(given["main"].device_ids) == 2
            log = node.plugin.log_text()
            assert "left out of telemetry" in log and "EFML_ERROR_FAIL" in log
            # Both come back once the faults clear.
            efmlsim.set_values(node.root, "card2", {"fail": None})
            efmlsim.set_values(node.root, "card5", {"hang": None})
            await eventually(lambda: not errors(), "both cards back")
            assert len(values(scrape(port), "enflame_gcu_temperatures")) == 8

    asyncio.run(main())


def test_without_libefml_telemetry_is_off_with_one_log_line_and_the_plugin_serves() -> None:
    port = free_port()

    async def main() -> None:
        async with plugin_process.running_node("vendor-8card", args(port)) as node:
            await eventually(
                lambda: values(scrape(port), "enflame_gcu_exporter_up") == [0], "exporter_up 0"
            )
            await asyncio.sleep(1.0)  # several passes
            samples = scrape(port)
            assert not values(samples, "enflame_gcu_temperatures")
            assert values(samples, "enflame_gcu_cards", health="Healthy") == [8]
            given = await node.kubelet.allocate_pod("p", {"main": 1})
            assert len(given["main"].device_ids) == 1
            log = node.plugin.log_text()
            assert log.count("card telemetry off") == 1
            assert "EFML_ERROR_LIBRARY_NOT_FOUND" in log

    asyncio.run(main())


def test_telemetry_interval_zero_turns_the_families_off() -> None:
    port = free_port()

    async def main() -> None:
        extra = [f"--metrics-port={port}", "--telemetry-interval=0"]
        async with plugin_process.running_node("vendor-8card", extra, efml=True):
            samples = scrape(port)
            assert values(samples, "enflame_gcu_cards", health="Healthy") == [8]
            assert not values(samples, "enflame_gcu_exporter_up")

    asyncio.run(main())
