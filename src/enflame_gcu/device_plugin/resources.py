"""The resources one plugin process serves, and which card goes into which.

Rule (each card is in exactly one resource):

- a card whose driver exposes vGCU nodes is in vGCU mode: only its vGCUs are advertised
  (``enflame.com/vgcu``); the card is never handed out whole or as slices, even by a process that
  does not serve vGCUs, because a second plugin process may be handing out its vGCUs;
- otherwise, when ``shared-gcu`` is served and ``sharing.cards`` names the card (or is ``all``),
  the card is advertised as slices (``enflame.com/shared-gcu``);
- otherwise, when ``drs-gcu`` is served, the card is cut into DRS partitions per container
  (``enflame.com/drs-gcu``, gcushare's name): its compute slices are the devices;
- every other card is a whole card (``enflame.com/gcu``).

Each kind lists its devices with the card whose health they follow, chooses preferred sets, and
builds what Allocate gives a container through the one edits model (:mod:`enflame_gcu.edits`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from enflame_gcu import (
    allocation,
    devices,
    edits,
    health,
    products,
    sharing,
    topology,
    virtual,
)
from enflame_gcu.device_plugin import config as plugin_config
from enflame_gcu.errors import EfsmiError, EnflameError, InvalidRequestError

if TYPE_CHECKING:
    # drs-gcu only (efsmi, resourceslices): imported where a node serves it, not at start.
    from enflame_gcu.device_plugin import drs_instances

log = logging.getLogger(__name__)
efsmi_errors = (EfsmiError, OSError)


@dataclass(frozen=True, slots=True)
class Advertised:
    """One device of a resource: ID, the card it follows (None = itself) and NUMA node."""

    id: str
    card: str | None
    numa_node: int | None
    usable: bool = True


@dataclass(frozen=True, slots=True)
class Grant:
    """What Allocate gives one container, before translation to protobuf: one edits value
    (env, mounts, annotations, and the device nodes when DeviceSpecs are passed) plus the CDI
    names of the ``cdi-cri`` strategy."""

    edits: edits.ContainerEdits
    cdi_devices: tuple[str, ...] = ()


class DeviceKind(Protocol):
    """One resource's devices, policy and Allocate answer."""

    @property
    def inventory(self) -> devices.Inventory:
        """The discovery the devices come from."""
        ...

    @property
    def policy(self) -> allocation.AllocationPolicy:
        """How GetPreferredAllocation chooses."""
        ...

    @property
    def catalog(self) -> tuple[Advertised, ...]:
        """Every device of the resource, in advertising order."""
        ...

    def grant(self, ids: Sequence[str], config: plugin_config.PluginConfig) -> Grant:
        """Edits for one container holding ``ids`` (known, healthy, each once).

        Raises InvalidRequestError when ``ids`` break the kind's own rules, EnflameError when
        the node cannot give them (see :func:`_granted`).
        """
        ...


def health_of(kind: DeviceKind, report: health.HealthReport) -> dict[str, bool]:
    """``{device: healthy}``: a device follows its card and, when it is not the card itself
    (a vGCU), also its own discovery verdict, since the runtime refuses a broken vGCU node
    whatever its card says; a device without a card follows its discovery alone."""
    derived = report.for_derived({d.id: d.card for d in kind.catalog if d.card is not None})
    return {
        d.id: d.usable if d.card is None else derived[d.id] and (d.usable or d.card == d.id)
        for d in kind.catalog
    }


def explain(kind: DeviceKind, ids: Sequence[str]) -> str:
    """Why a chosen set is local, for the debug log: the closest topology level its cards
    share (PCIe switch, root port, NUMA node; the score table in :mod:`enflame_gcu.topology`)."""
    card_of = {d.id: d.card or d.id for d in kind.catalog}
    topo = topology.Topology.from_inventory(kind.inventory)
    cards = [c for c in dict.fromkeys(card_of.get(i, i) for i in ids) if c in topo.names]
    if len(cards) <= 1:
        return "one card" if cards else "no known card"
    places = [topo.placement(card) for card in cards]
    switches = sorted({p.switch for p in places})
    ports = sorted({p.port for p in places})
    nodes = sorted({p.numa for p in places})
    if len(switches) == 1:
        return f"one PCIe switch ({switches[0]})"
    if len(ports) == 1:
        return f"one root port ({ports[0]}) across {len(switches)} switches"
    if len(nodes) == 1:
        return f"one NUMA node ({nodes[0]}) across {len(ports)} root ports"
    return f"{len(nodes)} NUMA nodes ({', '.join(nodes)})"


def _granted(
    inventory: devices.Inventory,
    names: Sequence[str],
    config: plugin_config.PluginConfig,
    env: Mapping[str, str] | None = None,
) -> Grant:
    """The grant of device ``names``: each device-list strategy's naming, ``env`` on top, and
    the device nodes when DeviceSpecs are passed."""
    listed = edits.device_list(names, config.device_list_strategy)
    nodes: tuple[edits.DeviceNodeEdit, ...] = ()
    if config.pass_device_specs:
        try:
            nodes = edits.for_devices(inventory, names).device_nodes
        except InvalidRequestError as exc:
            # The IDs were fine; the node is not (e.g. /dev/gcuctl vanished).
            raise EnflameError(str(exc)) from exc
    merged_env = {**dict(listed.edits.env), **(env or {})}
    given = dataclasses.replace(listed.edits, env=tuple(merged_env.items()), device_nodes=nodes)
    return Grant(given, listed.cdi_devices)


