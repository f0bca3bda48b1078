"""What a reconcile asks of the API: plain values the runner carries out in order."""

from __future__ import annotations

import dataclasses
from typing import Any

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    """Create ``obj`` (it carries its owner reference)."""

    obj: Obj


@dataclasses.dataclass(frozen=True, slots=True)
class Replace:
    """Replace an object we own with ``obj`` (its resourceVersion guards against races)."""

    obj: Obj


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    """Delete an object we own (checked by the planner: our owner reference is on it)."""

    api_version: str
    kind: str
    namespace: str | None
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class PatchNode:
    """A JSON merge patch of a node (labels, our annotation, cordon)."""

    name: str
    patch: Obj


@dataclasses.dataclass(frozen=True, slots=True)
class Evict:
    """Evict a GCU pod from a node being drained (the Eviction API honours PDBs)."""

    namespace: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class SetFinalizers:
    """Set the GcuResource's finalizers (ours added on the first reconcile, removed last)."""

    finalizers: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class WriteStatus:
    """Replace the GcuResource's status subresource."""

    status: Obj


Action = Create | Replace | Delete | PatchNode | Evict | SetFinalizers | WriteStatus


def describe(action: object) -> str:
    """What ``action`` does to which object, for a status condition and an Event."""
    if isinstance(action, Create | Replace):
        meta = action.obj.get("metadata", {})
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        verb = "create" if isinstance(action, Create) else "update"
        return f"{verb} {action.obj.get('kind')} {where}{meta.get('name')}"
    if isinstance(action, Delete):
        where = f"{action.namespace}/" if action.namespace else ""
        return f"delete {action.kind} {where}{action.name}"
    if isinstance(action, PatchNode):
        return f"patch Node {action.name}"
    if isinstance(action, Evict):
        return f"evict Pod {action.namespace}/{action.name}"
    if isinstance(action, SetFinalizers):
        return "set the resource's finalizers"
    return "write the resource's status"
