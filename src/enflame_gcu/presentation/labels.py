"""Node labels for feature discovery (SPEC §4): what a node's GCUs are, as Kubernetes labels.

Written as a Node Feature Discovery "local" feature file (one ``name=value`` per line), so NFD
puts them on the node; the device plugin manifests schedule on ``enflame.com/gcu.present``.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Collection, Mapping

from enflame_gcu import devices, products

PREFIX = "enflame.com/gcu"
MIXED = "mixed"
_VALUE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """``text`` as a valid label value: allowed characters only, alphanumeric ends, ≤ 63."""
    value = _VALUE_CHARS.sub("-", text).strip("-_.")
    return value[:63].rstrip("-_.")


def for_inventory(
    inventory: devices.Inventory,
    healthy: Collection[str] | None = None,
    *,
    slices: Mapping[str, int] | None = None,
    node_mode: str | None = None,
) -> dict[str, str]:
    """The labels for a node; a node without cards gets only ``present=false``.

    ``model``, ``family`` and ``memory`` describe the node's cards when they all agree and
    say ``mixed`` (memory: omitted) when they do not. ``count`` is the cards present, which
    stays put while a card is unhealthy or unplugged; ``count.healthy`` the usable ones, or
    those named in ``healthy`` when a health monitor gives its current verdicts. With
    ``slices`` (``{card: slices}`` of the shared cards, as the device plugin serves them) come
    ``sharing-strategy`` (``time-slicing`` or ``none``) and ``replicas`` (slices per shared card,
    the fewest when they differ; 1 when none is shared), as GPU feature discovery names them;
    with ``node_mode`` the node's mode (``node-mode``).
    """
    cards = inventory.cards
    if not cards:
        return {f"{PREFIX}.present": "false"}
    models = collections.Counter(card.model for card in cards)
    model = next(iter(models)) if len(models) == 1 else None
    result = {
        f"{PREFIX}.present": "true",
        f"{PREFIX}.count": str(len(cards)),
        f"{PREFIX}.count.healthy": str(
            len(inventory.usable_cards())
            if healthy is None
            else sum(1 for card in cards if card.name in healthy)
        ),
        f"{PREFIX}.model": label_value(model) if model else MIXED,
        f"{PREFIX}.family": label_value(products.product_family(model)) if model else MIXED,
    }
    memory = products.memory_mib(model) if model else None
    if memory is not None:
        result[f"{PREFIX}.memory"] = str(memory)
    if inventory.driver_version:
        result[f"{PREFIX}.driver.version"] = label_value(inventory.driver_version)
    if inventory.vgcus:
        result[f"{PREFIX}.vgcu.count"] = str(sum(1 for v in inventory.vgcus if v.usable))
    if slices is not None:
        result[f"{PREFIX}.sharing-strategy"] = "time-slicing" if slices else "none"
        result[f"{PREFIX}.replicas"] = str(min(slices.values(), default=1))
    if node_mode:
        result[f"{PREFIX}.node-mode"] = label_value(node_mode)
    return result


def feature_file(labels: dict[str, str]) -> str:
    """The NFD local feature file text for ``labels``."""
    return "".join(f"{name}={value}\n" for name, value in sorted(labels.items()))
