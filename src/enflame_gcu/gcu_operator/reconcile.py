"""One reconcile of one GcuResource: what exists -> the actions that move it to what should.

Pure: :func:`plan` reads an :class:`Observed` snapshot and returns a :class:`Plan` (actions in
order, and the status to report); it keeps nothing between calls. Whatever it must remember
(labels it set, a node's validation, the upgrade a node is part of) is written to the API, so
an operator killed at any step and started again plans the same next step.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from enflame_gcu.gcu_operator import (
    components,
    names,
    nodes,
    nodestate,
    objects,
    pods,
    status,
    webhook,
)
from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.gcu_operator.actions import (
    Action,
    Create,
    Delete,
    Evict,
    PatchNode,
    Replace,
    SetFinalizers,
)

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Observed:
    """What the API said, read just before planning."""

    resource: Mapping[str, Any]
    nodes: Sequence[Mapping[str, Any]]
    # Objects at the names the components want, and every object labelled with this resource.
    objects: Mapping[objects.Key, Mapping[str, Any]]
    # Pods labelled with this resource (component and validator pods).
    pods: Sequence[Mapping[str, Any]]
    dra_served: bool
    now: float
    # Pods that use GCUs (read only when drain is on), for cordon + drain.
    gcu_pods: Sequence[Mapping[str, Any]] = ()
    # Why this resource must deploy nothing: an older resource owns its components' nodes.
    conflict: str = ""
    # (component, node) pairs this resource wants that another one owns, and that one's name.
    taken: Mapping[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    # The DRA driver's ServiceAccount (the chart's <release>-dra-plugin).
    dra_service_account: str = components.DRA_SERVICE_ACCOUNT
    # The namespace whose Prometheus may scrape the device plugin ("": none).
    scraper_namespace: str = ""
    # Namespaces this operator may deploy components to (empty: any).
    allowed_namespaces: frozenset[str] = frozenset()
    # Evictions the API refused last pass (429: a PodDisruptionBudget), by "namespace/name".
    blocked: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Whether cert-manager.io/v1 is served (the DRA webhook's certificate).
    cert_manager_served: bool = False
    # The enflame.com/gcu cards the unfinished pods bound to a node ask for (None: unread), asked
    # only of a node about to get a validator pod; None here: never asked (the kubelet decides).
    held_cards: Callable[[str], int | None] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """The actions, in order, and the status they lead to."""

    actions: tuple[Action, ...]
    status: Obj


@dataclasses.dataclass(slots=True)
class _Work:
    """What one reconcile builds up while planning."""

    actions: list[Action] = dataclasses.field(default_factory=list)
    node_patches: dict[str, tuple[dict[str, str | None], nodestate.NodeState]] = dataclasses.field(
        default_factory=dict
    )
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    conflicts: list[str] = dataclasses.field(default_factory=list)
    # Pod deletions of a rollout: carried out only after the nodes' intent is written.
    after_intent: list[Action] = dataclasses.field(default_factory=list)
    drain_failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    drain_blocked: list[str] = dataclasses.field(default_factory=list)
    # Nodes of the rollout that are drained (or need no drain): a mode change goes ahead there.
    cleared: set[str] = dataclasses.field(default_factory=set)
    # How many of the resource's nodes are down (the rollout's budget in use).
    down: int = 0


def _name(observed: Observed) -> str:
    """The resource's key in the nodes' state annotation: group/name (both groups may hold a
    resource of the same name; a resource deleted and created again takes its entry back)."""
    group = str(observed.resource.get("apiVersion", "")).rpartition("/")[0]
    return f"{group}/{observed.resource['metadata']['name']}"


def _uid(observed: Observed) -> str:
    return str(observed.resource["metadata"]["uid"])


def max_unavailable(value: int | str, total: int) -> int:
    """The rollout's batch size: an int, or a percentage of the GCU nodes (at least 1)."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            return max(1, math.floor(float(value[:-1]) * total / 100))
        except ValueError:
            return 1
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def _set_node(
    work: _Work, view: nodes.NodeView, labels: Mapping[str, str | None], state: nodestate.NodeState
) -> None:
    pending, _ = work.node_patches.get(view.name, ({}, view.state))
    work.node_patches[view.name] = ({**pending, **labels}, state)


def _node_patch_actions(observed: Observed, work: _Work, by_name: Mapping[str, Any]) -> None:
    resource = _name(observed)
    for name, (labels, planned) in sorted(work.node_patches.items()):
        node = by_name[name]
        have_labels = node.get("metadata", {}).get("labels") or {}
        changes = {k: v for k, v in labels.items() if have_labels.get(k) != v}
        # A label is ours to remove only when we recorded setting it.
        recorded = set(planned.labels) | {k for k, v in changes.items() if v is not None}
        recorded -= {k for k, v in changes.items() if v is None}
        state = dataclasses.replace(planned, labels=frozenset(recorded))
        old = nodestate.read(node, resource)
        patch: Obj = {}
        if changes:
            patch.setdefault("metadata", {})["labels"] = changes
        if state != old:
            patch.setdefault("metadata", {})["annotations"] = {
                names.NODE_STATE_ANNOTATION: nodestate.annotation(node, resource, state)
            }
        if state.cordoned != old.cordoned:
            patch["spec"] = {"unschedulable": True if state.cordoned else None}
        if patch:
            work.actions.append(PatchNode(name, patch))


