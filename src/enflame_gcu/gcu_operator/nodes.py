"""One node as a resource sees it: its mode, its component pods, its validation and upgrade."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from enflame_gcu.gcu_operator import components, names, nodestate, pods
from enflame_gcu.gcu_operator import resource as rs

DAEMON_KEYS = (rs.TOOLKIT, rs.DEVICE_PLUGIN, rs.DRA)
# The components that serve GCUs to pods: a node neither selects is not the resource's node.
SERVING_KEYS = (rs.DEVICE_PLUGIN, rs.DRA)
# Tolerations the DaemonSet controller gives every DaemonSet pod by itself (a cordoned or
# pressured node still runs daemons); the operator's own come from components.TOLERATIONS.
DAEMONSET_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
DRA_MINIMUM = "Kubernetes >= 1.34 (resource.k8s.io/v1)"


def is_gcu_node(node: Mapping[str, Any]) -> bool:
    """Whether the node carries one of the GCU node labels."""
    node_labels = node.get("metadata", {}).get("labels") or {}
    return any(node_labels.get(k) == v for k, v in names.GCU_NODE_LABELS)


def combined(parts: Sequence[tuple[str, str]]) -> str:
    """One digest for the pods (component, template hash) a node runs: what a validation covers."""
    if not parts or any(not h for _, h in parts):
        return ""
    text = ";".join(f"{k}={h}" for k, h in sorted(parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """Everything the planner needs to know about one node."""

    name: str
    node: Mapping[str, Any]
    mode: str
    mode_error: str
    components: tuple[str, ...]  # daemon components that belong on this node
    pods: Mapping[str, Mapping[str, Any]]  # component -> its live pod here
    state: nodestate.NodeState
    # Why no new pod of a component here can be placed (an untolerated taint); "" when one can.
    blocked: str = ""
    # A mode change not yet begun (device plugin <-> DRA): the components the node is to run,
    # while ``components`` and ``mode`` are still what it runs now.
    wanted: tuple[str, ...] | None = None
    # Components whose pod here is still terminating.
    terminating: tuple[str, ...] = ()

    @property
    def switching(self) -> bool:
        """Whether the node is to change mode (and has not begun to)."""
        return self.wanted is not None and set(self.wanted) != set(self.components)

    @property
    def labels(self) -> Mapping[str, str]:
        """The node's labels."""
        return self.node.get("metadata", {}).get("labels") or {}

    def pod_hash(self, key: str) -> str:
        """The template hash of the component's pod here ("" when none)."""
        pod = self.pods.get(key)
        return pods.template_hash(pod) if pod else ""

    def running_target(self) -> str:
        """What a validation of this node covers now: the pods it runs ("" while one is missing)."""
        return combined([(k, self.pod_hash(k)) for k in self.components])

    def desired_target(self, hashes: Mapping[str, str]) -> str:
        """What the node runs once every component here is current."""
        return combined([(k, hashes.get(k, "")) for k in self.wanted or self.components])

    def outdated(self, hashes: Mapping[str, str]) -> list[str]:
        """Components whose pod here was made from an older template (a fallback pod always:
        it runs outside its DaemonSet, which must take the node back)."""
        return [
            k
            for k in self.components
            if k in self.pods
            and (self.pod_hash(k) != hashes.get(k) or components.is_fallback(self.pods[k]))
        ]

    def all_ready(self) -> bool:
        """Every component here has a ready pod (current or not)."""
        return all(k in self.pods and pods.ready(self.pods[k]) for k in self.components)

    def ready_since(self) -> float | None:
        """When the last of this node's component pods became Ready (None while one is not
        Ready, or does not say when)."""
        times = [
            pods.ready_since(self.pods[k]) if k in self.pods else None for k in self.components
        ]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)


def _matches(node: Mapping[str, Any], term: Mapping[str, Any]) -> bool:
    """A node selector term (its expressions ANDed) as the scheduler reads it."""
    meta = node.get("metadata") or {}
    fields = {"metadata.name": str(meta.get("name"))}
    for source, have in (("matchExpressions", meta.get("labels") or {}), ("matchFields", fields)):
        for expr in term.get(source) or ():
            if not isinstance(expr, Mapping):
                return False
            op, values = expr.get("operator"), expr.get("values") or []
            value = have.get(str(expr.get("key")))
            if op == "In":
                ok = value is not None and value in values
            elif op == "NotIn":
                ok = value is None or value not in values
            elif op in ("Exists", "DoesNotExist"):
                ok = (value is not None) == (op == "Exists")
            elif op in ("Gt", "Lt"):
                try:
                    number, bound = int(str(value)), int(str(values[0]))
                except (IndexError, ValueError):
                    return False
                ok = number > bound if op == "Gt" else number < bound
            else:
                return False
            if not ok:
                return False
    return True


def affinity_admits(node: Mapping[str, Any], affinity: Mapping[str, Any] | None) -> bool:
    """Whether the required node affinity (any of its terms) admits ``node``."""
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return True
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, Mapping)]
    return any(_matches(node, t) for t in terms)


def in_scope(node: Mapping[str, Any], component: rs.Component) -> bool:
    """Whether the component's nodeSelector and required node affinity select ``node``."""
    node_labels = node.get("metadata", {}).get("labels") or {}
    return all(node_labels.get(k) == v for k, v in component.node_selector) and (
        affinity_admits(node, component.affinity)
    )


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if not key:
        return toleration.get("operator") == "Exists"
    if key != taint.get("key"):
        return False
    return toleration.get("operator") == "Exists" or (toleration.get("value") or "") == (
        taint.get("value") or ""
    )


