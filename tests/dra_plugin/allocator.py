"""A tiny stand-in for the scheduler's DRA allocator, for tests: is a claim satisfiable?

It understands what our DeviceClasses and example claims use and refuses anything else (so a
test cannot pass on an expression it silently ignored): CEL selectors that are ``&&`` chains of
``device.driver == "..."`` and ``device.attributes["<domain>"].<name> == <literal>``; requests
``exactly`` or ``firstAvailable`` (alternatives tried in order, as the scheduler ranks them),
``ExactCount``; ``matchAttribute`` constraints (also on ``<request>/<alternative>``); and
``capacity.requests`` against a device's capacity; request selectors and the capacity term
``device.capacity["<domain>"].<name>.compareTo(quantity("<q>")) >= 0``; and partitionable
devices: a device that ``consumesCounters`` is chosen only while its counter sets have room
(``counters`` maps set -> counter -> what is left). Devices are plain dicts from our slices.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_DRIVER = re.compile(r'^device\.driver\s*==\s*"([^"]+)"$')
_ATTRIBUTE = re.compile(r'^device\.attributes\["([^"]+)"\]\.(\w+)\s*==\s*(.+)$')
_CAPACITY = re.compile(
    r'^device\.capacity\["([^"]+)"\]\.(\w+)\.compareTo\(quantity\("([^"]+)"\)\)\s*>=\s*0$'
)
DRIVER = "gcu.enflame.com"


class Unsupported(Exception):
    """The claim or class uses something this stand-in does not evaluate."""


def _literal(text: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if text.lstrip("-").isdigit():
        return int(text)
    raise Unsupported(f"literal {text!r}")


def qualified(name: str) -> str:
    """Attribute names as the allocator compares them: unqualified ones are the driver's."""
    return name if "/" in name else f"{DRIVER}/{name}"


def attribute(device: Mapping[str, Any], name: str) -> Any:
    """The value of a device attribute by qualified name, or None when absent."""
    for key, value in (device.get("attributes") or {}).items():
        if qualified(key) == qualified(name):
            (kind, raw), *rest = value.items()
            assert not rest, f"attribute {key} has several values"
            return (kind, raw)
    return None


def selects(expression: str, device: Mapping[str, Any]) -> bool:
    """Evaluate one CEL selector of the supported shape against a device."""
    for term in (part.strip() for part in expression.split("&&")):
        if match := _DRIVER.match(term):
            if match.group(1) != DRIVER:
                return False
        elif match := _CAPACITY.match(term):
            if match.group(1) != DRIVER:
                raise Unsupported(f"{term}: capacity of another domain")
            entry = (device.get("capacity") or {}).get(match.group(2))
            if entry is None:
                raise Unsupported(f"{term}: a missing capacity is a CEL runtime error")
            if _quantity(entry["value"]) < _quantity(match.group(3)):
                return False
        elif match := _ATTRIBUTE.match(term):
            found = attribute(device, f"{match.group(1)}/{match.group(2)}")
            if found is None:
                raise Unsupported(f"{term}: a missing attribute is a CEL runtime error")
            if found[1] != _literal(match.group(3)):
                return False
        else:
            raise Unsupported(f"CEL term {term!r}")
    return True


def _class_filter(classes: Mapping[str, Any], name: str) -> list[str]:
    spec = classes[name]["spec"]
    return [selector["cel"]["expression"] for selector in spec.get("selectors") or []]


def _quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    match = re.match(r"^(\d+)(Ki|Mi|Gi|)$", str(text))
    if not match:
        raise Unsupported(f"quantity {text!r}")
    return int(match.group(1)) * units[match.group(2)]


