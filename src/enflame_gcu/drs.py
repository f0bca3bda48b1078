"""DRS cards as DRA partitionable devices: one counter set per card, a device per placeable
instance of each profile, and the whole card consuming every counter.

A card with DRS on is cut by the scheduler, not by a node config: its counter set
``gcu-<minor>-drs`` holds the card's compute ``slices`` and ``memory``; each profile
``<s>g.<m>gb`` that fits ``n`` times becomes ``n`` devices ``gcu-<minor>-<s>g-<m>gb-<k>``
consuming ``s`` slices and ``m`` GiB; the whole card ``gcu-<minor>`` consumes all of both. The
scheduler allocates a device only while its counters have room (partitionable devices, beta and
on by default from Kubernetes 1.36), so partitions pack onto a card and the whole card is
refused while any partition is held, and the other way round.

===============  =======  ==========================================================
attribute        type     value (partition devices)
===============  =======  ==========================================================
type             string   ``drs``
profile          string   ``1g.8gb``
parentIndex      int      minor of the card
(the card's)     ...      model, family, productID, driverVersion, PCI attributes
===============  =======  ==========================================================

Capacity of a partition: ``slices`` and ``memory`` (what it consumes). The whole card keeps its
``type: gcu`` device with ``drs: true``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from enflame_gcu import devices, efsmi, products, resourceslices

# One item of a DRS card selection (--drs of both programs): all, a card, a model or family.
SELECTION_ITEM = re.compile(r"(all|gcu\d+|[A-Za-z][A-Za-z0-9 ]{0,31})")


def selection_items(text: str) -> list[str]:
    """A ``--drs`` selection (``all``, or a comma list of cards ``gcu3``, models ``S60`` or
    families ``S``), one item each; ValueError naming an item that is none of them."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if not SELECTION_ITEM.fullmatch(item):
            raise ValueError(f"{item!r} is not 'all', a card (gcu3) or a model or family (S60, S)")
    return items


def selects(items: Sequence[str], card: devices.Card) -> bool:
    """The card is in the selection (by name, model, family, or ``all``)."""
    model = card.model.lower()
    family = products.product_family(card.model).lower()
    for item in (i.lower() for i in items):
        if item in ("all", card.name) or model == item or model.split()[:1] == [item]:
            return True
        if item == family:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Layout:
    """What DRS offers on one card: efsmi's index for it, its total slices, memory, profiles."""

    index: int
    slices: int
    memory_gib: int
    profiles: tuple[efsmi.Profile, ...]

    @classmethod
    def from_profiles(cls, index: int, profiles: Sequence[efsmi.Profile]) -> Layout:
        """A card's layout from its profile table (totals: the most any profile fills)."""
        usable = tuple(p for p in profiles if p.count > 0)
        return cls(
            index=index,
            slices=max((p.slices * p.count for p in usable), default=0),
            memory_gib=max((p.memory_gb * p.count for p in usable), default=0),
            profiles=usable,
        )

    def profile(self, name: str) -> efsmi.Profile | None:
        """The profile of that name, if the card offers it."""
        return next((p for p in self.profiles if p.name == name), None)


def counter_set_name(card: devices.Card) -> str:
    """The card's counter set: ``gcu-<minor>-drs``."""
    return f"{resourceslices.device_name('gcu', card.minor)}-drs"


def _counters(slices: int, memory_gib: int) -> dict[str, Any]:
    return {"slices": {"value": str(slices)}, "memory": {"value": f"{memory_gib}Gi"}}


def counter_set(card: devices.Card, layout: Layout) -> dict[str, Any]:
    """The card's ``sharedCounters`` entry."""
    return {"name": counter_set_name(card), "counters": _counters(layout.slices, layout.memory_gib)}


def card_devices(
    card: devices.Card,
    layout: Layout,
    driver_version: str | None,
    *,
    healthy: bool,
    options: resourceslices.PublishOptions,
) -> list[dict[str, Any]]:
    """The whole card (consuming everything) and one device per placeable profile instance."""
    exclusive = resourceslices.PublishOptions(
        shared_slices=0, unhealthy=options.unhealthy, devices_per_slice=options.devices_per_slice
    )
    whole = resourceslices.card_device(card, driver_version, healthy=healthy, options=exclusive)
    whole["attributes"]["drs"] = {"bool": True}
    whole["consumesCounters"] = [
        {
            "counterSet": counter_set_name(card),
            "counters": _counters(layout.slices, layout.memory_gib),
        }
    ]
    result = [whole]
    inherited = {
        key: value
        for key, value in whole["attributes"].items()
        if key not in ("type", "index", "shareable", "drs")
    }
    for profile in layout.profiles:
        for number in range(profile.count):
            device: dict[str, Any] = {
                "name": resourceslices.partition_name(card.minor, profile.name, number),
                "attributes": {
                    "type": {"string": "drs"},
                    "profile": {"string": profile.name},
                    "parentIndex": {"int": card.minor},
                    **inherited,
                },
                "capacity": {
                    "slices": {"value": str(profile.slices)},
                    "memory": {"value": f"{profile.memory_gb}Gi"},
                },
                "consumesCounters": [
                    {
                        "counterSet": counter_set_name(card),
                        "counters": _counters(profile.slices, profile.memory_gb),
                    }
                ],
            }
            if "taints" in whole:
                device["taints"] = [dict(taint) for taint in whole["taints"]]
            result.append(device)
    return result


def node_devices(
    inventory: devices.Inventory,
    healthy: Mapping[str, bool],
    options: resourceslices.PublishOptions,
    layouts: Mapping[str, Layout],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(devices, counter sets)`` of the node: DRS cards partitioned, the rest as before."""
    by_name = {card.name: card for card in inventory.usable_cards()}
    drs_cards = [by_name[name] for name in sorted(layouts, key=_minor) if name in by_name]
    published = resourceslices.node_devices(inventory, healthy, options)
    drs_names = {resourceslices.device_name("gcu", card.minor) for card in drs_cards}
    result = [device for device in published if device["name"] not in drs_names]
    sets = []
    for card in drs_cards:
        ok = healthy.get(card.name, False)
        if not ok and options.unhealthy != "taint":
            continue
        result.extend(
            card_devices(
                card, layouts[card.name], inventory.driver_version, healthy=ok, options=options
            )
        )
        sets.append(counter_set(card, layouts[card.name]))
    return result, sets


def _minor(name: str) -> int:
    return int(name.removeprefix("gcu")) if name.removeprefix("gcu").isdigit() else -1
