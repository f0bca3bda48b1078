"""Comparing what exists with what should: ownership, subset equality, the replacement."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]
# Kinds whose content is in top-level fields, not in spec (a ServiceAccount: none we set).
TOP_LEVEL = {
    "ClusterRole": ("rules",),
    "ClusterRoleBinding": ("subjects", "roleRef"),
    "Role": ("rules",),
    "RoleBinding": ("subjects", "roleRef"),
}

WEBHOOK_CONFIGURATION = "MutatingWebhookConfiguration"


def key(obj: Mapping[str, Any]) -> Key:
    """(kind, namespace, name) of an object."""
    meta = obj.get("metadata", {})
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` carries an owner reference to the object with ``uid``."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def is_subset(want: Any, have: Any) -> bool:
    """Whether everything in ``want`` is in ``have`` (the API server adds defaults we ignore,
    and drops an empty list or map we set: absent is what it stores for ``[]`` and ``{}``)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            is_subset(v, have[k]) if k in have else _empty(v) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


def _empty(value: Any) -> bool:
    """An empty list or map: what the API server leaves out of what it stores (``omitempty``;
    a NetworkPolicy's ``ingress: []`` reads back without ``ingress``, which would otherwise be
    a difference every pass, and a replacement of an unchanged object every --interval)."""
    return isinstance(value, (list, Mapping)) and not value


def needs_update(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """Whether the object we own differs from what it should be in what we set."""
    meta_want, meta_have = want.get("metadata", {}), have.get("metadata", {})
    for field in ("labels", "annotations"):
        if not is_subset(meta_want.get(field) or {}, meta_have.get(field) or {}):
            return True
    if want.get("kind") == "DaemonSet":
        return _template_drifted(want["spec"], have.get("spec") or {})
    if want.get("kind") == WEBHOOK_CONFIGURATION:
        # A subset: the caBundle cert-manager injects is no difference.
        return not is_subset(want.get("webhooks"), have.get("webhooks"))
    if want.get("kind") in TOP_LEVEL or want.get("kind") == "ServiceAccount":
        # Exactly: a rule or subject added by hand would grant more than we meant.
        return any(want.get(f) != have.get(f) for f in TOP_LEVEL.get(str(want["kind"]), ()))
    return not is_subset(want.get("spec", {}), have.get("spec", {}))


def _template_drifted(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet's spec differs from ours: everything we set must be there as we set
    it (the server's defaults are extra fields, which is_subset ignores), and the maps that
    decide where pods run or what they are (nodeSelector, the template's labels) exactly."""
    if not is_subset({k: v for k, v in want.items() if k != "template"}, have):
        return True
    template = want["template"]
    have_template = have.get("template") or {}
    if not is_subset(template, have_template):
        return True  # a hand-edited image, argument, volume, probe, toleration...
    have_spec = have_template.get("spec") or {}
    if (template["spec"].get("nodeSelector") or {}) != (have_spec.get("nodeSelector") or {}):
        return True  # a key added by hand would narrow (or move) where the pods run
    return (template["metadata"].get("labels") or {}) != (
        (have_template.get("metadata") or {}).get("labels") or {}
    )


def _keep_ca_bundles(want: list[Any], have: list[Any]) -> list[Any]:
    """Our webhooks, each with the caBundle the one of its name holds (cert-manager's)."""
    bundles = {
        h.get("name"): (h.get("clientConfig") or {}).get("caBundle")
        for h in have
        if isinstance(h, Mapping)
    }
    out = copy.deepcopy(want)
    for hook in out:
        bundle = bundles.get(hook.get("name"))
        if bundle:
            hook.setdefault("clientConfig", {})["caBundle"] = bundle
    return out


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
    elif want.get("kind") == WEBHOOK_CONFIGURATION:
        out["webhooks"] = _keep_ca_bundles(want.get("webhooks") or [], have.get("webhooks") or [])
    elif want.get("kind") in TOP_LEVEL or want.get("kind") == "ServiceAccount":
        for field in TOP_LEVEL.get(str(want["kind"]), ()):
            out[field] = copy.deepcopy(want[field])
    else:
        # A Service keeps its clusterIP: only our keys are replaced.
        out["spec"] = {**out.get("spec", {}), **copy.deepcopy(want.get("spec", {}))}
    out.pop("status", None)
    return out