def _fits_capacity(device: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    capacity = device.get("capacity") or {}
    for name, amount in wanted.items():
        if name not in capacity or _quantity(capacity[name]["value"]) < _quantity(amount):
            return False
    return True


def _candidates(
    request: Mapping[str, Any], classes: Mapping[str, Any], free: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    if request.get("allocationMode", "ExactCount") != "ExactCount":
        raise Unsupported(f"allocationMode {request['allocationMode']}")
    expressions = _class_filter(classes, request["deviceClassName"])
    expressions += [s["cel"]["expression"] for s in request.get("selectors") or []]
    wanted = (request.get("capacity") or {}).get("requests") or {}
    return [
        device
        for device in free
        if all(selects(e, device) for e in expressions) and _fits_capacity(device, wanted)
    ]


def _alternatives(request: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    if "exactly" in request:
        return [(request["name"], request["exactly"])]
    return [(f"{request['name']}/{alt['name']}", alt) for alt in request["firstAvailable"]]


def _constraints_hold(
    constraints: Iterable[Mapping[str, Any]], chosen: Mapping[str, Sequence[Mapping[str, Any]]]
) -> bool:
    for constraint in constraints:
        if set(constraint) - {"requests", "matchAttribute"}:
            raise Unsupported(f"constraint {constraint}")
        names = constraint.get("requests") or list(chosen)
        devices = [
            device
            for key, picked in chosen.items()
            for device in picked
            if key in names or key.split("/")[0] in names
        ]
        values = [attribute(device, constraint["matchAttribute"]) for device in devices]
        if any(value is None for value in values) or len(set(values)) > 1:
            return False
    return True


def consumption(devices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """What ``devices`` consume from each counter set: ``{set: {counter: amount}}``."""
    total: dict[str, dict[str, int]] = {}
    for device in devices:
        for entry in device.get("consumesCounters") or []:
            counters = total.setdefault(entry["counterSet"], {})
            for name, value in entry["counters"].items():
                counters[name] = counters.get(name, 0) + _quantity(value["value"])
    return total


def counters_left(
    counter_sets: Iterable[Mapping[str, Any]], held: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, int]]:
    """The pool's counter sets minus what the ``held`` devices consume."""
    left = {
        entry["name"]: {n: _quantity(v["value"]) for n, v in entry["counters"].items()}
        for entry in counter_sets
    }
    for name, used in consumption(held).items():
        for counter, amount in used.items():
            left[name][counter] -= amount
    return left


def _fits_counters(
    chosen: Iterable[Mapping[str, Any]], counters: Mapping[str, Mapping[str, int]] | None
) -> bool:
    if counters is None:
        return True
    for name, used in consumption(chosen).items():
        if name not in counters:
            return False
        if any(amount > counters[name].get(c, 0) for c, amount in used.items()):
            return False
    return True


def allocate(
    claim_spec: Mapping[str, Any],
    classes: Mapping[str, Any],
    free: Sequence[Mapping[str, Any]],
    counters: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, list[str]] | None:
    """A satisfying allocation ``{request or request/alternative: device names}``, or None.

    Alternatives are tried in order (the first that fits wins, as the scheduler ranks them);
    within one, every combination is searched, so "None" means no allocation exists.
    """
    devices_spec = claim_spec["devices"]
    requests = devices_spec["requests"]
    constraints = devices_spec.get("constraints") or []
    options = [_alternatives(request) for request in requests]
    for choice in itertools.product(*options):
        result = _search(list(choice), classes, free, constraints, {}, counters)
        if result is not None:
            return {key: [d["name"] for d in picked] for key, picked in result.items()}
    return None


def _search(  # noqa: PLR0917 - the recursion's state, passed down as it is
    pending: list[tuple[str, Mapping[str, Any]]],
    classes: Mapping[str, Any],
    free: Sequence[Mapping[str, Any]],
    constraints: Sequence[Mapping[str, Any]],
    chosen: dict[str, Sequence[Mapping[str, Any]]],
    counters: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Sequence[Mapping[str, Any]]] | None:
    if not pending:
        return dict(chosen) if _constraints_hold(constraints, chosen) else None
    (key, request), rest = pending[0], pending[1:]
    used = {d["name"] for picked in chosen.values() for d in picked}
    candidates = [d for d in _candidates(request, classes, free) if d["name"] not in used]
    for combination in itertools.combinations(candidates, int(request.get("count", 1))):
        chosen[key] = combination
        everything = [d for picked in chosen.values() for d in picked]
        if _constraints_hold(constraints, chosen) and _fits_counters(everything, counters):
            found = _search(rest, classes, free, constraints, chosen, counters)
            if found is not None:
                return found
        del chosen[key]
    return None
