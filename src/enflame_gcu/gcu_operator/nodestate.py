"""Per-node facts the operator keeps on the Node itself, so a restarted operator knows them.

One annotation holds JSON keyed by GcuResource name: the labels this resource set (only those
are ever removed), the last validation (which pods it validated, ok or not, the message), the
upgrade a node is part of, and whether the operator cordoned it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from enflame_gcu.gcu_operator import names


@dataclasses.dataclass(frozen=True, slots=True)
class NodeState:
    """What one resource recorded on one node."""

    labels: frozenset[str] = frozenset()
    validated_target: str = ""
    validated_ok: bool = False
    validation_message: str = ""
    upgrading: str = ""
    cordoned: bool = False
    # When (seconds since the epoch) the node's upgrade began: its drain times out from here.
    since: float = 0.0
    # The node's report (mode, components, ready, validated, lastError) as canonical JSON: the
    # per-node detail lives here, on the Node, so the resource's status stays small at scale.
    report: str = ""
    # Components this node runs at their previous version again, because their new pod here
    # failed and stopped the rollout: (component, the template hash that failed, why, the
    # resource's generation then: any later edit of the resource tries the new one again).
    fallback: tuple[tuple[str, str, str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON form (sorted labels, so equal states compare equal as text)."""
        return {
            "labels": sorted(self.labels),
            "validation": {
                "target": self.validated_target,
                "ok": self.validated_ok,
                "message": self.validation_message,
            },
            "upgrading": self.upgrading,
            "cordoned": self.cordoned,
            **({"since": self.since} if self.since else {}),
            **({"report": json.loads(self.report)} if self.report else {}),
            **(
                {
                    "fallback": [
                        {"component": k, "failed": h, "reason": r, "generation": g}
                        for k, h, r, g in self.fallback
                    ]
                }
                if self.fallback
                else {}
            ),
        }


def _all(node: Mapping[str, Any]) -> dict[str, Any]:
    annotations = node.get("metadata", {}).get("annotations") or {}
    try:
        value = json.loads(annotations.get(names.NODE_STATE_ANNOTATION, "{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def read(node: Mapping[str, Any], resource: str) -> NodeState:
    """The state ``resource`` recorded on ``node`` (empty when none or unreadable)."""
    raw = _all(node).get(resource)
    if not isinstance(raw, dict):
        return NodeState()
    found = raw.get("validation")
    validation: dict[str, Any] = found if isinstance(found, dict) else {}
    return NodeState(
        labels=frozenset(str(x) for x in raw.get("labels") or () if isinstance(x, str)),
        validated_target=str(validation.get("target") or ""),
        validated_ok=bool(validation.get("ok")),
        validation_message=str(validation.get("message") or ""),
        upgrading=str(raw.get("upgrading") or ""),
        cordoned=bool(raw.get("cordoned")),
        since=float(raw["since"]) if isinstance(raw.get("since"), int | float) else 0.0,
        report=canonical(raw["report"]) if isinstance(raw.get("report"), dict) else "",
        fallback=_fallback(raw.get("fallback")),
    )


def _fallback(raw: Any) -> tuple[tuple[str, str, str, int], ...]:
    """The fallback entries as recorded (an entry that is not what we write is dropped)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for entry in raw:
        if (
            isinstance(entry, dict)
            and all(isinstance(entry.get(k), str) for k in ("component", "failed", "reason"))
            and isinstance(entry.get("generation"), int)
        ):
            out.append((entry["component"], entry["failed"], entry["reason"], entry["generation"]))
    return tuple(sorted(out))


def canonical(report: Mapping[str, Any]) -> str:
    """A node report as the text NodeState keeps (equal reports, equal text)."""
    return json.dumps(report, sort_keys=True, separators=(",", ":"))


def report_of(node: Mapping[str, Any], resource: str) -> dict[str, Any] | None:
    """The per-node report ``resource`` wrote on ``node`` (None when there is none)."""
    raw = _all(node).get(resource)
    found = raw.get("report") if isinstance(raw, dict) else None
    return found if isinstance(found, dict) else None


def annotation(node: Mapping[str, Any], resource: str, state: NodeState | None) -> str | None:
    """The annotation's new value with ``resource``'s entry set (or dropped when None)."""
    value = _all(node)
    if state is None or state == NodeState():
        value.pop(resource, None)
    else:
        value[resource] = state.to_json()
    return json.dumps(value, sort_keys=True) if value else None
