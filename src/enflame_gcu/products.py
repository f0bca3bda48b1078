"""Enflame product names by PCI device id (from the public pci.ids database, SPEC §2)."""

from __future__ import annotations

import re

# One spelling everywhere (enflame-ctk info, node labels, metrics, DRA attributes, sharing
# config): pci.ids' names with each run of spaces and brackets turned into "-", so the name is
# also a valid Kubernetes label value. A config that still says "S60 48GB" is read as S60-48GB.
PRODUCT_NAMES: dict[int, str] = {
    0x0001: "T10",
    0x0002: "T11",
    0x0003: "T10-QSFP-DD",
    0x0021: "T20-32GB",
    0x0022: "T20-64GB",
    0x0023: "T21-32GB",
    0x0024: "T21-64GB",
    0x8001: "I20",
    0x8011: "I10",
    0x8012: "I10L",
    0x8031: "S6",
    0x8032: "S6-24GB",
    0xC031: "S30",
    0xC032: "S90-48GB",
    0xC033: "S60G-48GB",
    0xC035: "S60-48GB",
    0xC041: "L300",
    0xC042: "L600",
}
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_.-]+")


def canonical(name: str) -> str:
    """A model name in our one spelling: ``S60 48GB`` and ``T10 (QSFP-DD)`` -> ``S60-48GB``,
    ``T10-QSFP-DD``; already canonical names come back unchanged."""
    return _NOT_IN_NAMES.sub("-", name).strip("-_.")


def product_name(device_id: int) -> str:
    """Model name for a PCI device id; unknown ids get a generic name, never an error."""
    return PRODUCT_NAMES.get(device_id, f"Enflame-GCU-device-0x{device_id:04x}")


def product_family(model: str) -> str:
    """Family of a model name: the leading letters (``T20-32GB`` -> ``T``); generic -> ``GCU``."""
    match = re.match(r"^([A-Z]+)\d", model)
    return match.group(1) if match else "GCU"


_MEMORY = re.compile(r"(\d+)GB\b")


def memory_mib(model: str) -> int | None:
    """Card memory from the model name (``S60-48GB`` -> 49152); None when the name has none."""
    match = _MEMORY.search(model)
    return int(match.group(1)) * 1024 if match else None