def _sync_objects(observed: Observed, want: Mapping[str, Obj], work: _Work) -> set[str]:
    """Create or update the wanted objects, delete ours no longer wanted; the keys in conflict."""
    uid = _uid(observed)
    conflicted: set[str] = set()
    wanted_keys = set()
    for key in (*rs.ORDER, *components.EXTRA_KEYS, *webhook.KEYS):
        obj = want.get(key)
        if obj is None:
            continue
        k = objects.key(obj)
        wanted_keys.add(k)
        have = observed.objects.get(k)
        if have is None:
            work.actions.append(Create(obj))
        elif key == components.RUNTIME_CLASS_KEY and have.get("handler") == obj["handler"]:
            continue  # the chart's or a hand-made RuntimeClass enflame: the same thing, kept
        elif not objects.owned_by(have, uid):
            conflicted.add(key)
            fix = (
                "remove it: the webhook of deploy/dra/ or of the chart uses the same names"
                if key in webhook.KEYS
                else f"remove it, or give spec.{_named_by(key)}.name another name"
            )
            work.conflicts.append(
                f"{k[0]} {k[1]}/{k[2]} exists and was not created by this resource; it is left "
                f"alone ({fix})"
            )
        elif objects.needs_update(obj, have):
            body = objects.replacement(obj, have)
            if obj["kind"] == "DaemonSet":
                _keep_previous(body, have)
            work.actions.append(Replace(body))
    for k, have in sorted(observed.objects.items(), key=lambda item: _removal_rank(item[1])):
        if k not in wanted_keys and objects.owned_by(have, uid):
            work.actions.append(Delete(str(have["apiVersion"]), k[0], k[1] or None, k[2]))
    return conflicted


def _keep_previous(body: Obj, have: Mapping[str, Any]) -> None:
    """Records on a DaemonSet whose pod template changes the one it held: a node where the new
    pod fails runs that one again (see _fall_back)."""
    old = (have.get("spec") or {}).get("template") or {}
    old_hash = ((old.get("metadata") or {}).get("annotations") or {}).get(names.TEMPLATE_HASH)
    new_hash = body["spec"]["template"]["metadata"]["annotations"][names.TEMPLATE_HASH]
    if old_hash and old_hash != new_hash and (old.get("spec") or {}).get("containers"):
        annotations = body["metadata"].setdefault("annotations", {})
        annotations[components.PREVIOUS_TEMPLATE] = json.dumps(
            old, sort_keys=True, separators=(",", ":")
        )


def _named_by(key: str) -> str:
    """The component whose name names the object at ``key`` (the plugin's RBAC: the plugin)."""
    return rs.DEVICE_PLUGIN if key in components.PLUGIN_RBAC_KEYS else key


def _forbidden(observed: Observed, spec: rs.ResourceSpec, work: _Work) -> set[str]:
    """Components whose namespace this operator may not deploy to (reported, not deployed)."""
    allowed = observed.allowed_namespaces
    out = set()
    for key, component in spec.components.items():
        if allowed and component.namespace not in allowed:
            out.add(key)
            work.conflicts.append(
                f"spec.{key}.namespace {component.namespace} is not a namespace this operator "
                f"deploys to (allowed: {', '.join(sorted(allowed))}; the chart's "
                "operator.componentNamespaces)"
            )
    return out


def _namespaces_of(spec: rs.ResourceSpec, keys: set[str]) -> set[str]:
    return {spec.components[k].namespace for k in keys}


def _removal_rank(obj: Mapping[str, Any]) -> int:
    key = (obj.get("metadata", {}).get("labels") or {}).get(names.COMPONENT_LABEL)
    return -rs.ORDER.index(key) if key in rs.ORDER else 0


# How long after a node's component pods became Ready a validator pod the kubelet refuses with
# UnexpectedAdmissionError is made again rather than failed: a restarted kubelet or plugin lists
# its cards within seconds (the chaos runs measured allocatable right again within 23 s of a
# plugin kill, p99).
REFUSAL_GRACE = 60.0