def untolerated(
    node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The node's NoSchedule and NoExecute taints none of ``tolerations`` matches (a cordon
    counts as the node.kubernetes.io/unschedulable taint the node controller adds for it)."""
    spec = node.get("spec") or {}
    taints = [
        t
        for t in spec.get("taints") or ()
        if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if spec.get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return [t for t in taints if not any(_tolerates(x, t) for x in tolerations)]


def describe_taint(taint: Mapping[str, Any]) -> str:
    """A taint as kubectl writes it: key=value:Effect."""
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _blocked(
    node: Mapping[str, Any], spec: rs.ResourceSpec, keys: Sequence[str], operator: Sequence[Any]
) -> str:
    """Why the DaemonSet controller would place no pod of ``keys`` on ``node`` ("" if it would)."""
    reasons = []
    for key in keys:
        component = spec.components[key]
        found = untolerated(node, [*operator, *DAEMONSET_TOLERATIONS, *component.tolerations])
        if found:
            reasons.append(
                f"{', '.join(describe_taint(t) for t in found)} not tolerated by spec.{key}"
                ".tolerations"
            )
    return f"no pod can run here: taint {'; '.join(reasons)}" if reasons else ""


def mode_of(node: Mapping[str, Any], spec: rs.ResourceSpec, dra_served: bool) -> tuple[str, str]:
    """device-plugin or dra for this node, and why not DRA when the node asked for it."""
    asks_dra = (node.get("metadata", {}).get("labels") or {}).get(names.MODE_LABEL) == "dra"
    if spec.wants(rs.DRA) and (asks_dra or not spec.wants(rs.DEVICE_PLUGIN)):
        if dra_served:
            return "dra", ""
        error = f"DRA needs {DRA_MINIMUM}, which this cluster does not serve"
        if spec.wants(rs.DEVICE_PLUGIN):
            return "device-plugin", error + "; serving GCUs through the device plugin"
        return "none", error
    if asks_dra and not spec.wants(rs.DRA):
        return "device-plugin", "node asks for DRA (enflame.com/gcu.mode=dra) but spec.dra is off"
    return ("device-plugin" if spec.wants(rs.DEVICE_PLUGIN) else "none"), ""


def serves(view: NodeView, spec: rs.ResourceSpec) -> bool:
    """Whether ``view``'s node is the resource's: a serving component (device plugin or DRA)
    runs there (or, with neither in the resource, any component), or it asked for one the
    cluster cannot serve (reported there)."""
    if not any(spec.wants(k) for k in SERVING_KEYS):
        return bool(view.components)
    return any(k in view.components for k in SERVING_KEYS) or (
        view.mode == "none" and bool(view.mode_error)
    )


def view(
    node: Mapping[str, Any],
    resource: str,
    spec: rs.ResourceSpec,
    dra_served: bool,
    node_pods: Sequence[Mapping[str, Any]],
) -> NodeView:
    """The planner's view of ``node``."""
    mode, error = mode_of(node, spec, dra_served)
    wanted = []
    for key in DAEMON_KEYS:
        component = spec.components.get(key)
        if component is None or not in_scope(node, component):
            continue
        if (
            key == rs.TOOLKIT
            or (key == rs.DEVICE_PLUGIN and mode == "device-plugin")
            or (key == rs.DRA and mode == "dra")
        ):
            wanted.append(key)
    live: dict[str, Mapping[str, Any]] = {}
    terminating = []
    for pod in node_pods:
        key = str((pod.get("metadata", {}).get("labels") or {}).get(names.COMPONENT_LABEL))
        if key not in DAEMON_KEYS:
            continue
        if pod.get("metadata", {}).get("deletionTimestamp"):
            terminating.append(key)
            continue
        if key in live and components.is_fallback(pod):
            continue  # the DaemonSet's pod is what the node runs while both are there
        live[key] = pod
    return NodeView(
        name=str(node["metadata"]["name"]),
        node=node,
        mode=mode,
        mode_error=error,
        components=tuple(wanted),
        pods=live,
        state=nodestate.read(node, resource),
        blocked=_blocked(node, spec, wanted, components.TOLERATIONS),
        terminating=tuple(sorted(set(terminating))),
    )


def deployed_serving(view: NodeView) -> tuple[str, ...]:
    """The serving components this resource deployed on the node (its recorded labels)."""
    return tuple(k for k in SERVING_KEYS if names.deploy_label(k) in view.state.labels)


def as_running(view: NodeView) -> NodeView:
    """``view`` as the node runs now when it is to change mode: the serving component it
    deployed (with the toolkit) until its turn in the rollout comes; ``view`` itself otherwise
    (a first deploy, or no change)."""
    have = deployed_serving(view)
    want = tuple(k for k in view.components if k in SERVING_KEYS)
    if not have or set(have) == set(want):
        return view
    running = tuple(
        k for k in DAEMON_KEYS if k in have or (k == rs.TOOLKIT and k in view.components)
    )
    mode = "dra" if rs.DRA in have else "device-plugin"
    return dataclasses.replace(
        view, components=running, mode=mode, mode_error="", wanted=view.components
    )
