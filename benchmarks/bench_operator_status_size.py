"""The GcuResource's size at 5,000 simulated nodes (issue 47, point 11); prints JSON.

etcd refuses a request over 1.5 MiB by default (``--max-request-bytes``), so a status that
grows with the cluster fails to be written exactly when it has most to report. This builds the
operator's own view of N GCU nodes (each running the toolkit and the device plugin, Ready, as
the planner reads them from the API) and asks :func:`reconcile.plan` for the status, then
measures the resource as it would be written (JSON, as the API server stores it):

- ``healthy``: every node validated;
- ``one_error_each``: every node's last validation failed, with the validator's message;
- ``rollout``: a new device plugin version, every node waiting (the rollout's lists).

Also the largest per-node report the operator writes on a Node (its state annotation). Sizes
in bytes. ``ENFLAME_BENCH_NODES`` (default ``5000``) sets N. Pure planning: no API server.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.gcu_operator import components, names, nodes, nodestate, reconcile
from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.gcu_operator.actions import PatchNode

LIMIT = 256 * 1024
ETCD_LIMIT = int(1.5 * 1024 * 1024)
CREATED = "2026-01-01T00:00:00Z"


def _resource(version: str = "") -> dict[str, Any]:
    plugin: dict[str, Any] = {"nodeSelector": {"enflame.com/gcu.present": "true"}}
    if version:
        plugin["version"] = version
    return {
        "apiVersion": f"{rs.GROUP}/{rs.VERSION}",
        "kind": rs.KIND,
        "metadata": {"name": "enflame-gcu-resource", "uid": "u-1", "generation": 1},
        "spec": {"containerToolkit": {}, "devicePlugin": plugin, "gcuExporter": {}, "gfd": {}},
    }


def _pod(key: str, node: str, template_hash: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{key}-{node}",
            "namespace": "kube-system",
            "labels": {names.COMPONENT_LABEL: key},
            "annotations": {names.TEMPLATE_HASH: template_hash},
            "creationTimestamp": CREATED,
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": CREATED}],
        },
    }


def _cluster(count: int, failing: bool) -> tuple[list[Any], list[Any]]:
    """N nodes as a converged operator left them, and their component pods."""
    resource = _resource()
    spec = rs.parse(resource["spec"])
    want = components.desired(resource, spec)
    hashes = {
        k: o["spec"]["template"]["metadata"]["annotations"][names.TEMPLATE_HASH]
        for k, o in want.items()
        if o["kind"] == "DaemonSet"
    }
    keys = (rs.TOOLKIT, rs.DEVICE_PLUGIN)
    target = nodes.combined([(k, hashes[k]) for k in keys])
    key = f"{rs.GROUP}/{resource['metadata']['name']}"
    node_list: list[Any] = []
    pod_list: list[Any] = []
    for i in range(count):
        name = f"gcu-node-{i:05d}"
        labels = {
            "enflame.com/gcu.present": "true",
            **{names.deploy_label(k): "true" for k in keys},
        }
        message = (
            f"validator pod enflame-gcu-validator-{target[:8]}-{name}: /dev/gcu3 is missing "
            "(ENFLAME_VISIBLE_DEVICES=3)"
            if failing
            else ""
        )
        state = nodestate.NodeState(
            labels=frozenset([*(names.deploy_label(k) for k in keys)]),
            validated_target=target,
            validated_ok=not failing,
            validation_message=message,
        )
        if not failing:
            labels[names.VALIDATED_LABEL] = "true"
            state = nodestate.NodeState(
                labels=state.labels | {names.VALIDATED_LABEL},
                validated_target=target,
                validated_ok=True,
            )
        node: dict[str, Any] = {"metadata": {"name": name, "labels": labels}, "spec": {}}
        node["metadata"]["annotations"] = {
            names.NODE_STATE_ANNOTATION: nodestate.annotation(node, key, state)
        }
        node_list.append(node)
        pod_list.extend(_pod(k, name, hashes[k]) for k in keys)
    return node_list, pod_list


def measure(count: int, failing: bool, version: str = "") -> dict[str, Any]:
    node_list, pod_list = _cluster(count, failing)
    resource = _resource(version)
    spec = rs.parse(resource["spec"])
    objects = {}
    for obj in components.desired(resource, spec).values():
        objects[
            (str(obj["kind"]), str(obj["metadata"].get("namespace") or ""), obj["metadata"]["name"])
        ] = obj
    started = time.perf_counter()
    plan = reconcile.plan(
        reconcile.Observed(
            resource=resource,
            nodes=node_list,
            objects=objects,
            pods=pod_list,
            dra_served=False,
            now=time.time(),
        )
    )
    seconds = time.perf_counter() - started
    written = {**resource, "status": plan.status}
    annotations = [
        len(
            str(
                a.patch.get("metadata", {})
                .get("annotations", {})
                .get(names.NODE_STATE_ANNOTATION, "")
            )
        )
        for a in plan.actions
        if isinstance(a, PatchNode)
    ]
    size = len(json.dumps(written, separators=(",", ":")))
    return {
        "nodes": count,
        "resource_bytes": size,
        "status_bytes": len(json.dumps(plan.status, separators=(",", ":"))),
        "within_256KiB": size <= LIMIT,
        "within_etcd_1_5MiB": size <= ETCD_LIMIT,
        "phase": plan.status.get("phase"),
        "node_patches": len(annotations),
        "largest_node_annotation_bytes": max(annotations, default=0),
        "plan_seconds": round(seconds, 3),
    }


def main() -> None:
    count = int(os.environ.get("ENFLAME_BENCH_NODES", "5000"))
    out = {
        "benchmark": "operator_status_size",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "load": os.getloadavg(),
        "healthy": measure(count, failing=False),
        "one_error_each": measure(count, failing=True),
        "rollout": measure(count, failing=False, version="0.2.0"),
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