def _validate(
    observed: Observed,
    *,
    spec: rs.ResourceSpec,
    view: nodes.NodeView,
    state: nodestate.NodeState,
    validator_pods: Sequence[Mapping[str, Any]],
    work: _Work,
) -> nodestate.NodeState:
    """Run, read and clean up the validator pod of ``view``'s node; the node's new state."""
    component = spec.components.get(rs.VALIDATOR)
    target = view.running_target()
    ready = component is not None and target != "" and view.all_ready()
    for pod in validator_pods:
        pod_target = (pod["metadata"].get("annotations") or {}).get(names.VALIDATES_ANNOTATION)
        if not ready or pod_target != target or state.validated_target == target:
            if not pod["metadata"].get("deletionTimestamp"):
                work.actions.append(
                    Delete("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
                )
            continue
        result = pods.phase(pod)
        refused = pods.refused_unexpectedly(pod)
        if refused is not None and (_settling(view, pod) or _full(observed, view) is not None):
            # Not a result: the kubelet refused the pod before running it while the node's
            # plugin (re-)registered its cards, or because another pod took the last free
            # card first. Said on the node, and a new validator pod is made once this one is
            # gone and a card is free; a rollout neither stops nor goes on meanwhile.
            state = dataclasses.replace(
                state,
                validated_target="",
                validated_ok=False,
                validation_message=f"validator pod {pod['metadata']['name']} refused by the "
                f"kubelet, trying again: {refused}",
            )
            if pod["metadata"].get("deletionTimestamp"):
                return state  # being deleted: the next one once it is gone
        elif result == "Succeeded":
            state = dataclasses.replace(
                state, validated_target=target, validated_ok=True, validation_message=""
            )
        elif result == "Failed" or pods.failure(pod, observed.now, spec.upgrade.pod_ready_timeout):
            message = (
                pods.termination_message(pod)
                if result == "Failed"
                else str(pods.failure(pod, observed.now, spec.upgrade.pod_ready_timeout))
            )
            state = dataclasses.replace(
                state,
                validated_target=target,
                validated_ok=False,
                validation_message=f"validator pod {pod['metadata']['name']}: {message}",
            )
        else:
            return state
        work.actions.append(
            Delete("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
        )
        return state
    if ready and component is not None and state.validated_target != target:
        live = {p["metadata"]["name"] for p in validator_pods}
        serving = rs.DRA if view.mode == "dra" else rs.DEVICE_PLUGIN
        pod_obj = components.validator_pod(
            observed.resource,
            component,
            view.name,
            target,
            mode=view.mode,
            node_mode=spec.node_mode,
            tolerations=spec.components[serving].tolerations if spec.wants(serving) else (),
        )
        if pod_obj["metadata"]["name"] not in live:
            full = _full(observed, view)
            if full is None:
                work.actions.append(Create(pod_obj))
                return state
            # Every card is held by pods: a validator pod now would only be refused. Wait for
            # one to come free, up to podReadyTimeoutSeconds after the node's pods became Ready;
            # then the node's validation fails, naming why.
            since = view.ready_since()
            timeout = spec.upgrade.pod_ready_timeout
            if since is None or observed.now - since > timeout:
                return dataclasses.replace(
                    state,
                    validated_target=target,
                    validated_ok=False,
                    validation_message=f"validator: no free {names.GCU_RESOURCE} card on the "
                    f"node in {timeout} s ({full})",
                )
            return dataclasses.replace(
                state,
                validated_target="",
                validated_ok=False,
                validation_message=f"validator waiting for a free {names.GCU_RESOURCE} card "
                f"({full})",
            )
    return state


def _full(observed: Observed, view: nodes.NodeView) -> str | None:
    """Why ``view``'s node has no card free for a validator pod (its allocatable cards all held
    by pods bound there), or None when one is free or that cannot be told (no count of held
    cards, no allocatable count in the Node's status)."""
    if observed.held_cards is None or view.mode == "dra":
        return None
    allocatable = (view.node.get("status") or {}).get("allocatable") or {}
    if names.GCU_RESOURCE not in allocatable:
        return None
    try:
        offered = int(str(allocatable[names.GCU_RESOURCE]))
    except ValueError:
        return None
    held = observed.held_cards(view.name)
    if held is None or offered - held >= 1:
        return None
    return f"{held} held by pods of {offered} allocatable"


def _settling(view: nodes.NodeView, pod: Mapping[str, Any]) -> bool:
    """Whether a validator pod the kubelet refused as unexpected was made while the node's
    plugin was still settling: within REFUSAL_GRACE of its pods last becoming Ready, before
    (the plugin restarted under the pod) or after. A refusal later than that is the node's
    answer (a plugin that serves no card, or none free) and fails the validation; so does one
    the times cannot place, or a Ready time far after the pod's making (a node clock ahead of
    the API server's would otherwise stretch the retry by its skew)."""
    since = view.ready_since()
    created = pods.timestamp(pod["metadata"].get("creationTimestamp"))
    if since is None or created is None:
        return False
    return -REFUSAL_GRACE < created - since < REFUSAL_GRACE


def _workloads(observed: Observed, view: nodes.NodeView) -> list[Mapping[str, Any]]:
    """The GCU pods a drain of ``view``'s node evicts: every pod there that uses a GCU and
    still runs, except the operators' own validator pods (a validator is the drain's last
    step: evicting it would throw away the validation the node is cordoned for, pass after
    pass, and the rollout would not finish while its pod kept losing that race)."""
    return [
        p
        for p in observed.gcu_pods
        if pods.node_of(p) == view.name
        and pods.requests_gcu(p)
        and pods.phase(p) in ("Pending", "Running")
        and not _is_validator(p)
    ]


def _is_validator(pod: Mapping[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return (
        labels.get(names.COMPONENT_LABEL) == rs.VALIDATOR
        and labels.get(names.MANAGED_BY) == names.OPERATOR
    )


def _drained(observed: Observed, view: nodes.NodeView, work: _Work) -> bool:
    """Evicts the node's GCU pods; True once none is left."""
    left = _workloads(observed, view)
    for pod in left:
        if not pod["metadata"].get("deletionTimestamp"):
            work.after_intent.append(Evict(pod["metadata"]["namespace"], pod["metadata"]["name"]))
    return not left


def _roll(
    observed: Observed,
    *,
    spec: rs.ResourceSpec,
    views: Sequence[nodes.NodeView],
    states: dict[str, nodestate.NodeState],
    hashes: Mapping[str, str],
    work: _Work,
    previous: Mapping[str, Mapping[str, Any]],
) -> status.Rollout:
    """Upgrade nodes with outdated pods, a batch at a time, each validated before the next."""
    validating = spec.wants(rs.VALIDATOR)
    generation = _generation(observed)
    for view in views:
        _expire_fallback(view, states, hashes, generation)

    def active(view: nodes.NodeView) -> list[tuple[str, str, str, int]]:
        """The node's fallback entries for the version its DaemonSets hold now, made since
        the resource was last edited."""
        return [e for e in states[view.name].fallback if _in_force(view, e, hashes, generation)]

    def done(view: nodes.NodeView) -> bool:
        target = view.desired_target(hashes)
        st = states[view.name]
        return (
            not view.outdated(hashes)
            and view.all_ready()
            and view.running_target() == target
            and (not validating or (st.validated_target == target and st.validated_ok))
        )

    def pod_failing(view: nodes.NodeView, changed: Mapping[str, Any] | None = None) -> str:
        """Why a current pod of the node (of a ``changed`` component only, when given) fails."""
        for key in view.components:
            if changed is not None and key not in changed:
                continue
            pod = view.pods.get(key)
            if (
                pod is not None
                and pods.template_hash(pod) == hashes.get(key)
                and not components.is_fallback(pod)
            ):
                reason = pods.failure(pod, observed.now, spec.upgrade.pod_ready_timeout)
                if reason:
                    return reason
        return ""

    def failing(view: nodes.NodeView) -> str:
        back = active(view)
        if back:
            keys = ", ".join(e[0] for e in back)
            return f"{back[0][2]}; the node runs its previous {keys} again"
        reason = pod_failing(view)
        if reason:
            return reason
        st = states[view.name]
        if st.validated_target == view.desired_target(hashes) and not st.validated_ok:
            return st.validation_message or "validation failed"
        return ""

    def available(view: nodes.NodeView) -> bool:
        target = view.running_target()
        st = states[view.name]
        return view.all_ready() and (
            not validating or (st.validated_target == target and st.validated_ok)
        )

    in_progress: list[nodes.NodeView] = []
    pending: list[nodes.NodeView] = []
    # A node where no new pod can be placed (an untolerated taint) is out of the rollout and of
    # its budget: replacing a pod there would leave the node without one.
    unplaceable = [v for v in views if v.blocked and not v.state.upgrading]
    views = [v for v in views if v not in unplaceable]
    for view in views:
        st = states[view.name]
        target = view.desired_target(hashes)
        if st.upgrading and done(view):
            states[view.name] = dataclasses.replace(st, upgrading="", cordoned=False)
        elif st.upgrading and st.upgrading == target:
            in_progress.append(view)
        elif view.outdated(hashes) or view.switching:
            pending.append(view)
    failed = [(v.name, r) for v in in_progress if (r := failing(v))]
    # maxUnavailable holds at every moment: nodes being upgraded and nodes that are down for
    # any other reason (not ready, not validated) both count, and a node's pods are deleted
    # only after its intent (upgrading) is written (see plan(): after_intent).
    limit = max_unavailable(spec.upgrade.max_unavailable, len(views))
    down = {v.name for v in in_progress} | {v.name for v in views if not available(v)}
    # Broken nodes first: a rollback repairs the node that failed before touching healthy ones.
    pending.sort(key=lambda v: (v.all_ready(), v.name))
    started: list[nodes.NodeView] = []
    for view in [] if failed else pending:
        # A node that is down already costs nothing more; a healthy one needs room.
        if view.name not in down:
            if len(down) >= limit:
                continue
            down.add(view.name)
        started.append(view)
    for view in started:
        # A node someone else had cordoned stays theirs to uncordon: only a cordon the
        # operator sets (recorded here, before it is set) is ever lifted.
        admin_cordoned = bool((view.node.get("spec") or {}).get("unschedulable"))
        states[view.name] = dataclasses.replace(
            states[view.name],
            upgrading=view.desired_target(hashes),
            cordoned=spec.upgrade.drain and not admin_cordoned,
            since=observed.now,
        )
    failed_names = {name for name, _ in failed}
    for view in in_progress:
        # A node that is away (NotReady) runs nothing new either way: once back, its new pods
        # get their chance (the rollout goes on by itself if they become Ready).
        if view.name in failed_names and _node_ready(view.node):
            _fall_back(
                view,
                states,
                hashes,
                previous=previous,
                active=active(view),
                generation=generation,
                # Only a new version's own pod failing sends the node back: a node that was
                # away (its unchanged toolkit not ready) resumes once it is back.
                pod_failure=pod_failing(view, previous),
            )
    for view in views:
        _fallback_pods(observed, spec, view, active=active(view), previous=previous, work=work)
    for view in [*in_progress, *started]:
        if view.name in failed_names:
            continue
        if spec.upgrade.drain and not _drained(observed, view, work):
            left = _left_on(observed, view)
            blocked = [p for p in left if p in observed.blocked]
            started_at = states[view.name].since
            timeout = spec.upgrade.drain_timeout
            if timeout and started_at and observed.now - started_at > timeout:
                work.drain_failed.append(
                    (
                        view.name,
                        f"drain timed out after {timeout} s; GCU pods still there: "
                        + ", ".join(left)
                        + (" (evictions blocked by a PodDisruptionBudget)" if blocked else ""),
                    )
                )
            elif blocked:
                work.drain_blocked.append(
                    f"drain of {view.name} blocked by a PodDisruptionBudget: {', '.join(blocked)}"
                )
            continue
        # Drained (or no drain): a node changing mode may change its labels now.
        work.cleared.add(view.name)
        outdated = view.outdated(hashes)
        toolkit_pod = view.pods.get(rs.TOOLKIT)
        toolkit_current = rs.TOOLKIT not in view.components or (
            toolkit_pod is not None
            and pods.template_hash(toolkit_pod) == hashes.get(rs.TOOLKIT)
            and pods.ready(toolkit_pod)
            and not components.is_fallback(toolkit_pod)
        )
        for key in outdated:
            # The toolkit first; the plugin only once this node's new toolkit is ready.
            if key != rs.TOOLKIT and not toolkit_current:
                continue
            pod = view.pods[key]
            work.after_intent.append(
                Delete("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
            )
    work.down = len(down)
    waiting = [v.name for v in pending if v not in started]
    waiting += [v.name for v in unplaceable if v.outdated(hashes)]
    return status.Rollout(
        upgrading=tuple(sorted(v.name for v in [*in_progress, *started])),
        waiting=tuple(waiting),
        failed=tuple(failed) + tuple(work.drain_failed),
        blocked=tuple(work.drain_blocked),
    )


# Phases a pod never leaves (restartPolicy Always: an eviction or a node shutdown ends it).
_ENDED = ("Failed", "Succeeded")


def _fallback_here(view: nodes.NodeView, key: str) -> bool:
    """Whether the node still has a fallback pod of ``key`` (or a pod of it stopping)."""
    pod = view.pods.get(key)
    return (pod is not None and components.is_fallback(pod)) or key in view.terminating


def _generation(observed: Observed) -> int:
    value = observed.resource["metadata"].get("generation")
    return value if isinstance(value, int) else 0


def _in_force(
    view: nodes.NodeView,
    entry: tuple[str, str, str, int],
    hashes: Mapping[str, str],
    generation: int,
) -> bool:
    """Whether a fallback entry still holds: the version that failed is the DaemonSet's, and
    the resource was not edited since (an edit, once the cause is fixed, tries it again)."""
    key, failed, _, since = entry
    return key in view.components and failed == hashes.get(key) and since == generation


def _expire_fallback(
    view: nodes.NodeView,
    states: dict[str, nodestate.NodeState],
    hashes: Mapping[str, str],
    generation: int,
) -> None:
    """Drops the node's fallback entries no longer in force once their pod is gone: the node
    is then an outdated node of the rollout, its DaemonSet's again."""
    st = states[view.name]
    kept = tuple(
        e
        for e in st.fallback
        if e[0] in view.components
        and (_in_force(view, e, hashes, generation) or _fallback_here(view, e[0]))
    )
    if kept != st.fallback:
        states[view.name] = dataclasses.replace(st, fallback=kept)


def _fall_back(
    view: nodes.NodeView,
    states: dict[str, nodestate.NodeState],
    hashes: Mapping[str, str],
    *,
    previous: Mapping[str, Mapping[str, Any]],
    active: Sequence[tuple[str, str, str, int]],
    pod_failure: str,
    generation: int,
) -> None:
    """A node whose new pod failed (the rollout stops on it) goes back to the previous version
    of every component it had taken the new one of, or would on losing its pod; a pod of the
    old version it still runs is kept. A failed validation changes nothing (its pods run)."""
    reason = active[0][2] if active else pod_failure
    if not reason:
        return
    st = states[view.name]
    have = {e[0] for e in st.fallback}
    entries = list(st.fallback)
    for key in view.components:
        pod = view.pods.get(key)
        new_or_none = pod is None or (
            pods.template_hash(pod) == hashes.get(key) and not components.is_fallback(pod)
        )
        if key in previous and key not in have and new_or_none:
            entries.append((key, hashes[key], reason, generation))
    if len(entries) != len(st.fallback):
        states[view.name] = dataclasses.replace(st, fallback=tuple(sorted(entries)))


def _fallback_pods(
    observed: Observed,
    spec: rs.ResourceSpec,
    view: nodes.NodeView,
    *,
    active: Sequence[tuple[str, str, str, int]],
    previous: Mapping[str, Mapping[str, Any]],
    work: _Work,
) -> None:
    """Makes the node's missing fallback pods once its DaemonSet's pod is gone (the two never
    run at once); a serving component's only once the node's toolkit is ready. A fallback pod
    that ended (evicted, the node shut down) is deleted, to be made again: as a DaemonSet does."""
    toolkit = view.pods.get(rs.TOOLKIT)
    toolkit_ok = rs.TOOLKIT not in view.components or (toolkit is not None and pods.ready(toolkit))
    for key, *_ in active:
        template = previous.get(key)
        pod = view.pods.get(key)
        if pod is not None and components.is_fallback(pod) and pods.phase(pod) in _ENDED:
            meta = pod["metadata"]
            work.after_intent.append(Delete("v1", "Pod", meta["namespace"], meta["name"]))
            continue
        if template is None or pod is not None or key in view.terminating:
            continue
        if key != rs.TOOLKIT and not toolkit_ok:
            continue
        work.after_intent.append(
            Create(
                components.fallback_pod(
                    observed.resource,
                    spec.components[key],
                    view.name,
                    template,
                    nodes.DAEMONSET_TOLERATIONS,
                )
            )
        )


def _left_on(observed: Observed, view: nodes.NodeView) -> list[str]:
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in _workloads(observed, view)
    ]


def _switched(view: nodes.NodeView) -> nodes.NodeView:
    """The view of a node whose mode change goes ahead: the components it is to run."""
    if view.wanted is None:
        return view
    mode = "dra" if rs.DRA in view.wanted else "device-plugin"
    return dataclasses.replace(view, components=view.wanted, mode=mode, wanted=None)


def _desired_labels(
    spec: rs.ResourceSpec, view: nodes.NodeView, state: nodestate.NodeState, uid: str
) -> dict[str, str | None]:
    labels: dict[str, str | None] = {}
    have = view.labels
    toolkit = view.pods.get(rs.TOOLKIT)
    toolkit_ok = rs.TOOLKIT not in view.components or (toolkit is not None and pods.ready(toolkit))
    # After a mode change, the new serving component starts only once the old one's pod is gone:
    # the two never hold the node's cards at once.
    leaving = {
        k
        for k in nodes.SERVING_KEYS
        if k not in view.components and (k in view.pods or k in view.terminating)
    }
    falling_back = {e[0] for e in state.fallback}
    for key in nodes.DAEMON_KEYS:
        label = names.deploy_label(key)
        if key in falling_back and key in view.components:
            # Its fallback pod runs here: the DaemonSet (which selects "true") stays away.
            labels[label] = components.FALLBACK_DEPLOY
            labels[names.owner_label(key)] = uid
            continue
        if key in nodes.SERVING_KEYS and leaving - {key} and have.get(label) != "true":
            continue
        # The toolkit's readiness gates the plugin's first start on a node.
        if key in view.components and (
            key == rs.TOOLKIT or toolkit_ok or have.get(label) == "true"
        ):
            labels[label] = "true"
            labels[names.owner_label(key)] = uid
        if label not in labels and label in state.labels:
            labels[label] = None
        owner = names.owner_label(key)
        if owner not in labels and owner in state.labels:
            labels[owner] = None
    target = view.running_target()
    ok = (
        spec.wants(rs.VALIDATOR)
        and target
        and state.validated_target == target
        and state.validated_ok
    )
    if ok:
        labels[names.VALIDATED_LABEL] = "true"
    elif names.VALIDATED_LABEL in state.labels:
        labels[names.VALIDATED_LABEL] = None
    return labels


def plan(observed: Observed) -> Plan:
    """The actions that move the cluster towards the resource, and the status to report."""
    if observed.resource["metadata"].get("deletionTimestamp"):
        return _plan_removal(observed)
    if observed.conflict:
        report = status.ignored(observed.resource, observed.conflict, observed.now)
        same = report == observed.resource.get("status")
        return Plan(() if same else (status.write(report),), report)
    work = _Work()
    resource, uid = _name(observed), _uid(observed)
    finalizers = tuple(observed.resource["metadata"].get("finalizers") or ())
    if rs.FINALIZER not in finalizers:
        work.actions.append(SetFinalizers((*finalizers, rs.FINALIZER)))
    spec = rs.parse(observed.resource.get("spec"))
    want = components.desired(
        observed.resource,
        spec,
        observed.dra_served,
        observed.dra_service_account,
        scraper_namespace=observed.scraper_namespace,
    )
    if spec.dra.webhook and rs.DRA in spec.components:
        refused = webhook.refusal(observed.dra_served, observed.cert_manager_served)
        if refused:
            work.conflicts.append(refused)  # said in the status; nothing of it is made
        want.update(
            webhook.wanted(
                observed.resource, spec, observed.dra_served, observed.cert_manager_served
            )
        )
    forbidden = _forbidden(observed, spec, work)
    if forbidden:
        want = {
            k: v
            for k, v in want.items()
            if k not in forbidden
            and (v["metadata"].get("namespace") or "") not in _namespaces_of(spec, forbidden)
            # Cluster-scoped objects of a component not deployed (the plugin's ClusterRole).
            and not (k in components.PLUGIN_RBAC_KEYS and rs.DEVICE_PLUGIN in forbidden)
            and not (k in webhook.KEYS and rs.DRA in forbidden)
        }
        spec = dataclasses.replace(
            spec, components={k: c for k, c in spec.components.items() if k not in forbidden}
        )
    mark = len(work.actions)
    conflicted = _sync_objects(observed, want, work) | forbidden
    # The objects are written after the nodes' labels: a DaemonSet that comes to select the
    # owner label never finds a node of this resource without it.
    object_actions = work.actions[mark:]
    del work.actions[mark:]
    hashes = {
        key: obj["spec"]["template"]["metadata"]["annotations"][names.TEMPLATE_HASH]
        for key, obj in want.items()
        if obj["kind"] == "DaemonSet"
    }
    by_name = {str(n["metadata"]["name"]): n for n in observed.nodes}
    pods_by_node: dict[str, list[Mapping[str, Any]]] = {}
    validators: dict[str, list[Mapping[str, Any]]] = {}
    for pod in observed.pods:
        pod_labels = pod["metadata"].get("labels") or {}
        if pod_labels.get(names.COMPONENT_LABEL) == rs.VALIDATOR:
            node = (pod["metadata"].get("annotations") or {}).get(
                names.VALIDATOR_NODE, pod_labels.get(names.VALIDATOR_NODE)
            )
            validators.setdefault(str(node), []).append(pod)
        else:
            pods_by_node.setdefault(pods.node_of(pod), []).append(pod)
    # The resource's nodes: GCU nodes one of its serving components selects (a node no serving
    # component selects is no node of this resource: neither unvalidated nor down).
    views = []
    for name, n in sorted(by_name.items()):
        if nodes.is_gcu_node(n):
            v = nodes.view(n, resource, spec, observed.dra_served, pods_by_node.get(name, []))
            if any((k, name) in observed.taken for k in v.components):
                # Another resource owns these here: not deployed, and named in the status.
                kept = tuple(k for k in v.components if (k, name) not in observed.taken)
                v = dataclasses.replace(v, components=kept)
            if nodes.serves(v, spec):
                # A mode change is an upgrade of the node: it keeps what it runs until then.
                views.append(nodes.as_running(v))
    states = {v.name: v.state for v in views}
    for view in views:
        states[view.name] = _validate(
            observed,
            spec=spec,
            view=view,
            state=states[view.name],
            validator_pods=validators.get(view.name, []),
            work=work,
        )
    previous = _previous(observed, want, hashes)
    rollout = _roll(
        observed,
        spec=spec,
        views=views,
        states=states,
        hashes=hashes,
        work=work,
        previous=previous,
    )
    _stray_fallbacks(observed, views, states, work)
    # A node whose mode change began (its turn came, it is drained) runs the new mode's pods.
    views = [_switched(v) if v.switching and v.name in work.cleared else v for v in views]
    reports = status.node_reports(spec, views, states, hashes, observed.now)
    for view, (report, _) in zip(views, reports, strict=True):
        # Each node's report goes on the Node (the status names only the first few problems).
        detail = {k: v for k, v in report.items() if k != "name"}
        states[view.name] = dataclasses.replace(
            states[view.name], report=nodestate.canonical(detail)
        )
        _set_node(
            work, view, _desired_labels(spec, view, states[view.name], uid), states[view.name]
        )
    # Nodes that are no longer this resource's (relabelled, taken by another resource, no
    # longer GCU nodes) lose what we set there, within maxUnavailable while our pods run there.
    gcu = {v.name for v in views}
    leaving = []
    releasing = 0
    for name, node in sorted(by_name.items()):
        state = nodestate.read(node, resource)
        if name in gcu or state == nodestate.NodeState():
            continue
        node_pods = [
            p
            for p in pods_by_node.get(name, [])
            if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) in nodes.DAEMON_KEYS
        ]
        if any(not p["metadata"].get("deletionTimestamp") for p in node_pods):
            leaving.append((name, node, state))
        else:
            releasing += bool(node_pods)  # released, its pods still stopping
            gone = nodes.NodeView(name, node, "none", "", (), {}, state)
            _set_node(work, gone, dict.fromkeys(state.labels), nodestate.NodeState())
    room = max_unavailable(spec.upgrade.max_unavailable, len(views) + len(leaving))
    room -= work.down + releasing
    held = []
    for name, node, state in leaving:
        if room <= 0:
            held.append(name)
            continue
        room -= 1
        gone = nodes.NodeView(name, node, "none", "", (), {}, state)
        _set_node(work, gone, dict.fromkeys(state.labels), nodestate.NodeState())
    if held:
        rollout = dataclasses.replace(rollout, waiting=(*rollout.waiting, *held))
    _node_patch_actions(observed, work, by_name)
    work.actions.extend(object_actions)
    work.actions.extend(work.after_intent)
    report = status.build(
        observed.resource,
        spec=spec,
        views=views,
        reports=reports,
        rollout=rollout,
        conflicted=conflicted,
        conflicts=work.conflicts,
        want=want,
        now=observed.now,
        taken=observed.taken,
    )
    actions = work.actions
    if report != observed.resource.get("status"):
        actions.append(status.write(report))
    return Plan(tuple(actions), report)


def _previous(
    observed: Observed, want: Mapping[str, Obj], hashes: Mapping[str, str]
) -> dict[str, Obj]:
    """Each daemon component's pod template before its DaemonSet's last change (none known:
    not in the map)."""
    out = {}
    uid = _uid(observed)
    for key in nodes.DAEMON_KEYS:
        obj = want.get(key)
        have = observed.objects.get(objects.key(obj)) if obj is not None else None
        if have is None or not objects.owned_by(have, uid):
            continue
        template = components.previous_template(have, hashes[key])
        if template is not None:
            out[key] = template
    return out


def _stray_fallbacks(
    observed: Observed,
    views: Sequence[nodes.NodeView],
    states: Mapping[str, nodestate.NodeState],
    work: _Work,
) -> None:
    """Deletes fallback pods no entry keeps (their component or node no longer this
    resource's, or the node's record lost)."""
    kept = {(v.name, e[0]) for v in views for e in states[v.name].fallback}
    for pod in observed.pods:
        key = (pod["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL)
        if (
            components.is_fallback(pod)
            and (pods.node_of(pod), key) not in kept
            and not pod["metadata"].get("deletionTimestamp")
        ):
            work.after_intent.append(
                Delete("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
            )


# Seconds a removal waits for component pods on NotReady nodes before it leaves them behind.
REMOVAL_GRACE = 300.0


def _node_ready(node: Mapping[str, Any] | None) -> bool:
    if node is None:
        return False
    conditions = (node.get("status") or {}).get("conditions")
    if not conditions:
        return True  # no kubelet report at all (a node object without status): not judged
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _plan_removal(observed: Observed) -> Plan:
    """Deleting: components in reverse order, the toolkit (its undo) last, then the finalizer."""
    work = _Work()
    resource, uid = _name(observed), _uid(observed)
    stages = (
        # The DRA webhook first: no pod is rewritten for a driver that is going away.
        (rs.VALIDATOR, rs.GFD, rs.EXPORTER, webhook.COMPONENT),
        (rs.DRA, rs.DEVICE_PLUGIN),
        (rs.TOOLKIT,),
    )
    stuck: list[str] = []
    deleted_at = pods.timestamp(observed.resource["metadata"].get("deletionTimestamp"))
    deleting_for = observed.now - deleted_at if deleted_at is not None else 0.0
    by_name = {str(n["metadata"]["name"]): n for n in observed.nodes}
    done_stages = 0
    for stage in stages:
        owned = [
            o
            for o in observed.objects.values()
            if objects.owned_by(o, uid)
            and (o["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) in stage
        ]
        live = [
            p
            for p in observed.pods
            if (p["metadata"].get("labels") or {}).get(names.COMPONENT_LABEL) in stage
        ]
        # A pod on a NotReady node never finishes terminating (no kubelet confirms it): named
        # in the status, and after REMOVAL_GRACE seconds left behind, saying so.
        unreachable = [p for p in live if not _node_ready(by_name.get(pods.node_of(p)))]
        if unreachable:
            stuck.extend(
                f"{p['metadata']['namespace']}/{p['metadata']['name']} on {pods.node_of(p)}"
                for p in unreachable
            )
            if deleting_for > REMOVAL_GRACE:
                live = [p for p in live if p not in unreachable]
        for obj in owned:
            k = objects.key(obj)
            work.actions.append(Delete(str(obj["apiVersion"]), k[0], k[1] or None, k[2]))
        for pod in live:
            is_validator = (pod["metadata"].get("labels") or {}).get(
                names.COMPONENT_LABEL
            ) == rs.VALIDATOR
            # Validator and fallback pods have no DaemonSet whose deletion takes them away.
            if (is_validator or components.is_fallback(pod)) and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                work.actions.append(
                    Delete("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
                )
        stage_labels = {
            names.VALIDATED_LABEL if key == rs.VALIDATOR else names.deploy_label(key)
            for key in stage
        } | {names.owner_label(key) for key in stage if key in nodes.DAEMON_KEYS}
        for name, node in sorted(by_name.items()):
            state = nodestate.read(node, resource)
            mine = stage_labels & state.labels
            if mine:
                view = nodes.NodeView(name, node, "", "", (), {}, state)
                _set_node(work, view, dict.fromkeys(mine), state)
        if owned or live:
            break
        done_stages += 1
    if done_stages == len(stages):
        for name, node in sorted(by_name.items()):
            state = nodestate.read(node, resource)
            if state != nodestate.NodeState():
                view = nodes.NodeView(name, node, "", "", (), {}, state)
                _set_node(work, view, dict.fromkeys(state.labels), nodestate.NodeState())
    _node_patch_actions(observed, work, by_name)
    if done_stages == len(stages) and not work.actions:
        finalizers = tuple(
            f for f in observed.resource["metadata"].get("finalizers") or () if f != rs.FINALIZER
        )
        return Plan((SetFinalizers(finalizers),), dict(observed.resource.get("status") or {}))
    report = status.removing(
        observed.resource,
        done_stages,
        len(stages),
        observed.now,
        stuck=stuck,
        given_up=deleting_for > REMOVAL_GRACE,
    )
    actions = work.actions
    if report != observed.resource.get("status"):
        actions.append(status.write(report))
    return Plan(tuple(actions), report)


def _display(resource: Mapping[str, Any]) -> str:
    group = str(resource.get("apiVersion", "")).rpartition("/")[0]
    return f"GcuResource {resource['metadata']['name']} ({group})"


def wanted_pairs(
    resource: Mapping[str, Any], gcu_nodes: Sequence[Mapping[str, Any]], dra_served: bool
) -> set[tuple[str, str]]:
    """(component, node) pairs of node daemons the resource would run (on its nodes only)."""
    spec = rs.parse(resource.get("spec"))
    out: set[tuple[str, str]] = set()
    for node in gcu_nodes:
        view = nodes.view(node, "", spec, dra_served, [])
        if nodes.serves(view, spec):
            out.update((k, view.name) for k in view.components)
    return out


def ownership(
    resources: Sequence[Mapping[str, Any]],
    gcu_nodes: Sequence[Mapping[str, Any]],
    dra_served: bool = True,
) -> dict[str, tuple[str, dict[tuple[str, str], str]]]:
    """Who owns each (component, node) pair, for every resource (by uid): why it must deploy
    nothing ("" unless every pair it wants is another's) and the pairs another one owns, with
    that one's name. ``resources`` oldest first. The owner is sticky: the resource whose uid the
    node's owner label names, while it exists (a resource that no longer wants the node
    releases it within its budget first); a pair nobody owns goes to the oldest that wants it."""
    by_uid = {str(r["metadata"]["uid"]): r for r in resources}
    labels = {
        str(n["metadata"]["name"]): (n.get("metadata", {}).get("labels") or {}) for n in gcu_nodes
    }
    wants = {uid: wanted_pairs(r, gcu_nodes, dra_served) for uid, r in by_uid.items()}
    owner: dict[tuple[str, str], str] = {}
    for (key, node), value in (
        ((k, n), labels[n].get(names.owner_label(k))) for n in labels for k in nodes.DAEMON_KEYS
    ):
        if value in by_uid:
            owner[(key, node)] = str(value)
    for uid in by_uid:  # oldest first
        for pair in wants[uid]:
            owner.setdefault(pair, uid)
    out: dict[str, tuple[str, dict[tuple[str, str], str]]] = {}
    for uid in by_uid:
        taken = {p: _display(by_uid[owner[p]]) for p in wants[uid] if owner[p] != uid}
        conflict = ""
        if taken and len(taken) == len(wants[uid]):
            both = sorted(taken)
            shown = ", ".join(f"{key} on {node}" for key, node in both[:5])
            more = f" and {len(both) - 5} more" if len(both) > 5 else ""
            first = taken[both[0]]
            conflict = (
                f"{first} (created earlier) already deploys {shown}{more}; this resource "
                "deploys nothing until that one is deleted or no longer wants them"
            )
        out[uid] = (conflict, taken)
    return out
