"""A node's GCU state for the scheduler extender: which cards are free, where they sit, and
free slices; its schema and its transport, in one place for the writer and the reader.

Transport: one ``coordination.k8s.io/v1`` Lease per node in the namespace of the device plugin
and the extender (:func:`lease`), named as the node and held by it (``spec.holderIdentity``),
its state in the annotation ``enflame.com/gcu-node-state`` and its heartbeat in
``spec.renewTime``. The device plugin (:mod:`enflame_gcu.device_plugin.node_annotation`) writes
the annotation only when the state changes and otherwise renews ``renewTime`` alone (a merge
patch of one field, :func:`heartbeat`); the extender's cache reads only these Leases
(:func:`from_lease`), never the Node. A Lease, as the kubelet's own node heartbeat since
Kubernetes 1.14: small, read by no one but the extender (no node-local agent watches Leases in
this namespace, while many watch every Node), and boundable per node where the cluster can
enforce it (the chart's ValidatingAdmissionPolicy: a Lease's name must be its writer's node).
The state's text, one JSON object, compact, keys sorted so that equal states give equal text::

    {"version": 2,
     "observed": 1796000000.0,
     "cards":  [{"name": "gcu0", "minor": 0, "switch": "...", "port": "...", "numa": "numa0",
                 "free": false, "pod": "namespace/name"}, ...],
     "shared": [{"name": "gcu3", "minor": 3, "slices": 6, "free": 4,
                 "pods": {"namespace/name": 2}}, ...],
     "sharing": {"policy": "packed", "maxSlicesPerContainer": 0},
     "pods":   ["namespace/name", ...]}

``cards`` lists every whole card the plugin serves (free or not: group sizes need them all);
``free`` is healthy and held by no container. ``switch``, ``port`` and ``numa`` are the card's
group keys (:class:`topology.Placement`), equal keys meaning the same group. ``shared`` lists the
cards served as ``enflame.com/shared-gcu`` slices with their slice count and free slices (0
while the card is unhealthy). ``pods`` are the pods the kubelet reports holding any of the
node's devices, so a reader can tell which bound pods the state already counts. A healthy card
held by one pod names it (``pod``), and a healthy shared card its pods' slice counts (``pods``):
a reader that sees a pod end before the plugin's next read knows exactly which cards and slices
it gave back (both optional: absent on unhealthy cards, and from writers before they existed).
``sharing`` is the plugin's slice policy (:data:`sharing.SLICE_POLICIES`) and its per-container
cap (0: none), so a reader replays exactly the choice the plugin will make. ``observed`` is when
the plugin read who holds what (seconds since the epoch, the plugin's clock); on a Lease the
reader takes it from ``renewTime`` instead, which the plugin renews even when nothing changed,
so a reader can tell a silent plugin from a quiet node.

On the Node itself the plugin keeps only the vendor's gcushare annotation
``enflame.com/gcu-shared-capacity`` (card minor -> free slices, e.g. ``{"3": 4}``) when the node
shares cards, for gcushare's tools, written when it changes.

A reader refuses anything else with :class:`NodeStateError` naming what is wrong: an unknown
``version`` (a newer plugin than the extender) is refused, never guessed at.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu import devices, holders, sharing, topology
from enflame_gcu.errors import NodeStateError

ANNOTATION = "enflame.com/gcu-node-state"
SHARED_CAPACITY_ANNOTATION = "enflame.com/gcu-shared-capacity"
VERSION = 2  # 2: ``observed`` and ``sharing`` (version 1 had neither)
# Bounds a reader holds any annotation to: a node has a few dozen cards, not thousands.
MAX_TEXT = 256 * 1024
MAX_CARDS = 256
MAX_PODS = 4096
MAX_KEY = 253
# The Lease's labels: the extender lists and watches only Leases carrying them.
LEASE_LABELS = {"app.kubernetes.io/name": "enflame-gcu-node-state"}
LEASE_SELECTOR = "app.kubernetes.io/name=enflame-gcu-node-state"
LEASE_DURATION = 180  # seconds: the extender's default --state-max-age (informational)
_CARD = re.compile(r"^gcu(\d{1,6})$")
# Equal card layouts share one small number, so a reader's caches hash an int, not 8 places.
MAX_SHAPES = 4096
_shapes: dict[tuple[topology.Placement, ...], int] = {}
_shape_list: list[tuple[topology.Placement, ...]] = []
_shape_lock = threading.Lock()


def shape_id(places: tuple[topology.Placement, ...]) -> int:
    """A small number naming a card layout (-1 once ``MAX_SHAPES`` layouts are known)."""
    found = _shapes.get(places)
    if found is not None:
        return found
    with _shape_lock:
        if places not in _shapes:
            if len(_shape_list) >= MAX_SHAPES:
                return -1
            _shapes[places] = len(_shape_list)
            _shape_list.append(places)
        return _shapes[places]


def shape(number: int) -> tuple[topology.Placement, ...]:
    """The card layout :func:`shape_id` named ``number``."""
    return _shape_list[number]


@dataclass(frozen=True, slots=True)
class CardState:
    """One whole card: its group keys and whether it is free."""

    name: str
    minor: int
    switch: str
    port: str
    numa: str
    free: bool
    holder: str = ""  # the pod (``namespace/name``) holding the card, when healthy and held

    @property
    def placement(self) -> topology.Placement:
        """The card's place, as the allocation policy sees it."""
        return topology.Placement(self.name, self.minor, self.numa, self.port, self.switch)


