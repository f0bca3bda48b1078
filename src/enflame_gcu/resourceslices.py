"""A node's GCUs as DRA devices (``resource.k8s.io/v1``): attributes, ResourceSlices, limits.

Each card becomes one device ``gcu-<minor>``; a card in the driver's vGCU mode is published as
its vGCUs ``vgcu-<minor>`` instead, never as itself (the device plugin does the same). Per
device (DRA.md §4-5):

==============================  =======  ================================================
attribute                       type     value
==============================  =======  ================================================
type                            string   ``gcu`` or ``vgcu``
model / family                  string   product name (``S60-48GB``) and its family (``S``)
productID                       string   PCI device id (``0xc035``)
index                           int      char-device minor (``/dev/gcu<index>``)
parentIndex (vGCU only)         int      minor of the card the vGCU belongs to
driverVersion                   version  the enflame module's version (when it is semver)
shareable                       bool     the card may be time-shared (consumable capacity)
pcieSwitch                      string   upstream port of the lowest switch above the card;
                                         omitted when the card hangs off a root port
pcieRootPort                    string   the root port above the card
resource.kubernetes.io/pciBusID string   the card's PCI address
resource.kubernetes.io/pcieRoot string   the root complex (``pci0000:00``)
resource.kubernetes.io/numaNode int      omitted when sysfs says -1
==============================  =======  ================================================

Capacity: ``memory`` (from the model name, when it says) and, on shareable cards, ``slices``.
A vGCU carries its card's PCI attributes, so ``matchAttribute`` on ``pciBusID`` asks for vGCUs
of one card.

Whole, vGCU or shared, never two ways at once: vGCU mode is the driver's (a card in it has no
whole-card device). A shareable card is still one device, with ``allowMultipleAllocations``
and a ``slices`` capacity whose request policy defaults to every slice: a whole-card claim
consumes all slices, a shared claim asks for some, and the scheduler's capacity accounting
keeps the two apart. That is consumable capacity (beta and on by default from Kubernetes 1.36,
alpha behind ``DRAConsumableCapacity`` in 1.34-1.35); an API server without it drops the
fields and the card is simply exclusive.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from enflame_gcu import devices, naming, products

DRIVER = naming.DRA_DRIVER
STANDARD_DOMAIN = "resource.kubernetes.io"
API_VERSION = "resource.k8s.io/v1"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
# A card a device-plugin pod still holds (a node moved to DRA): not offered until released.
DEVICE_PLUGIN_TAINT = f"{DRIVER}/held-by-device-plugin"

# Limits of resource.k8s.io/v1 (DRA.md §4).
MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64  # when any device has taints, counters or list attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_IDENTIFIER = 32
MAX_DOMAIN = 63
MAX_TAINTS = 16
MAX_NAME = 253

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
_DEVICE_NAME = re.compile(r"^(v?gcu)-(\d+)$")
_PARTITION_NAME = re.compile(r"^gcu-(\d+)-(\d+)g-(\d+)gb-(\d+)$")
MAX_COUNTER_SETS = 8  # per slice


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """How a node's devices are published.

    ``shared_slices``: 0 keeps cards exclusive; N > 0 makes every whole card shareable in N
    slices through consumable capacity. ``unhealthy``: ``taint`` (NoSchedule taint, needs
    device taints on the cluster) or ``omit`` (leave unhealthy devices out of the slices).
    ``devices_per_slice`` stays at the restricted limit so a taint appearing later never
    forces the pool to be split differently.
    """

    shared_slices: int = 0
    unhealthy: str = "taint"
    devices_per_slice: int = MAX_DEVICES_RESTRICTED


def device_name(kind: str, minor: int) -> str:
    """DNS-label device name: ``device_name("gcu", 3) == "gcu-3"``."""
    return f"{kind}-{minor}"


def partition_name(minor: int, profile: str, number: int) -> str:
    """DNS-label name of a DRS partition device: ``(3, "1g.8gb", 0)`` -> ``gcu-3-1g-8gb-0``."""
    return f"gcu-{minor}-{profile.replace('.', '-')}-{number}"


def parse_partition(name: str) -> tuple[int, str] | None:
    """``(card minor, profile)`` of a DRS partition device name, or None for other names."""
    match = _PARTITION_NAME.match(name)
    if not match:
        return None
    return int(match.group(1)), f"{int(match.group(2))}g.{int(match.group(3))}gb"


def node_device(name: str) -> str:
    """The node's name for a published device: ``gcu-3`` -> ``gcu3``; a DRS partition is on its
    card (``gcu-3-1g-8gb-0`` -> ``gcu3``); ValueError otherwise."""
    partition = parse_partition(name)
    if partition is not None:
        return f"gcu{partition[0]}"
    match = _DEVICE_NAME.match(name)
    if not match:
        raise ValueError(
            f"{name!r} is not a {DRIVER} device name (want gcu-N, vgcu-N or gcu-N-<profile>-K)"
        )
    return f"{match.group(1)}{int(match.group(2))}"


def lowest_switch(card: devices.Card) -> str | None:
    """Upstream port of the lowest PCIe switch above the card; None on a root port directly."""
    return card.switch


def _string(value: str) -> dict[str, Any]:
    return {"string": value}


def _pci_attributes(card: devices.Card) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        f"{STANDARD_DOMAIN}/pciBusID": _string(card.bdf),
    }
    if card.root_complex:
        attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = _string(card.root_complex)
    if card.numa_node is not None:
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": card.numa_node}
    switch = lowest_switch(card)
    if switch is not None:
        attributes["pcieSwitch"] = _string(switch)
    if card.root_port is not None:
        attributes["pcieRootPort"] = _string(card.root_port)
    return attributes


def _product_attributes(card: devices.Card, driver_version: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "model": _string(card.model[:MAX_STRING]),
        "family": _string(products.product_family(card.model)),
        "productID": _string(f"0x{card.device_id:04x}"),
    }
    if driver_version and _SEMVER.match(driver_version):
        attributes["driverVersion"] = {"version": driver_version}
    return attributes


def _taints(healthy: bool, options: PublishOptions) -> dict[str, Any]:
    if healthy or options.unhealthy != "taint":
        return {}
    return {"taints": [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]}


def card_device(
    card: devices.Card,
    driver_version: str | None,
    *,
    healthy: bool = True,
    options: PublishOptions = PublishOptions(),
) -> dict[str, Any]:
    """The DRA device of one whole card."""
    shareable = options.shared_slices > 0
    attributes = {
        "type": _string("gcu"),
        "index": {"int": card.minor},
        "shareable": {"bool": shareable},
        **_product_attributes(card, driver_version),
        **_pci_attributes(card),
    }
    capacity: dict[str, Any] = {}
    memory = products.memory_mib(card.model)
    if memory is not None:
        capacity["memory"] = {"value": f"{memory}Mi"}
        if shareable:
            # Time-sharing does not split memory: nothing is consumed unless a claim asks.
            capacity["memory"]["requestPolicy"] = {"default": "0", "validRange": {"min": "0"}}
    device: dict[str, Any] = {"name": device_name("gcu", card.minor), "attributes": attributes}
    if shareable:
        slices = str(options.shared_slices)
        capacity["slices"] = {
            "value": slices,
            "requestPolicy": {
                "default": slices,
                "validRange": {"min": "1", "max": slices, "step": "1"},
            },
        }
        device["allowMultipleAllocations"] = True
    if capacity:
        device["capacity"] = capacity
    device.update(_taints(healthy, options))
    return device


def vgcu_device(
    vgcu: devices.VirtualDevice,
    parent: devices.Card | None,
    driver_version: str | None,
    *,
    healthy: bool = True,
    options: PublishOptions = PublishOptions(),
) -> dict[str, Any]:
    """The DRA device of one vGCU; it carries its card's product and PCI attributes."""
    attributes: dict[str, Any] = {"type": _string("vgcu"), "index": {"int": vgcu.minor}}
    if parent is not None:
        attributes["parentIndex"] = {"int": parent.minor}
        attributes.update(_product_attributes(parent, driver_version))
        attributes.update(_pci_attributes(parent))
    elif driver_version and _SEMVER.match(driver_version):
        attributes["driverVersion"] = {"version": driver_version}
    device: dict[str, Any] = {"name": device_name("vgcu", vgcu.minor), "attributes": attributes}
    device.update(_taints(healthy, options))
    return device


