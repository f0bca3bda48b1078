"""One card's readings in one pass over libefml (the unit a collector bounds in time).

A call the library does not support leaves its reading ``None`` (gcu-exporter's -1); any other
error ends the card's pass and is raised, so the caller drops the card with that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from enflame_gcu.efml import library
from enflame_gcu.errors import EfmlNotSupported

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class VgcuReading:
    """One vGCU of a card."""

    index: int
    usage: float | None
    memory: library.Memory | None


@dataclass(frozen=True, slots=True)
class CardReading:
    """Everything read from one card; ``None`` where the library does not support the call."""

    index: int
    identity: library.Identity
    uuid: str | None
    serial: str | None
    firmware: str | None
    slot: str | None
    sku: str | None
    arch: int | None
    memory: library.Memory | None
    usage: float | None
    sip_usage: float | None
    cluster_usages: tuple[float, ...] | None
    pg_usages: tuple[float, ...] | None
    clocks: library.Clocks | None
    power_mode: int | None
    temperatures: library.Temperatures | None
    power: library.Power | None
    ecc: library.Ecc | None
    pcie_link: library.PcieLink | None
    pcie_throughput: library.PcieThroughput | None
    virt_mode: int | None
    vgcus: tuple[VgcuReading, ...]


def optional(call: Callable[[], T]) -> T | None:
    """``call()``, or None when the library does not support it."""
    try:
        return call()
    except EfmlNotSupported:
        return None


def read_card(lib: library.Library, index: int) -> CardReading:
    """Read card ``index``; raises the first error other than "not supported"."""
    arch = optional(lambda: lib.hw_arch(index))
    vgcus = []
    for vgcu in optional(lambda: lib.vgcu_ids(index)) or ():
        vgcus.append(
            VgcuReading(
                vgcu,
                optional(lambda v=vgcu: lib.vgcu_usage(index, v)),  # type: ignore[misc]
                optional(lambda v=vgcu: lib.vgcu_memory(index, v)),  # type: ignore[misc]
            )
        )
    return CardReading(
        index=index,
        identity=lib.identity(index),
        uuid=optional(lambda: lib.text("EfmlGetDevUuid", index)),
        serial=optional(lambda: lib.text("EfmlGetDevSn", index)),
        firmware=optional(lambda: lib.text("EfmlGetFwVersion", index)),
        slot=optional(lambda: lib.text("EfmlGetDevSlotOamName", index)),
        sku=optional(lambda: lib.text("EfmlGetDevSKU", index)),
        arch=arch,
        memory=optional(lambda: lib.memory(index)),
        usage=optional(lambda: lib.usage(index)),
        sip_usage=optional(lambda: lib.sip_usage(index)),
        cluster_usages=optional(lambda: lib.cluster_usages(index)),
        pg_usages=optional(lambda: lib.pg_usages(index)),
        clocks=optional(lambda: lib.clocks(index)),
        power_mode=optional(lambda: lib.power_mode(index)),
        temperatures=optional(lambda: lib.temperatures(index, arch)),
        power=optional(lambda: lib.power(index)),
        ecc=optional(lambda: lib.ecc(index)),
        pcie_link=optional(lambda: lib.pcie_link(index)),
        pcie_throughput=optional(lambda: lib.pcie_throughput(index)),
        virt_mode=optional(lambda: lib.virt_mode(index)),
        vgcus=tuple(vgcus),
    )