@dataclass(frozen=True, slots=True)
class SharedCard:
    """One card served as slices: how many it has and how many are free."""

    name: str
    minor: int
    slices: int
    free: int
    holders: tuple[tuple[str, int], ...] = ()  # (pod, slices it holds), pods sorted; healthy only


@dataclass(frozen=True, slots=True)
class NodeState:
    """What one node's annotation says."""

    cards: tuple[CardState, ...] = ()
    shared: tuple[SharedCard, ...] = ()
    pods: frozenset[str] = frozenset()
    policy: str = "packed"
    max_per_container: int = 0
    observed: float = 0.0
    # Derived once (a reader scores every node on every scheduling call): the names of the
    # free whole cards, and every whole card's place in minor order (hashable: a cache key).
    free: frozenset[str] = field(init=False, compare=False, repr=False)
    placements: tuple[topology.Placement, ...] = field(init=False, compare=False, repr=False)
    shape: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        places = tuple(c.placement for c in self.cards)
        object.__setattr__(self, "free", frozenset(c.name for c in self.cards if c.free))
        object.__setattr__(self, "shape", shape_id(places))
        object.__setattr__(self, "placements", shape(self.shape) if self.shape >= 0 else places)

    def to_json(self) -> str:
        """The annotation's text."""
        document = {
            "version": VERSION,
            "observed": round(self.observed, 3),
            "sharing": {"policy": self.policy, "maxSlicesPerContainer": self.max_per_container},
            "cards": [
                {
                    "name": c.name,
                    "minor": c.minor,
                    "switch": c.switch,
                    "port": c.port,
                    "numa": c.numa,
                    "free": c.free,
                    **({"pod": c.holder} if c.holder else {}),
                }
                for c in self.cards
            ],
            "shared": [
                {
                    "name": s.name,
                    "minor": s.minor,
                    "slices": s.slices,
                    "free": s.free,
                    **({"pods": dict(s.holders)} if s.holders else {}),
                }
                for s in self.shared
            ],
            "pods": sorted(self.pods),
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    def released(self, pods: Iterable[str]) -> NodeState:
        """This state as it will be once ``pods`` (``namespace/name`` it lists) have given their
        cards and slices back: each healthy card one of them held is free, each shared card
        gets their slices back. Pods it does not list change nothing."""
        gone = self.pods & set(pods)
        if not gone:
            return self
        cards = tuple(
            dataclasses.replace(c, free=True, holder="") if c.holder in gone else c
            for c in self.cards
        )
        shared = tuple(
            dataclasses.replace(
                s,
                free=min(s.slices, s.free + sum(n for pod, n in s.holders if pod in gone)),
                holders=tuple((pod, n) for pod, n in s.holders if pod not in gone),
            )
            if any(pod in gone for pod, _ in s.holders)
            else s
            for s in self.shared
        )
        return dataclasses.replace(self, cards=cards, shared=shared, pods=self.pods - gone)

    def shared_capacity(self) -> str | None:
        """The gcushare annotation's text (minor -> free slices), None without shared cards."""
        if not self.shared:
            return None
        return json.dumps({str(s.minor): s.free for s in self.shared}, sort_keys=True)


def build(
    inventory: devices.Inventory,
    holdings: Iterable[holders.Holding],
    *,
    whole: Sequence[str],
    shared: Mapping[str, int],
    health: Mapping[str, tuple[bool, str]] | None = None,
    resources: Iterable[str] = holders.DEFAULT_RESOURCES,
    settings: sharing.SharingSettings | None = None,
    observed: float = 0.0,
) -> NodeState:
    """The state of a node: ``whole`` names the cards served whole, ``shared`` maps the cards
    served as slices to their slice counts; ``health`` as for :func:`holders.build`;
    ``settings`` the plugin's slice policy and cap; ``observed`` when ``holdings`` were read."""
    settings = settings or sharing.SharingSettings()
    view = holders.build(inventory, holdings, resources=resources, health=health)
    by_name = {card_view.card.name: card_view for card_view in view.cards}
    cards = []
    for name in sorted(whole, key=_minor):
        card_view = by_name.get(name)
        if card_view is None:
            continue
        place = topology.placement(card_view.card)
        free = card_view.healthy and card_view.free
        held_by = {f"{h.namespace}/{h.pod}" for h in card_view.holders}
        holder = next(iter(held_by)) if card_view.healthy and len(held_by) == 1 else ""
        cards.append(
            CardState(name, place.minor, place.switch, place.port, place.numa, free, holder)
        )  # fmt: skip
    sliced = []
    for name in sorted(shared, key=_minor):
        card_view = by_name.get(name)
        if card_view is None:
            continue
        held = len({h.device for h in card_view.holders})
        left = max(0, shared[name] - held) if card_view.healthy else 0
        per_pod: dict[str, set[str]] = {}
        for h in card_view.holders:
            per_pod.setdefault(f"{h.namespace}/{h.pod}", set()).add(h.device)
        slices_held = (
            tuple(sorted((pod, len(held)) for pod, held in per_pod.items()))
            if card_view.healthy and held <= shared[name]
            else ()
        )
        sliced.append(SharedCard(name, card_view.card.minor, shared[name], left, slices_held))
    pods = frozenset(f"{h.namespace}/{h.pod}" for v in view.cards for h in v.holders)
    pods |= {f"{h.namespace}/{h.pod}" for h in view.unplaced}
    return NodeState(
        tuple(cards),
        tuple(sliced),
        pods,
        settings.policy,
        settings.max_slices_per_container,
        observed,
    )


def _minor(name: str) -> tuple[int, str]:
    match = _CARD.match(name)
    return (int(match.group(1)) if match else 1 << 30, name)


def parse(text: str) -> NodeState:
    """Read an annotation's text; NodeStateError says what is wrong with it."""
    if len(text) > MAX_TEXT:
        raise NodeStateError(f"node state is {len(text)} bytes, more than {MAX_TEXT}")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NodeStateError(f"node state is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise NodeStateError(f"node state is a JSON {type(document).__name__}, not an object")
    version = document.get("version")
    if version != VERSION:
        raise NodeStateError(
            f"node state version {version!r} is not known to this reader (knows {VERSION}); "
            "is the device plugin newer than the extender?"
        )
    cards = _list(document, "cards", MAX_CARDS)
    shared = _list(document, "shared", MAX_CARDS)
    pods = _list(document, "pods", MAX_PODS)
    observed = document.get("observed")
    if isinstance(observed, bool) or not isinstance(observed, (int, float)) or observed < 0:
        raise NodeStateError(f"node state observed is {observed!r:.80}, not seconds since 1970")
    settings = _object(document.get("sharing"), "sharing", {"policy", "maxSlicesPerContainer"})
    policy = settings["policy"]
    if policy not in sharing.SLICE_POLICIES:
        raise NodeStateError(
            f"node state sharing.policy is {policy!r:.80}, not one this reader replays "
            f"({', '.join(sharing.SLICE_POLICIES)})"
        )
    state = NodeState(
        tuple(_card(item, i) for i, item in enumerate(cards)),
        tuple(_shared(item, i) for i, item in enumerate(shared)),
        frozenset(_text(item, f"pods[{i}]") for i, item in enumerate(pods)),
        policy,
        _count(settings["maxSlicesPerContainer"], "sharing.maxSlicesPerContainer", 1 << 12),
        float(observed),
    )
    for what, names in (("cards", [c.name for c in state.cards]),
                        ("shared", [s.name for s in state.shared])):  # fmt: skip
        if len(set(names)) != len(names):
            raise NodeStateError(f"node state lists a card twice in {what}: {sorted(names)}")
    holders = [(f"{c.name}.pod", c.holder) for c in state.cards if c.holder]
    holders += [(f"{s.name}.pods", pod) for s in state.shared for pod, _ in s.holders]
    for where, pod in holders:
        if pod not in state.pods:
            raise NodeStateError(f"node state {where} names {pod!r:.80}, which pods does not list")
    return state


def _list(document: Mapping[str, Any], key: str, limit: int) -> list[Any]:
    value = document.get(key, [])
    if not isinstance(value, list):
        raise NodeStateError(f"node state {key!r} is a {type(value).__name__}, not a list")
    if len(value) > limit:
        raise NodeStateError(f"node state {key!r} has {len(value)} entries, more than {limit}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY:
        raise NodeStateError(f"node state {where} is {value!r:.80}, not a short non-empty string")
    return value


def _count(value: Any, where: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise NodeStateError(f"node state {where} is {value!r:.80}, not an integer 0..{top}")
    return value


def _object(item: Any, where: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(item, dict):
        raise NodeStateError(f"node state {where} is a {type(item).__name__}, not an object")
    missing = keys - set(item)
    if missing:
        raise NodeStateError(f"node state {where} lacks {', '.join(sorted(missing))}")
    return item


def _card(item: Any, index: int) -> CardState:
    where = f"cards[{index}]"
    card = _object(item, where, {"name", "minor", "switch", "port", "numa", "free"})
    name = _text(card["name"], f"{where}.name")
    if not _CARD.match(name):
        raise NodeStateError(f"node state {where}.name is {name!r:.80}, not gcuN")
    if not isinstance(card["free"], bool):
        raise NodeStateError(f"node state {where}.free is {card['free']!r:.80}, not true/false")
    holder = _text(card["pod"], f"{where}.pod") if "pod" in card else ""
    if holder and card["free"]:
        raise NodeStateError(f"node state {where} is free yet held by {holder!r:.80}")
    return CardState(
        name,
        _count(card["minor"], f"{where}.minor", 1 << 20),
        _text(card["switch"], f"{where}.switch"),
        _text(card["port"], f"{where}.port"),
        _text(card["numa"], f"{where}.numa"),
        card["free"],
        holder,
    )


def _shared(item: Any, index: int) -> SharedCard:
    where = f"shared[{index}]"
    card = _object(item, where, {"name", "minor", "slices", "free"})
    slices = _count(card["slices"], f"{where}.slices", 64)
    free = _count(card["free"], f"{where}.free", slices)
    name = _text(card["name"], f"{where}.name")
    pods = card.get("pods", {})
    if not isinstance(pods, dict):
        raise NodeStateError(f"node state {where}.pods is a {type(pods).__name__}, not an object")
    held = tuple(
        sorted(
            (_text(pod, f"{where}.pods key"), _count(n, f"{where}.pods[{pod!r:.40}]", slices))
            for pod, n in pods.items()
        )
    )
    if sum(n for _, n in held) > slices - free or any(n == 0 for _, n in held):
        raise NodeStateError(
            f"node state {where}.pods hold {sum(n for _, n in held)} slices "
            f"(each at least 1), more than the {slices - free} taken"
        )
    return SharedCard(name, _count(card["minor"], f"{where}.minor", 1 << 20), slices, free, held)


# --- the transport: one Lease per node --------------------------------------------------------


def micro_time(seconds: float) -> str:
    """``seconds`` since the epoch as a Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: Any) -> float:
    """A MicroTime's (or Time's) seconds since the epoch; NodeStateError when it is not one."""
    if not isinstance(text, str) or len(text) > 40:
        raise NodeStateError(f"Lease spec.renewTime is {text!r:.80}, not a time")
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise NodeStateError(
            f"Lease spec.renewTime is {text!r:.80}, not an RFC 3339 time"
        ) from None
    if moment.tzinfo is None:
        raise NodeStateError(f"Lease spec.renewTime {text!r:.80} has no time zone")
    return moment.timestamp()


def lease(node: str, namespace: str, text: str, renewed: float) -> dict[str, Any]:
    """The Lease carrying ``node``'s state ``text``, renewed at ``renewed`` (the writer's)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": namespace,
            "labels": dict(LEASE_LABELS),
            "annotations": {ANNOTATION: text},
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION,
            "renewTime": micro_time(renewed),
        },
    }


def heartbeat(renewed: float) -> dict[str, Any]:
    """The merge patch that renews a Lease and changes nothing else."""
    return {"spec": {"renewTime": micro_time(renewed)}}


def content_patch(text: str, renewed: float) -> dict[str, Any]:
    """The merge patch that writes a new state and renews the Lease in one write."""
    return {"metadata": {"annotations": {ANNOTATION: text}}, "spec": heartbeat(renewed)["spec"]}


def lease_key(found: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What of a Lease :func:`from_lease` reads (a reader parses again only when it moves)."""
    meta = found.get("metadata")
    spec = found.get("spec")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = notes.get(ANNOTATION) if isinstance(notes, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}
    return text, spec.get("holderIdentity"), spec.get("renewTime")


def from_lease(node: str, found: Mapping[str, Any]) -> NodeState:
    """The state the Lease named ``node`` carries, ``observed`` at its ``renewTime``.

    NodeStateError when it is not the node's own (held by another, or by no one: a foreign
    or hand-made Lease) or is unreadable."""
    text, holder, renewed = lease_key(found)
    meta = found.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if name != node:
        raise NodeStateError(f"Lease {name!r:.80} read as node {node!r:.80}'s state")
    if holder != node:
        raise NodeStateError(
            f"Lease {node} is held by {holder!r:.80}, not by node {node}: another node's "
            "(or no node's) state, not trusted"
        )
    if not isinstance(text, str):
        raise NodeStateError(f"Lease {node} has no {ANNOTATION} annotation")
    state = parse(text)
    return dataclasses.replace(state, observed=parse_micro_time(renewed))