def node_devices(
    inventory: devices.Inventory,
    healthy: Mapping[str, bool],
    options: PublishOptions = PublishOptions(),
) -> list[dict[str, Any]]:
    """Every device of the node in minor order: whole cards, then vGCUs.

    ``healthy`` maps ``gcuN`` to its health (a vGCU follows its card; a card missing from the
    map is unhealthy). Cards that discovery found unusable are left out; so are unhealthy
    devices when ``options.unhealthy == "omit"``.
    """
    version = inventory.driver_version
    partitioned = {vgcu.parent_minor for vgcu in inventory.vgcus if vgcu.parent_minor is not None}
    cards = {card.minor: card for card in inventory.cards}
    result = []
    for card in inventory.usable_cards():
        if card.minor in partitioned:
            continue
        ok = healthy.get(card.name, False)
        if ok or options.unhealthy == "taint":
            result.append(card_device(card, version, healthy=ok, options=options))
    for vgcu in inventory.vgcus:
        parent = cards.get(vgcu.parent_minor) if vgcu.parent_minor is not None else None
        if not vgcu.usable or (parent is not None and not parent.usable):
            continue
        ok = parent is not None and healthy.get(parent.name, False)
        if ok or options.unhealthy == "taint":
            result.append(vgcu_device(vgcu, parent, version, healthy=ok, options=options))
    return result


