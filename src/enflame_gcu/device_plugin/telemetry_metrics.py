"""The card telemetry families: gcu-exporter's ``enflame_gcu_*`` / ``enflame_vgcu_*`` metrics and
ours, rendered at scrape time from the collector's last pass and the latest holders view.

Names and meanings are defined once, here (docs/metrics.md lists them with units and calls).
Labels follow dcgm-exporter (``gpu``, ``UUID``, ``pci_bus_id``, ``modelName``, ``Hostname``)
plus our ``card``; the holder is ``pod_namespace``/``pod_name``/``container_name`` (gcu-exporter's
own names), which the Prometheus Operator's target labels (``namespace``, ``pod``,
``container``, ``service``, ``endpoint``) can never overwrite. It is a label of
``enflame_gcu_allocation_info`` only (card_metrics.py), one series per held device: every family
here has one series per card (per vGCU for the vGCU families) whoever holds it, so a card shared
by six slice holders is not six copies of each gauge, and a count that must survive a change of
holder (ECC errors, PCIe NAKs) keeps its one series. The holder is joined on ``card`` (and
``node``/``Hostname``), as kube-state-metrics joins a pod's owner.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from enflame_gcu import devices, holders
from enflame_gcu.device_plugin import telemetry
from enflame_gcu.efml import reading, types

CARD_LABELS = ("card", "gpu", "UUID", "pci_bus_id", "modelName", "Hostname")
POD_LABELS = ("pod_namespace", "pod_name", "container_name")  # allocation_info's only
Value = Callable[[reading.CardReading], "float | None"]


@dataclass(frozen=True, slots=True)
class CardMetric:
    """One per-card family: name, help, and how to get its value from a reading."""

    name: str
    help: str
    value: Value
    vgcu: bool = False  # also emitted per vGCU with the parent card's value (gcu-exporter)
    counter: bool = False  # a Prometheus counter (its name ends in _total)


def _ratio(used: float, total: float) -> float:
    return used / total if total else 0.0


CARD_METRICS: tuple[CardMetric, ...] = (
    CardMetric(
        "enflame_gcu_usage",
        (
            "GCU (DTU) usage as EfmlGetDevDtuUsageAsync reports it; efml.h states no scale (the "
            "vendor's tools show percent)"
        ),
        lambda r: r.usage,
    ),
    CardMetric(
        "enflame_gcu_sip_usage",
        "SIP usage (EfmlGetDevSipUsage); absent where the library lacks the call",
        lambda r: r.sip_usage,
    ),
    CardMetric(
        "enflame_gcu_memory_total_bytes",
        "Device memory in bytes (EfmlGetDevMem)",
        lambda r: None if r.memory is None else r.memory.total_bytes,
    ),
    CardMetric(
        "enflame_gcu_memory_used_bytes",
        "Device memory used in bytes (EfmlGetDevMem, MiB x 1048576)",
        lambda r: None if r.memory is None else r.memory.used_bytes,
    ),
    CardMetric(
        "enflame_gcu_memory_usage",
        "Device memory used as a 0-1 ratio (used / total)",
        lambda r: None if r.memory is None else _ratio(r.memory.used_bytes, r.memory.total_bytes),
    ),
    CardMetric(
        "enflame_gcu_power_consumption",
        (
            "Power drawn now as EfmlGetDevPwr reports it (efml.h states no unit; watts on the "
            "vendor's tools)"
        ),
        lambda r: None if r.power is None else r.power.consumption,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_power_capability",
        "Power cap as EfmlGetDevPwr reports it (same unit as power_consumption)",
        lambda r: None if r.power is None else r.power.capability,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_power_usage",
        "Power drawn as a percentage of the cap (0 when the cap is 0)",
        lambda r: (
            None if r.power is None else 100 * _ratio(r.power.consumption, r.power.capability)
        ),
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_temperatures",
        "ASIC temperature in degrees Celsius (EfmlGetDevTempV2, or EfmlGetDevTemp before GCU300)",
        lambda r: None if r.temperatures is None else r.temperatures.asic,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_ecc_single_bit_error_total_count",
        (
            "Corrected (single-bit) ECC errors since the driver loaded (EfmlGetDevEccStatus); a "
            "gauge under gcu-exporter's name, kept for compatibility: alert on the counter "
            "enflame_gcu_ecc_single_bit_errors_total"
        ),
        lambda r: None if r.ecc is None else r.ecc.single_bit,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_ecc_double_bit_error_total_count",
        (
            "Uncorrected (double-bit) ECC errors (EfmlGetDevEccStatus, else EfmlGetDevRmaDetails'"
            " dbe_count); gcu-exporter's gauge, kept for compatibility: alert on the counter "
            "enflame_gcu_ecc_double_bit_errors_total"
        ),
        lambda r: None if r.ecc is None else r.ecc.double_bit,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_ecc_enabled",
        "1 when ECC is on (EfmlGetDevEccStatus)",
        lambda r: None if r.ecc is None else int(r.ecc.enabled),
    ),
    CardMetric(
        "enflame_gcu_pcie_link_width",
        (
            "PCIe lanes in use now (EfmlGetPcieLinkInfo link_width; gcu-exporter reported the "
            "maximum here)"
        ),
        lambda r: None if r.pcie_link is None else r.pcie_link.width,
        vgcu=True,
    ),
    CardMetric(
        "enflame_gcu_pcie_max_link_width",
        "PCIe lanes the link can have (EfmlGetPcieLinkInfo max_link_width)",
        lambda r: None if r.pcie_link is None else r.pcie_link.max_width,
    ),
    CardMetric(
        "enflame_gcu_pcie_link_generation",
        "PCIe generation in use now, 1-5 (EfmlGetPcieLinkInfo link_speed)",
        lambda r: None if r.pcie_link is None else r.pcie_link.generation,
    ),
    CardMetric(
        "enflame_gcu_pcie_max_link_generation",
        "PCIe generation the link can have, 1-5",
        lambda r: None if r.pcie_link is None else r.pcie_link.max_generation,
    ),
    CardMetric(
        "enflame_gcu_pcie_tx_throughput",
        "PCIe transmit throughput as EfmlGetPcieThroughput reports it (efml.h states no unit)",
        lambda r: None if r.pcie_throughput is None else r.pcie_throughput.tx,
    ),
    CardMetric(
        "enflame_gcu_pcie_rx_throughput",
        "PCIe receive throughput as EfmlGetPcieThroughput reports it (efml.h states no unit)",
        lambda r: None if r.pcie_throughput is None else r.pcie_throughput.rx,
    ),
    CardMetric(
        "enflame_gcu_pcie_tx_naks_total",
        "PCIe transmit NAKs since the driver loaded (EfmlGetPcieThroughput tx_nak)",
        lambda r: None if r.pcie_throughput is None else r.pcie_throughput.tx_nak,
        counter=True,
    ),
    CardMetric(
        "enflame_gcu_pcie_rx_naks_total",
        "PCIe receive NAKs since the driver loaded (EfmlGetPcieThroughput rx_nak)",
        lambda r: None if r.pcie_throughput is None else r.pcie_throughput.rx_nak,
        counter=True,
    ),
    CardMetric(
        "enflame_gcu_ecc_single_bit_errors_total",
        "Corrected (single-bit) ECC errors since the driver loaded (EfmlGetDevEccStatus)",
        lambda r: None if r.ecc is None else r.ecc.single_bit,
        counter=True,
    ),
    CardMetric(
        "enflame_gcu_ecc_double_bit_errors_total",
        (
            "Uncorrected (double-bit) ECC errors since the driver loaded (EfmlGetDevEccStatus, "
            "else EfmlGetDevRmaDetails' dbe_count)"
        ),
        lambda r: None if r.ecc is None else r.ecc.double_bit,
        counter=True,
    ),
    CardMetric(
        "enflame_gcu_virt_mode",
        (
            "Virtualisation mode: 0 host, 1 vGCU, 2 mdev, 3 SR-IOV PF, 4 SR-IOV VF "
            "(EfmlGetGcuVirtStatus)"
        ),
        lambda r: r.virt_mode,
    ),
    CardMetric(
        "enflame_gcu_max_clock",
        "The DTU's maximum clock in MHz (EfmlGetMaxFreq; absent where the library lacks it)",
        lambda r: r.max_clock,
    ),
    CardMetric(
        "enflame_gcu_memory_clock",
        "HBM clock, probably MHz (EfmlGetDevClk cur_hbm_clock; efml.h states no unit)",
        lambda r: None if r.clocks is None else r.clocks.hbm,
    ),
)


def hostname() -> str:
    """The node's name: $NODE_NAME (the chart sets it from the pod's node) or the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class _Families:
    """The families of one scrape, created on first use so an empty pass yields none."""

    def __init__(self) -> None:
        self.found: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(  # noqa: PLR0917 (name, help, labels, values, value: the family's own order)
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        values: Sequence[str],
        value: float,
        counter: bool = False,
    ) -> None:
        family = self.found.get(name)
        if family is None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = self.found[name] = kind(name, doc, labels=list(labels))
        family.add_metric(list(values), value)


