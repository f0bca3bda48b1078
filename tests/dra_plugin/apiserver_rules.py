"""What a Kubernetes 1.36 API server refuses, drops and fills in for ``resource.k8s.io/v1``
ResourceSlices, ResourceClaims and DeviceClasses (../shared/DRA.md §5 and §8).

Written from the API's documented rules, independently of the driver's own checks
(:func:`enflame_gcu.resourceslices.check_slice`), so the fake API server can catch what the
driver gets wrong. Each ``validate_*`` returns the causes of a 422 Invalid (empty: accepted);
``drop_disabled`` removes the fields of feature gates that are off, as the server's strategies
do (silently, no error); ``default_*`` fills in what the server defaults.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Beta (on) in 1.36 unless noted; DRAPrioritizedList is GA there, DRAListTypeAttributes alpha.
GATES_1_36 = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
    "DRAPrioritizedList": True,
    "DRAExtendedResource": True,
    "DRAListTypeAttributes": False,
}

MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64  # any device with taints, consumesCounters or list attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE = 64  # string and version values
MAX_IDENTIFIER = 32
MAX_DOMAIN = 63
MAX_TAINTS = 16
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMES = 2
MAX_VALID_VALUES = 10
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_CONSTRAINTS = 32
MAX_SELECTORS = 32
MAX_CEL = 10 * 1024
MAX_NAME = 253
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
ALLOCATION_MODES = ("ExactCount", "All")
SCOPES = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
DEVICE_SCOPES = ("nodeName", "nodeSelector", "allNodes")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUALIFIED_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[munk])?$")


def _label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_DOMAIN and bool(_DNS_LABEL.match(value))


def _subdomain(value: Any, limit: int = MAX_NAME) -> bool:
    return isinstance(value, str) and len(value) <= limit and bool(_DNS_SUBDOMAIN.match(value))


def _qualified_name(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, sep, name = value.rpartition("/")
    if sep and not _subdomain(prefix):
        return False
    return len(name) <= MAX_DOMAIN and bool(_QUALIFIED_PART.match(name))


def _attribute_name(name: Any, where: str, *, qualified: bool = False) -> list[str]:
    """An attribute or capacity name: C identifier <= 32, optionally ``<subdomain <= 63>/``."""
    if not isinstance(name, str):
        return [f"{where}: name must be a string"]
    domain, sep, identifier = name.rpartition("/")
    problems = []
    if qualified and not sep:
        problems.append(f"{where}: {name!r} must be fully qualified (<domain>/<name>)")
    if len(identifier) > MAX_IDENTIFIER or not _C_IDENTIFIER.match(identifier):
        problems.append(f"{where}: {identifier!r} must be a C identifier of at most 32 characters")
    if sep and not _subdomain(domain, MAX_DOMAIN):
        problems.append(f"{where}: domain {domain!r} must be a DNS subdomain of at most 63")
    return problems


def _quantity(value: Any) -> bool:
    return isinstance(value, str | int) and bool(_QUANTITY.match(str(value)))


def _parse_quantity(value: Any) -> float:
    text = str(value)
    factors: dict[str, float] = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
    }
    factors.update({"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18})
    factors.update({"m": 1e-3, "u": 1e-6, "n": 1e-9})
    for suffix in sorted(factors, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factors[suffix]
    return float(text)


# --- ResourceSlice ---------------------------------------------------------------------------


def _validate_attribute(key: str, value: Any, where: str, gates: Mapping[str, bool]) -> list[str]:
    problems = _attribute_name(key, f"{where}.attributes[{key}]")
    kinds: tuple[str, ...] = ("int", "bool", "string", "version")
    if gates.get("DRAListTypeAttributes"):
        kinds = (*kinds, "ints", "bools", "strings", "versions")
    if not isinstance(value, Mapping):
        return [*problems, f"{where}.attributes[{key}]: must be an object"]
    set_kinds = [k for k in value if value[k] is not None]
    if len(set_kinds) != 1 or set_kinds[0] not in kinds:
        return [*problems, f"{where}.attributes[{key}]: exactly one of {', '.join(kinds)}"]
    kind = set_kinds[0]
    item = value[kind]
    if kind in ("string", "version") and len(str(item)) > MAX_ATTRIBUTE_VALUE:
        problems.append(f"{where}.attributes[{key}].{kind}: longer than {MAX_ATTRIBUTE_VALUE}")
    if kind == "version" and not _SEMVER.match(str(item)):
        problems.append(f"{where}.attributes[{key}].version: {item!r} is not semantic version")
    if kind == "int" and (isinstance(item, bool) or not isinstance(item, int)):
        problems.append(f"{where}.attributes[{key}].int: must be an integer")
    if kind == "bool" and not isinstance(item, bool):
        problems.append(f"{where}.attributes[{key}].bool: must be a boolean")
    return problems


def _validate_capacity(key: str, value: Any, where: str, multiple: bool) -> list[str]:
    at = f"{where}.capacity[{key}]"
    problems = _attribute_name(key, at)
    if not isinstance(value, Mapping) or not _quantity(value.get("value")):
        return [*problems, f"{at}.value: required, a quantity"]
    policy = value.get("requestPolicy")
    if policy is None:
        return problems
    if not multiple:
        problems.append(f"{at}.requestPolicy: only allowed when allowMultipleAllocations is true")
    values = policy.get("validValues")
    bounds = policy.get("validRange")
    if values is not None and bounds is not None:
        problems.append(f"{at}.requestPolicy: validValues and validRange are exclusive")
    total = _parse_quantity(value["value"])
    default = policy.get("default")
    if default is not None and not _quantity(default):
        problems.append(f"{at}.requestPolicy.default: must be a quantity")
        default = None
    if values is not None:
        if not 1 <= len(values) <= MAX_VALID_VALUES:
            problems.append(f"{at}.requestPolicy.validValues: 1 to {MAX_VALID_VALUES} values")
        parsed = [_parse_quantity(v) for v in values if _quantity(v)]
        if parsed != sorted(set(parsed)) or len(parsed) != len(values):
            problems.append(f"{at}.requestPolicy.validValues: sorted, unique quantities")
        if any(v > total for v in parsed):
            problems.append(f"{at}.requestPolicy.validValues: above the capacity's value")
        if default is not None and _parse_quantity(default) not in parsed:
            problems.append(f"{at}.requestPolicy.default: must be one of validValues")
    if bounds is not None:
        low = _parse_quantity(bounds.get("min", 0)) if _quantity(bounds.get("min")) else None
        if low is None:
            problems.append(f"{at}.requestPolicy.validRange.min: required")
        high = _parse_quantity(bounds["max"]) if _quantity(bounds.get("max")) else total
        if low is not None and not low <= high <= total:
            problems.append(f"{at}.requestPolicy.validRange: min <= max <= value")
        if default is not None and low is not None and not low <= _parse_quantity(default) <= high:
            problems.append(f"{at}.requestPolicy.default: outside validRange")
    if default is not None and _parse_quantity(default) > total:
        problems.append(f"{at}.requestPolicy.default: above the capacity's value")
    return problems


def _validate_taint(taint: Any, where: str) -> list[str]:
    problems = []
    if not _qualified_name(taint.get("key")):
        problems.append(f"{where}.key: {taint.get('key')!r} is not a qualified name")
    value = taint.get("value", "")
    if len(str(value)) > MAX_DOMAIN or not _LABEL_VALUE.match(str(value)):
        problems.append(f"{where}.value: {value!r} is not a label value")
    if taint.get("effect") not in TAINT_EFFECTS:
        problems.append(f"{where}.effect: {taint.get('effect')!r} not one of {TAINT_EFFECTS}")
    return problems


def _validate_device(
    device: Any, where: str, per_device_scope: bool, gates: Mapping[str, bool]
) -> list[str]:
    if not isinstance(device, Mapping):
        return [f"{where}: must be an object"]
    problems = []
    if not _label(device.get("name")):
        problems.append(f"{where}.name: {device.get('name')!r} is not a DNS label")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{where}: {len(attributes) + len(capacity)} attributes and capacities, "
            f"at most {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, value in attributes.items():
        problems.extend(_validate_attribute(key, value, where, gates))
    multiple = bool(device.get("allowMultipleAllocations"))
    for key, value in capacity.items():
        problems.extend(_validate_capacity(key, value, where, multiple))
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        problems.append(f"{where}.taints: {len(taints)}, at most {MAX_TAINTS}")
    for i, taint in enumerate(taints):
        problems.extend(_validate_taint(taint, f"{where}.taints[{i}]"))
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMES:
        problems.append(f"{where}.consumesCounters: {len(consumes)}, at most {MAX_CONSUMES}")
    seen = set()
    for i, entry in enumerate(consumes):
        at = f"{where}.consumesCounters[{i}]"
        if not _label(entry.get("counterSet")):
            problems.append(f"{at}.counterSet: must be a DNS label")
        if entry.get("counterSet") in seen:
            problems.append(f"{at}.counterSet: {entry.get('counterSet')!r} twice")
        seen.add(entry.get("counterSet"))
        problems.extend(_validate_counters(entry.get("counters"), at))
    scopes = [k for k in DEVICE_SCOPES if device.get(k)]
    if per_device_scope and len(scopes) != 1:
        problems.append(f"{where}: with perDeviceNodeSelection exactly one of {DEVICE_SCOPES}")
    if not per_device_scope and scopes:
        problems.append(f"{where}.{scopes[0]}: only with perDeviceNodeSelection")
    return problems


def _validate_counters(counters: Any, where: str) -> list[str]:
    if not isinstance(counters, Mapping) or not counters:
        return [f"{where}.counters: required"]
    problems = []
    if len(counters) > MAX_COUNTERS:
        problems.append(f"{where}.counters: {len(counters)}, at most {MAX_COUNTERS}")
    for key, value in counters.items():
        if not _label(key):
            problems.append(f"{where}.counters[{key}]: must be a DNS label")
        if not isinstance(value, Mapping) or not _quantity(value.get("value")):
            problems.append(f"{where}.counters[{key}].value: required, a quantity")
    return problems


def validate_slice(
    document: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
    gates: Mapping[str, bool] = GATES_1_36,
) -> list[str]:
    """Why a 1.36 server refuses this ResourceSlice (create, or update of ``old``)."""
    metadata = document.get("metadata") or {}
    spec = document.get("spec") or {}
    problems = []
    if not _subdomain(metadata.get("name")):
        problems.append(f"metadata.name: {metadata.get('name')!r} is not a DNS subdomain")
    if not _subdomain(spec.get("driver"), MAX_DOMAIN):
        problems.append(f"spec.driver: {spec.get('driver')!r} is not a DNS subdomain of <= 63")
    pool = spec.get("pool") or {}
    name = pool.get("name")
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME
        or not all(_subdomain(part) for part in name.split("/"))
    ):
        problems.append(f"spec.pool.name: {name!r} must be DNS subdomains joined by '/'")
    generation = pool.get("generation")
    if not isinstance(generation, int) or generation < 0:
        problems.append("spec.pool.generation: must be a non-negative integer")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        problems.append("spec.pool.resourceSliceCount: must be greater than zero")
    scopes = [k for k in SCOPES if spec.get(k)]
    if len(scopes) != 1:
        problems.append(f"spec: exactly one of {', '.join(SCOPES)}, got {scopes}")
    terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms")
    if spec.get("nodeSelector") and len(terms or []) != 1:
        problems.append("spec.nodeSelector.nodeSelectorTerms: exactly one term")
    devices = spec.get("devices") or []
    counter_sets = spec.get("sharedCounters") or []
    if devices and counter_sets:
        problems.append("spec: devices and sharedCounters cannot be in the same slice")
    restricted = any(
        isinstance(d, Mapping)
        and (
            d.get("taints")
            or d.get("consumesCounters")
            or any(
                k in ("ints", "bools", "strings", "versions")
                for v in (d.get("attributes") or {}).values()
                for k in v
            )
        )
        for d in devices
    )
    limit = MAX_DEVICES_RESTRICTED if restricted else MAX_DEVICES
    if len(devices) > limit:
        problems.append(f"spec.devices: {len(devices)} devices, at most {limit} here")
    names = [d.get("name") for d in devices if isinstance(d, Mapping)]
    if len(set(names)) != len(names):
        problems.append("spec.devices: duplicate device names")
    per_device = bool(spec.get("perDeviceNodeSelection"))
    for i, device in enumerate(devices):
        problems.extend(_validate_device(device, f"spec.devices[{i}]", per_device, gates))
    if len(counter_sets) > MAX_COUNTER_SETS:
        problems.append(f"spec.sharedCounters: {len(counter_sets)}, at most {MAX_COUNTER_SETS}")
    set_names = [c.get("name") for c in counter_sets]
    if len(set(set_names)) != len(set_names):
        problems.append("spec.sharedCounters: duplicate names")
    for i, counter_set in enumerate(counter_sets):
        if not _label(counter_set.get("name")):
            problems.append(f"spec.sharedCounters[{i}].name: must be a DNS label")
        problems.extend(
            _validate_counters(counter_set.get("counters"), f"spec.sharedCounters[{i}]")
        )
    if old is not None:
        old_spec = old.get("spec") or {}
        for field in ("driver", "nodeName"):
            if spec.get(field) != old_spec.get(field):
                problems.append(f"spec.{field}: field is immutable")
    return problems


def drop_disabled_slice(document: dict[str, Any], gates: Mapping[str, bool]) -> None:
    """Remove, in place, the slice fields of gates that are off (as the strategy does)."""
    spec = document.get("spec") or {}
    if not gates.get("DRAPartitionableDevices"):
        for name in ("sharedCounters", "perDeviceNodeSelection"):
            spec.pop(name, None)
    for device in spec.get("devices") or []:
        if not gates.get("DRAPartitionableDevices"):
            for name in ("consumesCounters", *DEVICE_SCOPES):
                device.pop(name, None)
        if not gates.get("DRADeviceTaints"):
            device.pop("taints", None)
        if not gates.get("DRAConsumableCapacity"):
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)


# --- ResourceClaim ---------------------------------------------------------------------------


def _validate_selectors(selectors: Any, where: str) -> list[str]:
    selectors = selectors or []
    problems = []
    if len(selectors) > MAX_SELECTORS:
        problems.append(f"{where}: {len(selectors)} selectors, at most {MAX_SELECTORS}")
    for i, selector in enumerate(selectors):
        expression = (selector.get("cel") or {}).get("expression")
        if not isinstance(expression, str) or not expression.strip():
            problems.append(f"{where}[{i}].cel.expression: required")
        elif len(expression) > MAX_CEL:
            problems.append(f"{where}[{i}].cel.expression: longer than {MAX_CEL} bytes")
    return problems


def _validate_exact(request: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    if not _subdomain(request.get("deviceClassName")):
        problems.append(f"{where}.deviceClassName: required, a DNS subdomain")
    mode = request.get("allocationMode", "ExactCount")
    if mode not in ALLOCATION_MODES:
        problems.append(f"{where}.allocationMode: {mode!r} not one of {ALLOCATION_MODES}")
    count = request.get("count")
    if mode == "ExactCount" and count is not None and (not isinstance(count, int) or count <= 0):
        problems.append(f"{where}.count: must be greater than zero")
    if mode == "All" and count not in (None, 0):
        problems.append(f"{where}.count: must not be set with allocationMode All")
    problems.extend(_validate_selectors(request.get("selectors"), f"{where}.selectors"))
    return problems


def validate_claim(
    document: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
    gates: Mapping[str, bool] = GATES_1_36,
) -> list[str]:
    """Why a 1.36 server refuses this ResourceClaim (create, or update of ``old``)."""
    metadata = document.get("metadata") or {}
    problems = []
    if not _subdomain(metadata.get("name")):
        problems.append(f"metadata.name: {metadata.get('name')!r} is not a DNS subdomain")
    devices = (document.get("spec") or {}).get("devices") or {}
    requests = devices.get("requests") or []
    if len(requests) > MAX_REQUESTS:
        problems.append(f"spec.devices.requests: {len(requests)}, at most {MAX_REQUESTS}")
    known: set[str] = set()
    for i, request in enumerate(requests):
        at = f"spec.devices.requests[{i}]"
        name = request.get("name")
        if not _label(name):
            problems.append(f"{at}.name: {name!r} is not a DNS label")
        if name in known:
            problems.append(f"{at}.name: {name!r} twice")
        known.add(str(name))
        exact, first = request.get("exactly"), request.get("firstAvailable")
        if (exact is None) == (first is None):
            problems.append(f"{at}: exactly one of exactly, firstAvailable")
        if exact is not None:
            problems.extend(_validate_exact(exact, f"{at}.exactly"))
        if first is not None:
            if not 1 <= len(first) <= MAX_SUBREQUESTS:
                problems.append(f"{at}.firstAvailable: 1 to {MAX_SUBREQUESTS} subrequests")
            subnames = set()
            for j, sub in enumerate(first):
                sub_at = f"{at}.firstAvailable[{j}]"
                if not _label(sub.get("name")) or sub.get("name") in subnames:
                    problems.append(f"{sub_at}.name: a DNS label, unique in the request")
                subnames.add(sub.get("name"))
                known.add(f"{name}/{sub.get('name')}")
                problems.extend(_validate_exact(sub, sub_at))
    constraints = devices.get("constraints") or []
    if len(constraints) > MAX_CONSTRAINTS:
        problems.append(f"spec.devices.constraints: {len(constraints)}, at most {MAX_CONSTRAINTS}")
    for i, constraint in enumerate(constraints):
        at = f"spec.devices.constraints[{i}]"
        for ref in constraint.get("requests") or []:
            if ref not in known:
                problems.append(f"{at}.requests: {ref!r} is not a request of this claim")
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if constraint.get(k)]
        if len(kinds) != 1:
            problems.append(f"{at}: exactly one of matchAttribute, distinctAttribute")
        for kind in kinds:
            problems.extend(_attribute_name(constraint[kind], f"{at}.{kind}", qualified=True))
    if old is not None and (old.get("spec") or {}) != (document.get("spec") or {}):
        problems.append("spec: field is immutable")
    return problems


def _requests(document: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for request in ((document.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if request.get("exactly") is not None:
            yield request["exactly"]
        yield from request.get("firstAvailable") or []


def drop_disabled_claim(document: dict[str, Any], gates: Mapping[str, bool]) -> None:
    """Remove, in place, the claim fields of gates that are off."""
    devices = (document.get("spec") or {}).get("devices") or {}
    if not gates.get("DRAPrioritizedList"):
        for request in devices.get("requests") or []:
            request.pop("firstAvailable", None)
    for request in _requests(document):
        if not gates.get("DRADeviceTaints"):
            request.pop("tolerations", None)
        if not gates.get("DRAConsumableCapacity"):
            request.pop("capacity", None)
    if not gates.get("DRAConsumableCapacity"):
        for constraint in devices.get("constraints") or []:
            constraint.pop("distinctAttribute", None)


def default_claim(document: dict[str, Any]) -> None:
    """What the server fills in: allocationMode ExactCount and count 1."""
    for request in _requests(document):
        request.setdefault("allocationMode", "ExactCount")
        if request["allocationMode"] == "ExactCount":
            request.setdefault("count", 1)


def admit_claim_template(
    document: dict[str, Any],
    old: Mapping[str, Any] | None = None,
    gates: Mapping[str, bool] = GATES_1_36,
) -> list[str]:
    """A ResourceClaimTemplate as the server stores it (its claim spec dropped and defaulted as
    a claim's, in place) and why it refuses it: the claim spec's rules, and an immutable spec."""
    claim = {
        "metadata": document.get("metadata") or {},
        "spec": (document.get("spec") or {}).get("spec") or {},
    }
    drop_disabled_claim(claim, gates)
    default_claim(claim)
    problems = [
        problem.replace("spec.", "spec.spec.", 1) for problem in validate_claim(claim, None, gates)
    ]
    if old is not None and (old.get("spec") or {}) != (document.get("spec") or {}):
        problems.append("spec: field is immutable")
    return problems


# --- DeviceClass -----------------------------------------------------------------------------


def _extended_resource_name(value: Any) -> bool:
    # A qualified name outside kubernetes.io and not starting "requests." (the quota prefix).
    if not isinstance(value, str) or not _qualified_name(value) or "/" not in value:
        return False
    domain = value.partition("/")[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return not value.startswith("requests.")


def validate_device_class(
    document: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
    gates: Mapping[str, bool] = GATES_1_36,
) -> list[str]:
    """Why a 1.36 server refuses this DeviceClass."""
    metadata = document.get("metadata") or {}
    spec = document.get("spec") or {}
    problems = []
    if not _subdomain(metadata.get("name")):
        problems.append(f"metadata.name: {metadata.get('name')!r} is not a DNS subdomain")
    problems.extend(_validate_selectors(spec.get("selectors"), "spec.selectors"))
    for i, config in enumerate(spec.get("config") or []):
        opaque = config.get("opaque") or {}
        if not _subdomain(opaque.get("driver"), MAX_DOMAIN):
            problems.append(f"spec.config[{i}].opaque.driver: required, a DNS subdomain")
    name = spec.get("extendedResourceName")
    if name is not None and not _extended_resource_name(name):
        problems.append(f"spec.extendedResourceName: {name!r} is not an extended resource name")
    return problems


def drop_disabled_device_class(document: dict[str, Any], gates: Mapping[str, bool]) -> None:
    """Remove, in place, the class fields of gates that are off."""
    if not gates.get("DRAExtendedResource"):
        (document.get("spec") or {}).pop("extendedResourceName", None)