@dataclass(frozen=True, slots=True)
class NamedDevices:
    """Whole cards or vGCUs: each device ID is a node name (``gcuN``/``vgcuN``)."""

    inventory: devices.Inventory
    policy: allocation.AllocationPolicy
    catalog: tuple[Advertised, ...]

    def grant(self, ids: Sequence[str], config: plugin_config.PluginConfig) -> Grant:
        """The devices themselves, named for the runtime by each device-list strategy."""
        return _granted(self.inventory, ids, config)


@dataclass(frozen=True, slots=True)
class SharedSlices:
    """Time-shared slices ``gcuN-sliceK``; a container gets each of its cards once."""

    inventory: devices.Inventory
    settings: sharing.SharingSettings
    slices_of: Mapping[str, int]
    catalog: tuple[Advertised, ...]
    policy: allocation.AllocationPolicy = field(default_factory=sharing.PackedPolicy)

    def grant(self, ids: Sequence[str], config: plugin_config.PluginConfig) -> Grant:
        """The slices' cards by minor (so the runtime injects exactly them) and the share env.

        The per-container cap and the slice IDs are checked here, once
        (AllocationError/InvalidRequestError).
        """
        given = sharing.grant(ids, self.slices_of, self.settings.max_slices_per_container)
        return _granted(self.inventory, given.cards, config, given.env())


DRS_ENV = "TOPS_VISIBLE_DEVICES"  # gcushare's: the container's instance, DRS-<uuid>


@dataclass(frozen=True, slots=True)
class DrsSlices:
    """DRS compute slices ``gcuN-sliceK``; a container's slices must be on one card and match
    a profile's size: Allocate creates that instance (see :mod:`.drs_instances`)."""

    inventory: devices.Inventory
    instances: drs_instances.DrsInstances
    catalog: tuple[Advertised, ...]
    policy: allocation.AllocationPolicy

    def grant(self, ids: Sequence[str], config: plugin_config.PluginConfig) -> Grant:
        """The card, ``TOPS_VISIBLE_DEVICES=DRS-<uuid>`` of the instance made for the IDs."""
        cards = sorted({sharing.parse_slice_id(i)[0] for i in ids})
        if len(cards) != 1:
            raise InvalidRequestError(
                f"DRS slices {', '.join(ids)} are on {len(cards)} cards; one partition lives "
                "on one card"
            )
        try:
            held = self.instances.acquire(cards[0], ids)
        except efsmi_errors as exc:
            raise EnflameError(f"cannot create the DRS instance on {cards[0]}: {exc}") from exc
        return _granted(self.inventory, cards, config, {DRS_ENV: f"DRS-{held.uuid}"})


@dataclass(frozen=True, slots=True)
class Assignment:
    """Which card went where, plus notes for the log (e.g. unknown cards in sharing.cards)."""

    whole: tuple[devices.Card, ...]
    shared: tuple[devices.Card, ...]
    vgcu_mode: tuple[devices.Card, ...]
    notes: tuple[str, ...] = ()
    drs: tuple[devices.Card, ...] = ()


def assign(inventory: devices.Inventory, config: plugin_config.PluginConfig) -> Assignment:
    """Put every card into exactly one resource (see the module docstring)."""
    partitioned = {v.parent_minor for v in inventory.vgcus if v.parent_minor is not None}
    by_ref = {card.name: card for card in inventory.cards}
    by_ref.update({card.bdf: card for card in inventory.cards})
    notes: list[str] = []
    wanted: set[str] | None = None
    if config.shared_cards is not None:
        wanted = set()
        for ref in config.shared_cards:
            card = by_ref.get(ref)
            if card is None:
                # One ConfigMap may serve many nodes: a card missing here is not an error.
                names = ", ".join(c.name for c in inventory.cards) or "none"
                notes.append(
                    f"sharing.cards names {ref}, which is not on this node (cards: {names})"
                )
            else:
                wanted.add(card.name)
    whole: list[devices.Card] = []
    shared: list[devices.Card] = []
    vgcu_mode: list[devices.Card] = []
    drs_cards: list[devices.Card] = []
    serving_shared = plugin_config.SHARED_GCU in config.resources
    serving_drs = plugin_config.DRS_GCU in config.resources
    if serving_drs:
        from enflame_gcu import drs  # noqa: PLC0415 - efsmi and resourceslices, drs-gcu only
    for card in inventory.cards:
        if card.minor in partitioned:
            vgcu_mode.append(card)
            if wanted is not None and card.name in wanted:
                notes.append(f"{card.name} is in vGCU mode; it is served as vGCUs, not as slices")
        elif serving_shared and (wanted is None or card.name in wanted):
            shared.append(card)
        elif serving_drs and drs.selects(drs.selection_items(config.drs), card):
            drs_cards.append(card)
        else:
            whole.append(card)
    return Assignment(tuple(whole), tuple(shared), tuple(vgcu_mode), tuple(notes), tuple(drs_cards))


