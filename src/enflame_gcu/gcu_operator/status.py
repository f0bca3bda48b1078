"""The status a reconcile reports: the vendor's fields (phase, readyResource, conditions,
resourceStatuses, clusterGCUNodes) and ours (nodes[], rollout, unsupported)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from enflame_gcu.gcu_operator import nodes, nodestate, pods
from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.gcu_operator.actions import WriteStatus

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Rollout:
    """Where an upgrade stands: nodes being upgraded, waiting, and failed (with why)."""

    upgrading: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    blocked: tuple[str, ...] = ()


# How many problem nodes the status names (the rest are counted; every node's report is in its
# own annotation): at 5,000 nodes, one report each would pass etcd's 1.5 MiB request limit.
NODE_REPORT_LIMIT = 10
# How many node names a list in the status (rollout.waiting) or a condition message names.
NAME_LIMIT = 20
# A lastError in the status is cut here (the node's annotation keeps it whole).
ERROR_LIMIT = 1024


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAME_LIMIT])
    more = len(items) - NAME_LIMIT
    return shown + (f" and {more} more" if more > 0 else "")


def node_report(
    view: nodes.NodeView,
    *,
    state: nodestate.NodeState,
    hashes: Mapping[str, str],
    now: float,
    timeout: int,
    validating: bool,
) -> tuple[Obj, dict[str, bool]]:
    comps: list[Obj] = []
    ready: dict[str, bool] = {}
    errors = [e for e in (view.blocked, view.mode_error) if e]
    for key in view.components:
        pod = view.pods.get(key)
        if pod is None:
            state_text = "Pending"
        elif pods.template_hash(pod) != hashes.get(key):
            state_text = "Outdated"
        elif pods.ready(pod):
            state_text = "Ready"
        else:
            reason = pods.failure(pod, now, timeout)
            state_text = "Failed" if reason else "Starting"
            if reason:
                errors.append(reason)
        comps.append({"name": key, "state": state_text})
        ready[key] = state_text == "Ready"
    target = view.running_target()
    validated = bool(target) and state.validated_target == target and state.validated_ok
    if validating and state.validated_target == target and not state.validated_ok and target:
        errors.append(state.validation_message)
    elif validating and target and not state.validated_target and state.validation_message:
        errors.append(state.validation_message)  # a validator pod refused, tried again
    report: Obj = {
        "name": view.name,
        "mode": view.mode,
        "components": comps,
        "ready": f"{sum(ready.values())}/{len(ready)}",
        "validated": validated,
        "lastError": "; ".join(e for e in errors if e),
    }
    return report, ready


def _keep_time(old: Mapping[str, Any], condition: Obj, now: float) -> Obj:
    for previous in old.get("conditions") or []:
        same = all(previous.get(k) == condition.get(k) for k in condition)
        if same and previous.get("lastUpdateTime"):
            return {**condition, "lastUpdateTime": previous["lastUpdateTime"]}
    return {**condition, "lastUpdateTime": pods.rfc3339(now)}


def node_reports(
    spec: rs.ResourceSpec,
    views: Sequence[nodes.NodeView],
    states: Mapping[str, nodestate.NodeState],
    hashes: Mapping[str, str],
    now: float,
) -> list[tuple[Obj, dict[str, bool]]]:
    """Every node's report and which of its components are ready, in ``views``' order."""
    return [
        node_report(
            view,
            state=states[view.name],
            hashes=hashes,
            now=now,
            timeout=spec.upgrade.pod_ready_timeout,
            validating=spec.wants(rs.VALIDATOR),
        )
        for view in views
    ]


def _problem(report: Mapping[str, Any], validating: bool) -> bool:
    ready, _, total = str(report["ready"]).partition("/")
    unvalidated = validating and report["mode"] != "none" and not report["validated"]
    return bool(report["lastError"]) or ready != total or unvalidated


def build(
    resource: Mapping[str, Any],
    *,
    spec: rs.ResourceSpec,
    views: Sequence[nodes.NodeView],
    reports: Sequence[tuple[Obj, dict[str, bool]]],
    rollout: Rollout,
    conflicted: set[str],
    conflicts: Sequence[str],
    want: Mapping[str, Obj],
    now: float,
    taken: Mapping[tuple[str, str], str] | None = None,
) -> Obj:
    """The status for a resource that is not being deleted: counts, and the first few nodes
    with a problem (every node's report is on the Node, in the operator's state annotation)."""
    validating = spec.wants(rs.VALIDATOR)
    node_reports = []
    ready_by_node: list[dict[str, bool]] = []
    for view, (report, ready) in zip(views, reports, strict=True):
        node_reports.append(report)
        if not view.blocked:
            # A node where no pod can be placed is reported, and not waited for.
            ready_by_node.append(ready)
    blocked = [v.name for v in views if v.blocked]

    def daemon_ready(key: str) -> bool:
        return key not in conflicted and all(r.get(key, True) for r in ready_by_node)

    component_ready = {
        rs.TOOLKIT: daemon_ready(rs.TOOLKIT),
        rs.DEVICE_PLUGIN: daemon_ready(rs.DEVICE_PLUGIN),
        rs.DRA: daemon_ready(rs.DRA),
        rs.EXPORTER: rs.EXPORTER not in conflicted and daemon_ready(rs.DEVICE_PLUGIN),
        rs.GFD: daemon_ready(rs.DEVICE_PLUGIN),
        rs.VALIDATOR: all(
            r["validated"] for r in node_reports if r["mode"] != "none" and r["name"] not in blocked
        ),
    }
    keys = [k for k in rs.ORDER if spec.wants(k)]
    ready_count = sum(1 for k in keys if component_ready[k])
    statuses = []
    for key in keys:
        comp = spec.components[key]
        obj = want.get(key)
        own = []
        if obj is not None:
            group, _, version = str(obj["apiVersion"]).rpartition("/")
            ref = {"kind": obj["kind"], "name": obj["metadata"]["name"], "version": version}
            if group:
                ref["group"] = group
            own.append(ref)
        text = (
            "Conflict" if key in conflicted else "Running" if component_ready[key] else "Deploying"
        )
        statuses.append(
            {"name": key, "namespace": comp.namespace, "status": text, "ownResources": own}
        )
    if rollout.failed:
        phase, action, state = "Failed", "upgrade", "failed"
        message = "; ".join(f"node {n}: {why[:ERROR_LIMIT]}" for n, why in rollout.failed[:5])
        if len(rollout.failed) > 5:
            message += f"; and {len(rollout.failed) - 5} more nodes"
        message += (
            " (the rollout stopped; fix it, or set the previous version to roll back; a node"
            " back on its previous version tries the new one again once the resource is edited)"
        )
    elif conflicts:
        phase, action, state, message = "Failed", "deploy", "failed", "; ".join(conflicts)
    elif rollout.upgrading or rollout.waiting:
        phase, action, state = "Upgrading", "upgrade", "upgrading"
        message = f"upgrading {_names(rollout.upgrading) or '-'}"
        if rollout.waiting:
            message += f"; waiting: {_names(rollout.waiting)}"
        if rollout.blocked:
            message += "; " + "; ".join(b[:ERROR_LIMIT] for b in rollout.blocked[:5])
    elif ready_count < len(keys):
        phase, action, state = "Deploying", "deploy", "deploying"
        message = "waiting for " + ", ".join(k for k in keys if not component_ready[k])
    else:
        phase, action, state, message = "Running", "deploy", "success", "success"
    if blocked and phase in ("Running", "Deploying", "Upgrading"):
        message += (
            f"; no pod can run on {_names(blocked)} (an untolerated taint: see the node's "
            "lastError)"
        )
    shared = sorted((taken or {}).items())
    if shared:
        named = [f"{key} on {node} ({owner}'s)" for (key, node), owner in shared]
        message += f"; not deployed where another resource owns them: {_names(named)}"
    progress = 100 if not keys else ready_count * 100 // len(keys)
    condition = {
        "action": action,
        "status": state,
        "progress": progress,
        "reason": phase,
        "message": message,
    }
    old = resource.get("status") or {}
    problems = [r for r in node_reports if _problem(r, validating)]
    return {
        "observedGeneration": int(resource["metadata"].get("generation") or 0),
        "phase": phase,
        "readyResource": f"{ready_count}/{len(keys)}",
        "clusterGCUNodes": [v.name for v in views],
        "conditions": [_keep_time(old, condition, now)],
        "resourceStatuses": statuses,
        "nodeCounts": {
            "total": len(node_reports),
            "ready": sum(1 for r in node_reports if not _problem(r, False)),
            "validated": sum(1 for r in node_reports if r["validated"]),
            "problems": len(problems),
        },
        "nodes": [
            {**r, "lastError": str(r["lastError"])[:ERROR_LIMIT]}
            for r in problems[:NODE_REPORT_LIMIT]
        ],
        "rollout": {
            "upgrading": list(rollout.upgrading[:NAME_LIMIT]),
            "waiting": list(rollout.waiting[:NAME_LIMIT]),
            "counts": {
                "upgrading": len(rollout.upgrading),
                "waiting": len(rollout.waiting),
                "failed": len(rollout.failed),
            },
            "failed": [
                {"node": n, "reason": r[:ERROR_LIMIT]} for n, r in rollout.failed[:NAME_LIMIT]
            ],
        },
        "unsupported": [{"field": u.field, "reason": u.reason} for u in spec.unsupported],
        **(
            {
                "conflicts": [
                    {"component": key, "node": node, "owner": owner}
                    for (key, node), owner in shared[:NAME_LIMIT]
                ]
            }
            if shared
            else {}
        ),
    }


def ignored(resource: Mapping[str, Any], message: str, now: float) -> Obj:
    """The status of a resource that deploys nothing: an older one owns its nodes."""
    old = dict(resource.get("status") or {})
    condition = {
        "action": "deploy",
        "status": "ignored",
        "progress": 0,
        "reason": "Conflict",
        "message": message,
    }
    return {
        "observedGeneration": int(resource["metadata"].get("generation") or 0),
        "phase": "Ignored",
        "readyResource": "0/0",
        "clusterGCUNodes": [],
        "conditions": [_keep_time(old, condition, now)],
        "resourceStatuses": [],
        "nodes": [],
    }


def removing(
    resource: Mapping[str, Any],
    done: int,
    stages: int,
    now: float,
    *,
    stuck: Sequence[str] = (),
    given_up: bool = False,
) -> Obj:
    """The status while the resource's components are being removed."""
    old = dict(resource.get("status") or {})
    message = f"removing components in reverse order: {done}/{stages} stages done"
    if stuck and given_up:
        message += (
            "; left behind on NotReady nodes (their kubelet never confirmed; a toolkit there "
            "did not undo its changes: run enflame-ctk uninstall on the node): " + ", ".join(stuck)
        )
    elif stuck:
        message += "; waiting for pods on NotReady nodes: " + ", ".join(stuck)
    condition = {
        "action": "delete",
        "status": "deleting",
        "progress": done * 100 // stages,
        "reason": "Deleting",
        "message": message,
    }
    return {**old, "phase": "Deleting", "conditions": [_keep_time(old, condition, now)]}


def write(report: Obj) -> WriteStatus:
    """The action that writes ``report``."""
    return WriteStatus(report)