class TelemetryMetrics(Collector):
    """Yields the telemetry families from :attr:`collector`'s last pass and the holders view."""

    def __init__(
        self,
        collector: telemetry.TelemetryCollector,
        view: Callable[[], tuple[holders.NodeView | None, bool]],
        host: str | None = None,
    ) -> None:
        self.collector = collector
        self.view = view
        self.host = host or hostname()
        # The card families of the last (readings, view) content: compared by value, so a new
        # pass or holders view with the same content reuses them instead of rebuilding every
        # series; the per-pass families (timings, totals) are built on each scrape.
        self._cached: tuple[object, list[Metric]] | None = None

    def version(self) -> object:
        """What the families are rendered from, bar the holders view (the card collector's
        version covers it): the last pass, a new object per pass."""
        return self.collector.snapshot

    def describe(self) -> Iterator[Metric]:
        """No fixed description: the families depend on the cards."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """The families for one scrape (never calls libefml)."""
        snap = self.collector.snapshot
        node, known = self.view()
        by_bdf = {c.card.bdf: c for c in node.cards} if node is not None else {}
        yield from self._pass(snap, by_bdf)
        if not snap.up:
            return
        key = (snap.count, snap.cards, snap.failures, node, known)
        cached = self._cached
        if cached is not None and cached[0] == key:
            yield from cached[1]
            return
        families: list[Metric] = list(self._build(snap, node, known, by_bdf))
        self._cached = (key, families)
        yield from families

    def _pass(
        self, snap: telemetry.Snapshot, by_bdf: dict[str, holders.CardView]
    ) -> Iterator[Metric]:
        """What changes on every pass: up, timings, and the running totals."""
        out = _Families()
        host = [self.host]
        out.add(
            "enflame_gcu_exporter_up",
            (
                "1 when libefml is loaded and initialised (card telemetry on); 0 with the reason:"
                " not_collected_yet, no_library, init_failed:<error>, no_answer:<error>"
            ),
            ["Hostname", "reason"],
            [self.host, "" if snap.up else snap.cause or "unknown"],
            1 if snap.up else 0,
        )
        out.add(
            "enflame_gcu_telemetry_collection_seconds",
            "Seconds the last collection pass over every card took",
            ["Hostname"],
            host,
            snap.seconds,
        )
        out.add(
            "enflame_gcu_telemetry_last_collection_timestamp_seconds",
            "Unix time the last collection pass ended",
            ["Hostname"],
            host,
            snap.finished,
        )
        out.add(
            "enflame_gcu_telemetry_library_inits_total",
            "Times libefml was initialised (again after a driver reload or repeated node errors)",
            ["Hostname"],
            host,
            snap.inits,
            counter=True,
        )
        for kind, count in snap.events:
            out.add(
                "enflame_gcu_events_total",
                "libefml events (EfmlGetEvent, the XID analogue) by type",
                ["type", "Hostname"],
                [kind, self.host],
                count,
                counter=True,
            )
        for index, bdf, call, reason, count in snap.reading_errors:
            view = by_bdf.get(bdf)
            out.add(
                "enflame_gcu_telemetry_reading_errors_total",
                (
                    "Optional readings a libefml call refused (an error but NOT_SUPPORTED): only"
                    " that reading is left out, the card stays"
                ),
                ["card", "efml_index", "pci_bus_id", "call", "reason", "Hostname"],
                ["" if view is None else view.card.name, str(index), bdf, call, reason, self.host],
                count,
                counter=True,
            )
        readings = {card.identity.bdf: card for card in snap.cards}
        for bdf, joules in snap.energy:
            card = readings.get(bdf)
            if card is None:
                continue
            out.add(
                "enflame_gcu_energy_joules_total",
                (
                    "Energy in joules, integrated from EfmlGetDevPwr over the collection passes"
                    " (libefml has no energy counter; assumes the power reading is in watts)"
                ),
                CARD_LABELS,
                self._base(card, by_bdf.get(bdf)),
                joules,
                counter=True,
            )
        yield from out.found.values()

    def _build(
        self,
        snap: telemetry.Snapshot,
        node: holders.NodeView | None,
        known: bool,
        by_bdf: dict[str, holders.CardView],
    ) -> Iterator[Metric]:
        del node, known  # part of the cache key; the cards come through by_bdf, no holder
        out = _Families()
        host = [self.host]
        out.add(
            "enflame_gcu_count",
            "Cards libefml sees (EfmlGetDevCount)",
            ["Hostname"],
            host,
            snap.count,
        )
        vgcus = 0
        for card in snap.cards:
            view = by_bdf.get(card.identity.bdf)
            base = self._base(card, view)
            self._card(out, card, view, base)
            vgcus += len(card.vgcus)
            for vgcu in card.vgcus:
                self._vgcu(out, card, vgcu, view, base)
        out.add(
            "enflame_vgcu_count",
            "vGCUs libefml lists on this node (EfmlGetVdevList)",
            ["Hostname"],
            host,
            vgcus,
        )
        error_labels = ["card", "efml_index", "pci_bus_id", "UUID", "reason", "Hostname"]
        error_help = (
            "1 for a card left out of the last pass (its identity could not be read), with the "
            "libefml error (timeout: the call hung); 0 for a card that was read"
        )
        for failure in snap.failures:
            view = by_bdf.get(failure.bdf)
            name = view.card.name if view is not None else ""
            uuid = f"GCU-{failure.uuid}" if failure.uuid else ""
            values = [name, str(failure.index), failure.bdf, uuid, failure.reason, self.host]
            out.add("enflame_gcu_telemetry_card_error", error_help, error_labels, values, 1)
        for card in snap.cards:
            view = by_bdf.get(card.identity.bdf)
            values = [
                "" if view is None else view.card.name,
                str(card.index),
                card.identity.bdf,
                f"GCU-{card.uuid}" if card.uuid else "",
                "",
                self.host,
            ]
            out.add("enflame_gcu_telemetry_card_error", error_help, error_labels, values, 0)
        yield from out.found.values()

    def _base(self, card: reading.CardReading, view: holders.CardView | None) -> list[str]:
        inventory: devices.Card | None = None if view is None else view.card
        return [
            "" if inventory is None else inventory.name,
            str(inventory.minor if inventory is not None else card.identity.logic_id),
            f"GCU-{card.uuid}" if card.uuid else "",
            card.identity.bdf,
            inventory.model
            if inventory is not None
            else f"Enflame {card.sku or card.identity.name}",
            self.host,
        ]

    def _card(
        self,
        out: _Families,
        card: reading.CardReading,
        view: holders.CardView | None,
        base: list[str],
    ) -> None:
        labels = list(CARD_LABELS)
        info = ["slot", "dev_sn", "fw_version", "arch"]
        arch = "" if card.arch is None else types.HW_ARCH.get(card.arch, str(card.arch))
        out.add(
            "enflame_gcu_info",
            "Always 1; the card's identity as labels",
            [*CARD_LABELS, *info],
            [*base, card.slot or "N/A", card.serial or "", card.firmware or "", arch],
            1,
        )
        healthy = view is None or view.healthy
        message = "" if healthy else (view.reason if view is not None else "")
        values = base
        for metric in CARD_METRICS:
            value = metric.value(card)
            if value is not None:
                out.add(metric.name, metric.help, labels, values, value, metric.counter)
        if card.temperatures is not None:
            temps = {
                "asic": card.temperatures.asic,
                "memory": card.temperatures.mem,
                "board": card.temperatures.board,
            }
            for sensor, temp in temps.items():
                if temp is not None:
                    out.add(
                        "enflame_gcu_temperature_celsius",
                        "Temperature by sensor in degrees Celsius",
                        [*labels, "sensor"],
                        [*values, sensor],
                        temp,
                    )
        if card.clocks is not None:
            mode = (
                ""
                if card.power_mode is None
                else types.POWER_MODES.get(card.power_mode, str(card.power_mode))
            )
            out.add(
                "enflame_gcu_clock",
                (
                    "DTU clock, probably MHz (EfmlGetDevClk; efml.h states no unit), with the"
                    " power mode"
                ),
                [*labels, "power_mode"],
                [*values, mode],
                card.clocks.dtu,
            )
        out.add(
            "enflame_gcu_health",
            "2 healthy, 1 unhealthy (the plugin's health check), with its message",
            [*labels, "healthmsg"],
            [*values, message],
            2 if healthy else 1,
        )
        for name, usages, key in (
            ("enflame_gcu_cluster_usage", card.cluster_usages, "cluster"),
            ("enflame_gcu_pg_usage", card.pg_usages, "pg"),
        ):
            for number, usage in enumerate(usages or ()):
                out.add(
                    name,
                    f"Usage per {key} as the library reports it (scale unstated)",
                    [*labels, key],
                    [*values, str(number)],
                    usage,
                )

    def _vgcu(
        self,
        out: _Families,
        card: reading.CardReading,
        vgcu: reading.VgcuReading,
        view: holders.CardView | None,
        base: list[str],
    ) -> None:
        labels = [*CARD_LABELS, "vindex"]
        values = [*base, str(vgcu.index)]
        for metric in CARD_METRICS:
            value = metric.value(card) if metric.vgcu else None
            if value is not None:
                out.add(
                    metric.name.replace("enflame_gcu_", "enflame_vgcu_"),
                    f"The parent card's {metric.name}",
                    labels,
                    values,
                    value,
                )
        if vgcu.usage is not None:
            out.add(
                "enflame_vgcu_usage",
                "vGCU usage as EfmlGetVdevDtuUsage reports it (scale unstated)",
                labels,
                values,
                vgcu.usage,
            )
        if vgcu.memory is not None:
            memory = vgcu.memory
            out.add(
                "enflame_vgcu_memory_total_bytes",
                "vGCU memory in bytes (EfmlGetVdevMem)",
                labels,
                values,
                memory.total_bytes,
            )
            out.add(
                "enflame_vgcu_memory_used_bytes",
                "vGCU memory used in bytes (EfmlGetVdevMem)",
                labels,
                values,
                memory.used_bytes,
            )
            out.add(
                "enflame_vgcu_memory_usage",
                "vGCU memory used as a 0-1 ratio",
                labels,
                values,
                _ratio(memory.used_bytes, memory.total_bytes),
            )
        healthy = view is None or view.healthy
        message = "" if healthy or view is None else view.reason
        out.add(
            "enflame_vgcu_health",
            "The parent card's health: 2 healthy, 1 unhealthy",
            [*labels, "healthmsg"],
            [*values, message],
            2 if healthy else 1,
        )
        if card.clocks is not None:
            out.add(
                "enflame_vgcu_clock",
                "The parent card's DTU clock",
                labels,
                values,
                card.clocks.dtu,
            )