def slice_name(node: str, index: int) -> str:
    """Deterministic object name of slice ``index`` of a node's pool (a DNS subdomain)."""
    base = re.sub(r"[^a-z0-9.-]", "-", node.lower()).strip("-.") or "node"
    suffix = f"-{DRIVER}-{index}"
    return base[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def build_slices(
    node: str,
    node_uid: str | None,
    device_list: Sequence[dict[str, Any]],
    generation: int,
    options: PublishOptions = PublishOptions(),
    *,
    counter_sets: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlice objects: pool = node name, devices split by the limit.

    A node without devices still gets one empty slice, so the scheduler knows the pool is
    complete (and empty). ``node_uid`` adds an owner reference to the Node, so the slices go
    away with it. ``counter_sets`` (DRS cards) go first, in slices of their own (the API
    allows no devices beside them), eight sets to a slice.
    """
    size = max(1, min(options.devices_per_slice, MAX_DEVICES))
    chunks: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", list(counter_sets[i : i + MAX_COUNTER_SETS]))
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    chunks += [
        ("devices", list(device_list[i : i + size])) for i in range(0, len(device_list), size)
    ]
    chunks = chunks or [("devices", [])]
    result = []
    for index, (field, chunk) in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, index)}
        if node_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ]
        spec: dict[str, Any] = {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
        }
        if chunk:
            spec[field] = chunk
        result.append(
            {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
        )
    return result


# --- our own checks of the limits the schemas cannot express -------------------------------


def _check_name(name: str, where: str) -> list[str]:
    domain, sep, identifier = name.rpartition("/")
    problems = []
    if not _C_IDENTIFIER.match(identifier) or len(identifier) > MAX_IDENTIFIER:
        problems.append(f"{where}: {identifier!r} is not a C identifier of at most 32 chars")
    if sep and (len(domain) > MAX_DOMAIN or not _DNS_SUBDOMAIN.match(domain)):
        problems.append(f"{where}: domain {domain!r} is not a DNS subdomain of at most 63")
    return problems


def check_device(device: Mapping[str, Any]) -> list[str]:
    """Problems of one device against the limits of DRA.md §4 (empty when it is fine)."""
    name = str(device.get("name", ""))
    problems = []
    if len(name) > MAX_DOMAIN or not _DNS_LABEL.match(name):
        problems.append(f"device name {name!r} is not a DNS label")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(f"{name}: {len(attributes) + len(capacity)} attributes and capacities")
    for key, value in attributes.items():
        problems.extend(_check_name(key, f"{name} attribute"))
        if len(value) != 1:
            problems.append(f"{name} attribute {key}: exactly one value type, got {sorted(value)}")
        for kind in ("string", "version"):
            if kind in value and len(str(value[kind])) > MAX_STRING:
                problems.append(f"{name} attribute {key}: {kind} longer than {MAX_STRING}")
        if "version" in value and not _SEMVER.match(str(value["version"])):
            problems.append(f"{name} attribute {key}: {value['version']!r} is not semver")
    for key in capacity:
        problems.extend(_check_name(key, f"{name} capacity"))
    if len(device.get("taints") or []) > MAX_TAINTS:
        problems.append(f"{name}: more than {MAX_TAINTS} taints")
    return problems


def check_slice(resource_slice: Mapping[str, Any]) -> list[str]:
    """Problems of one ResourceSlice against the limits of DRA.md §4."""
    spec = resource_slice.get("spec") or {}
    name = str((resource_slice.get("metadata") or {}).get("name", ""))
    problems = []
    if len(name) > MAX_NAME or not _DNS_SUBDOMAIN.match(name):
        problems.append(f"slice name {name!r} is not a DNS subdomain")
    driver = str(spec.get("driver", ""))
    if len(driver) > MAX_DOMAIN or not _DNS_SUBDOMAIN.match(driver):
        problems.append(f"driver {driver!r} is not a DNS subdomain of at most 63 chars")
    selectors = [key for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")]
    if sum(1 for key in selectors if spec.get(key)) != 1:
        problems.append(f"{name}: exactly one of {', '.join(selectors)} must be set")
    if spec.get("devices") and spec.get("sharedCounters"):
        problems.append(f"{name}: devices and sharedCounters in one slice")
    device_list = spec.get("devices") or []
    restricted = any(d.get("taints") or d.get("consumesCounters") for d in device_list)
    limit = MAX_DEVICES_RESTRICTED if restricted else MAX_DEVICES
    if len(device_list) > limit:
        problems.append(f"{name}: {len(device_list)} devices, the limit here is {limit}")
    names = [d.get("name") for d in device_list]
    if len(set(names)) != len(names):
        problems.append(f"{name}: duplicate device names")
    for device in device_list:
        problems.extend(check_device(device))
    return problems


def check_pool(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Problems across a pool's slices: counts, generations and device names must agree."""
    problems = [problem for item in slices for problem in check_slice(item)]
    pools = {
        (
            s["spec"]["pool"]["name"],
            s["spec"]["pool"]["generation"],
            s["spec"]["pool"].get("resourceSliceCount"),
        )
        for s in slices
    }
    if len(pools) != 1:
        problems.append(f"slices disagree about their pool: {sorted(pools, key=str)}")
    elif next(iter(pools))[2] != len(slices):
        problems.append(f"resourceSliceCount says {next(iter(pools))[2]}, found {len(slices)}")
    names = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    if len(set(names)) != len(names):
        problems.append("a device name appears twice in the pool")
    sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or []]
    if len(set(sets)) != len(sets):
        problems.append("a counter set name appears twice in the pool")
    counters = {
        c["name"]: set(c.get("counters") or {})
        for s in slices
        for c in s["spec"].get("sharedCounters") or []
    }
    for item in slices:
        if len(item["spec"].get("sharedCounters") or []) > MAX_COUNTER_SETS:
            where = item["metadata"]["name"]
            problems.append(f"{where}: more than {MAX_COUNTER_SETS} counter sets")
        for device in item["spec"].get("devices") or []:
            consumed = device.get("consumesCounters") or []
            if len(consumed) > 2:
                problems.append(f"{device['name']}: consumes from more than 2 counter sets")
            for entry in consumed:
                known = counters.get(entry.get("counterSet"))
                if known is None or not set(entry.get("counters") or {}) <= known:
                    problems.append(
                        f"{device['name']}: consumes from counter set "
                        f"{entry.get('counterSet')!r}, which the pool does not define so"
                    )
    return problems


ORDERS = ("topology", "index")  # published device order: --device-order


def _group_key(device: Mapping[str, Any], name: str) -> Any:
    """A device's value of one grouping attribute; its own name when it has none."""
    value = (device.get("attributes") or {}).get(name)
    return next(iter(value.values())) if value else ("own", device.get("name"))


def allocation_order(
    device_list: Sequence[dict[str, Any]], busy: Collection[str]
) -> list[dict[str, Any]]:
    """``device_list`` ordered so the scheduler's first fit is the device plugin's best fit.

    The allocator takes devices in published order (DRA.md §5), and a ``matchAttribute``
    alternative takes the first device whose group has room. So the busiest groups go first:
    fewest free devices in the device's PCIe switch, then the smaller switch, then the fewest
    free in its root port, then in its NUMA node, then the given (minor) order. A pod then
    fills a half-used switch before it breaks a whole one, and a single card goes to a lone
    card's switch before a pair's, as ``allocation.TopologyPolicy`` chooses. A device without
    one of the attributes is its own group at that level. ``busy``: published names of the
    allocated devices. Only the order changes: the devices are the same objects.
    """
    levels = ("pcieSwitch", "pcieRootPort", f"{STANDARD_DOMAIN}/numaNode")
    free: list[dict[Any, int]] = [{} for _ in levels]
    size: dict[Any, int] = {}
    keys: list[tuple[Any, ...]] = []
    for device in device_list:
        key = tuple(_group_key(device, level) for level in levels)
        keys.append(key)
        size[key[0]] = size.get(key[0], 0) + 1
        taken = str(device.get("name")) in busy
        for counts, value in zip(free, key, strict=True):
            counts[value] = counts.get(value, 0) + (0 if taken else 1)

    def rank(i: int) -> tuple[int, ...]:
        left = [counts[v] for counts, v in zip(free, keys[i], strict=True)]
        return (left[0], size[keys[i][0]], *left[1:], i)

    ranked = sorted(range(len(device_list)), key=rank)
    return [device_list[i] for i in ranked]