def whole_cards(
    inventory: devices.Inventory, cards: Sequence[devices.Card], policy_name: str
) -> NamedDevices:
    """The whole-card kind over ``cards`` with the named topology policy."""
    policy = allocation.policy_by_name(policy_name, topology.Topology(cards))
    catalog = tuple(Advertised(c.name, c.name, c.numa_node, c.usable) for c in cards)
    return NamedDevices(inventory, policy, catalog)


def vgcus(inventory: devices.Inventory) -> NamedDevices:
    """Every vGCU, carrying its card's NUMA node; health follows the card when linked."""
    cards = {card.minor: card for card in inventory.cards}
    catalog = []
    for vgcu in inventory.vgcus:
        card = cards.get(vgcu.parent_minor) if vgcu.parent_minor is not None else None
        numa = card.numa_node if card is not None else None
        parent = card.name if card is not None else None
        catalog.append(Advertised(vgcu.name, parent, numa, vgcu.usable))
    policy = virtual.VgcuPolicy(
        virtual.parents(inventory), topology.Topology.from_inventory(inventory)
    )
    return NamedDevices(inventory, policy, tuple(catalog))


def shared_slices(
    inventory: devices.Inventory, cards: Sequence[devices.Card], settings: sharing.SharingSettings
) -> SharedSlices:
    """The slices of ``cards`` (count per card by settings), with the configured policy."""
    slices_of = {card.name: settings.slices_for(card.name, card.model) for card in cards}
    ids = sharing.slice_ids(((c.name, c.model) for c in cards), settings)
    numa = {card.name: card.numa_node for card in cards}
    catalog = tuple(
        Advertised(i, card, numa[card]) for i in ids for card in [sharing.parse_slice_id(i)[0]]
    )
    policy = sharing.policy_by_name(settings.policy, slices_of)
    return SharedSlices(inventory, settings, slices_of, catalog, policy)


def _settings_by_name(
    settings: sharing.SharingSettings, inventory: devices.Inventory
) -> sharing.SharingSettings:
    # slicesByCard may name cards by bus id; slices_for() looks them up by gcuN. slicesByModel
    # may spell a model as 0.1 did ("S60 48GB"); cards carry the one spelling (S60-48GB).
    names = {card.bdf: card.name for card in inventory.cards}
    by_card = {names.get(ref, ref): count for ref, count in settings.slices_by_card.items()}
    by_model = {products.canonical(name): n for name, n in settings.slices_by_model.items()}
    return sharing.SharingSettings(
        settings.slices,
        by_model,
        by_card,
        settings.policy,
        settings.max_slices_per_container,
    )


def drs_slices(
    inventory: devices.Inventory,
    cards: Sequence[devices.Card],
    instances: drs_instances.DrsInstances,
) -> DrsSlices:
    """The DRS slices of ``cards`` that efsmi can partition (the others are left out, logged)."""
    problems = instances.learn((c.name, c.bdf) for c in cards if c.name not in instances.layouts)
    for name, problem in sorted(problems.items()):
        log.warning("%s is not served as DRS slices: %s", name, problem)
    usable = [c for c in cards if c.name in instances.layouts]
    slices_of = {c.name: instances.layouts[c.name].slices for c in usable}
    catalog = tuple(
        Advertised(sharing.slice_id(card.name, index), card.name, card.numa_node)
        for card in usable
        for index in range(slices_of[card.name])
    )
    return DrsSlices(inventory, instances, catalog, sharing.PackedPolicy(slices_of))


def build(
    inventory: devices.Inventory,
    config: plugin_config.PluginConfig,
    instances: drs_instances.DrsInstances | None = None,
) -> tuple[dict[str, DeviceKind], Assignment]:
    """Every served kind (``{gcu|vgcu|shared-gcu|drs-gcu: kind}``) for a discovery, and the
    assignment; ``instances`` is required when drs-gcu is served."""
    placed = assign(inventory, config)
    kinds: dict[str, DeviceKind] = {}
    for kind in config.resources:
        if kind == plugin_config.GCU:
            kinds[kind] = whole_cards(inventory, placed.whole, config.allocation_policy)
        elif kind == plugin_config.VGCU:
            kinds[kind] = vgcus(inventory)
        elif kind == plugin_config.DRS_GCU:
            if instances is None:
                raise EnflameError("drs-gcu is served but no efsmi was configured")
            kinds[kind] = drs_slices(inventory, placed.drs, instances)
        else:
            settings = _settings_by_name(config.sharing, inventory)
            kinds[kind] = shared_slices(inventory, placed.shared, settings)
    return kinds, placed


def slice_counts(
    inventory: devices.Inventory, config: plugin_config.PluginConfig, placed: Assignment
) -> dict[str, int]:
    """``{card: slices}`` for each card served as shared slices (empty when none is)."""
    settings = _settings_by_name(config.sharing, inventory)
    return {card.name: settings.slices_for(card.name, card.model) for card in placed.shared}
