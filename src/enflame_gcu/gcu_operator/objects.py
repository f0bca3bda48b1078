"""Comparing what exists with what should: ownership, subset equality, the replacement."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]


def key(obj: Mapping[str, Any]) -> Key:
    """(kind, namespace, name) of an object."""
    meta = obj.get("metadata", {})
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` carries an owner reference to the object with ``uid``."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def is_subset(want: Any, have: Any) -> bool:
    """Whether everything in ``want`` is in ``have`` (the API server adds defaults we ignore)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            k in have and is_subset(v, have[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


def needs_update(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """Whether the object we own differs from what it should be in what we set."""
    meta_want, meta_have = want.get("metadata", {}), have.get("metadata", {})
    for field in ("labels", "annotations"):
        if not is_subset(meta_want.get(field) or {}, meta_have.get(field) or {}):
            return True
    if want.get("kind") == "DaemonSet":
        # The template's hash stands for the whole template (server defaults do not change it).
        return not is_subset(
            {k: v for k, v in want["spec"].items() if k != "template"}, have.get("spec", {})
        ) or not is_subset(
            want["spec"]["template"]["metadata"], have["spec"]["template"]["metadata"]
        )
    return not is_subset(want.get("spec", {}), have.get("spec", {}))


def replacement(want: Mapping[str, Any], have: Mapping[str, Any]) -> Obj:
    """``have`` with our fields from ``want``: a PUT body that keeps what the server owns."""
    out = copy.deepcopy(dict(have))
    meta = out.setdefault("metadata", {})
    for field in ("labels", "annotations"):
        merged = dict(meta.get(field) or {})
        merged.update(want.get("metadata", {}).get(field) or {})
        if merged:
            meta[field] = merged
    meta["ownerReferences"] = copy.deepcopy(want["metadata"]["ownerReferences"])
    if want.get("kind") == "DaemonSet":
        out["spec"] = copy.deepcopy(want["spec"])
    else:
        # A Service keeps its clusterIP: only our keys are replaced.
        out["spec"] = {**out.get("spec", {}), **copy.deepcopy(want.get("spec", {}))}
    out.pop("status", None)
    return out
