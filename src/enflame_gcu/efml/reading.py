"""One card's readings in one pass over libefml (the unit a collector bounds in time).

Calls are gated by the card's generation as the vendor's binding gates them: EfmlGetGcuVirtStatus
and EfmlGetDevTempV2 only on a GCU300 (V2 falling back to the legacy call when not supported).
Only the card's identity (EfmlGetDevInfo) is required: its error ends the card's pass and is
raised, so the caller drops the card with that reason. Every other call that fails leaves only its
reading ``None``: NOT_SUPPORTED silently (gcu-exporter's -1), any other error recorded in
:attr:`CardReading.errors` as ``(call, error name)`` for the per-call error counter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from enflame_gcu.efml import library, types
from enflame_gcu.errors import EfmlError, EfmlNotSupported, EfmlTimeout

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class VgcuReading:
    """One vGCU of a card."""

    index: int
    usage: float | None
    memory: library.Memory | None


@dataclass(frozen=True, slots=True)
class CardReading:
    """Everything read from one card; ``None`` where the call was not supported or failed."""

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
    max_clock: int | None = None
    # (call, error name) of each optional call that failed with something but NOT_SUPPORTED.
    errors: tuple[tuple[str, str], ...] = ()


def optional(call: Callable[[], T]) -> T | None:
    """``call()``, or None when the library does not support it."""
    try:
        return call()
    except EfmlNotSupported:
        return None


class _Optional:
    """Runs optional calls, keeping (call, error name) of each that failed for another reason."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def __call__(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except EfmlNotSupported:
            return None
        except EfmlTimeout:
            raise  # the card's worker is stuck: the whole card is out
        except EfmlError as exc:
            self.errors.append((exc.function, exc.name))
            return None


def read_card(lib: library.Library, index: int) -> CardReading:
    """Read card ``index``; raises only when its identity cannot be read."""
    identity = lib.identity(index)
    read = _Optional()
    arch = read(lambda: lib.hw_arch(index))
    gcu300 = arch == types.GCU300
    vgcus = []
    for vgcu in read(lambda: lib.vgcu_ids(index)) or ():
        vgcus.append(
            VgcuReading(
                vgcu,
                read(lambda v=vgcu: lib.vgcu_usage(index, v)),  # type: ignore[misc]
                read(lambda v=vgcu: lib.vgcu_memory(index, v)),  # type: ignore[misc]
            )
        )
    return CardReading(
        index=index,
        identity=identity,
        uuid=read(lambda: lib.text("EfmlGetDevUuid", index)),
        serial=read(lambda: lib.text("EfmlGetDevSn", index)),
        firmware=read(lambda: lib.text("EfmlGetFwVersion", index)),
        slot=read(lambda: lib.text("EfmlGetDevSlotOamName", index)),
        sku=read(lambda: lib.text("EfmlGetDevSKU", index)),
        arch=arch,
        memory=read(lambda: lib.memory(index)),
        usage=read(lambda: lib.usage(index)),
        sip_usage=read(lambda: lib.sip_usage(index)),
        cluster_usages=read(lambda: lib.cluster_usages(index)),
        pg_usages=read(lambda: lib.pg_usages(index)),
        clocks=read(lambda: lib.clocks(index)),
        power_mode=read(lambda: lib.power_mode(index)),
        temperatures=read(lambda: lib.temperatures(index, arch)),
        power=read(lambda: lib.power(index)),
        ecc=read(lambda: lib.ecc(index)),
        pcie_link=read(lambda: lib.pcie_link(index)),
        pcie_throughput=read(lambda: lib.pcie_throughput(index)),
        virt_mode=read(lambda: lib.virt_mode(index)) if gcu300 else None,
        vgcus=tuple(vgcus),
        max_clock=read(lambda: lib.max_clock(index)),
        errors=tuple(read.errors),
    )
