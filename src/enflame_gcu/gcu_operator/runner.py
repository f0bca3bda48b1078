"""The operator's loop: observe each GcuResource, plan, carry the plan out; again, forever.

Level-triggered: every pass reads the whole state again and plans from it, so a missed event, a
failed call or a restart costs one pass, never correctness. A failed action ends the pass (the
next one re-reads and re-plans); the count of API calls per pass is kept for the benchmark.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from enflame_gcu.gcu_operator import (
    api,
    components,
    names,
    nodes,
    objects,
    pods,
    reconcile,
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
    WriteStatus,
    describe,
)

LOG = logging.getLogger(__name__)
Obj = dict[str, Any]
GROUPS = (api.GCU_RESOURCE, api.LEGACY_GCU_RESOURCE)


def list_resources(cluster: api.ClusterApi) -> list[tuple[api.Kind, Obj]]:
    """Every GcuResource of both groups with its kind, one list per group; a group whose CRD
    is not installed has none."""
    found: list[tuple[api.Kind, Obj]] = []
    for kind in GROUPS:
        try:
            listed = cluster.list(kind)
        except api.ApiError as exc:
            if exc.status == api.NOT_FOUND:
                continue  # that group's CRD is not installed
            raise
        found.extend((kind, resource) for resource in listed)
    return found


# Phases in which nothing moves until something changes (the main loop then backs off).
SETTLED = frozenset({"Running", "Ignored", "Failed"})
# A refused resource waits this long before its next try, doubling up to MAX_BACKOFF.
BACKOFF_START = 5.0
MAX_BACKOFF = 300.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Backoff:
    """A resource whose last action was refused: when to try again."""

    generation: int
    failures: int
    next_try: float
    message: str


@dataclasses.dataclass(slots=True)
class PassResult:
    """What one pass over one resource did."""

    resource: str
    actions: int = 0
    error: str = ""
    # Nothing in progress: Running, Ignored or a stopped (Failed) rollout, and nothing done.
    settled: bool = False
    # A refused resource: when (the operator's clock) it is tried again; nothing happens to it
    # before then unless it changes.
    retry_at: float | None = None


def _labelled(resource: Mapping[str, Any]) -> dict[str, str]:
    return {names.RESOURCE_LABEL: str(resource["metadata"]["uid"])}


class NotLeading(api.ApiError):
    """This replica's Lease was not renewed within the deadline: it must not write."""

    def __init__(self) -> None:
        super().__init__(api.UNREACHABLE, "not leading: the Lease was not renewed in time")


class Operator:
    """Reconciles every GcuResource of both groups; stateless between passes.

    ``may_write`` is asked before every write (the leader elector's renew deadline): a pass that
    outlives the Lease stops at its next write instead of racing the new leader.
    """

    def __init__(
        self,
        cluster: api.ClusterApi,
        clock: Callable[[], float] = time.time,
        may_write: Callable[[], bool] = lambda: True,
        allowed_namespaces: frozenset[str] = frozenset(),
        dra_service_account: str = components.DRA_SERVICE_ACCOUNT,
        *,
        component_namespace: str = "",
        scraper_namespace: str = "",
    ) -> None:
        self._scraper_namespace = scraper_namespace
        self._api = cluster
        # Where a component that names no namespace goes ("": the vendor's kube-system).
        self._component_namespace = component_namespace
        self._clock = clock
        self._may_write = may_write
        self._allowed_namespaces = allowed_namespaces
        self._dra_service_account = dra_service_account
        self._dra_served: bool | None = None
        self._cert_manager_served: bool | None = None
        self._backoff: dict[str, _Backoff] = {}
        # Evictions a PodDisruptionBudget refused in the last pass, per resource uid.
        self._blocked: dict[str, dict[str, str]] = {}
        # What the last pass read: every GcuResource's (group, uid, resourceVersion), and every
        # node's labels (the idle wait's watches compare against these).
        self.seen_resources: frozenset[tuple[str, str, str]] | None = None
        self.seen_nodes: dict[str, dict[str, str]] | None = None
        # Each observed resource's pods (resource uid -> pod uid -> resourceVersion).
        self.seen_pods: dict[str, dict[str, str]] = {}
        # The Nodes run_once just listed: the first resource's observe takes them instead of a
        # second list of every Node (the heaviest list at scale); later resources list afresh,
        # so they see what the earlier ones' passes wrote.
        self._listed_nodes: list[Obj] | None = None

    def observe(self, kind: api.Kind, resource: Mapping[str, Any]) -> reconcile.Observed:
        """Read what one reconcile needs."""
        spec = rs.parse(resource.get("spec"))
        found: dict[objects.Key, Obj] = {}
        if self._dra_served is None:
            self._dra_served = self._api.served(api.DEVICE_CLASS)
        kinds = [
            api.DAEMONSET,
            api.SERVICE,
            api.NETWORK_POLICY,
            api.RUNTIME_CLASS,
            api.SERVICE_ACCOUNT,
            api.CLUSTER_ROLE,
            api.CLUSTER_ROLE_BINDING,
            api.ROLE,
            api.ROLE_BINDING,
        ]
        if self._dra_served:
            kinds.append(api.RESOURCE_CLAIM_TEMPLATE)
        if spec.dra.webhook and not self._cert_manager_served:
            # Asked each pass until it is served: cert-manager installed later is then seen.
            self._cert_manager_served = self._api.served(api.CERTIFICATE)
        kinds += [api.DEPLOYMENT, api.MUTATING_WEBHOOK]
        if self._cert_manager_served:
            kinds += [api.ISSUER, api.CERTIFICATE]
        cert_manager = bool(self._cert_manager_served)
        for obj_kind in kinds:
            for obj in self._api.list(obj_kind, labels=_labelled(resource)):
                found[objects.key(obj)] = obj
        want = components.desired(
            resource,
            spec,
            self._dra_served,
            self._dra_service_account,
            scraper_namespace=self._scraper_namespace,
        )
        want.update(webhook.wanted(resource, spec, self._dra_served, cert_manager))
        for obj in want.values():
            k = objects.key(obj)
            if k not in found:
                have = self._api.get(api.BY_KIND[k[0]], k[2], k[1] or None)
                if have is not None:
                    found[k] = have
        gcu_pods: list[Obj] = []
        if spec.upgrade.drain:
            gcu_pods = [p for p in self._api.list(api.POD) if _uses_gcu(p)]
        listed, self._listed_nodes = self._listed_nodes, None
        every_node = listed if listed is not None else self._api.list(api.NODE)
        own_pods = self._api.list(api.POD, labels=_labelled(resource))
        self.seen_pods[str(resource["metadata"].get("uid"))] = dict(version_of(p) for p in own_pods)
        return reconcile.Observed(
            resource=resource,
            nodes=every_node,
            objects=found,
            pods=own_pods,
            dra_served=self._dra_served,
            now=self._clock(),
            gcu_pods=gcu_pods,
            cert_manager_served=cert_manager,
            held_cards=self._held_cards,
        )

    def _held_cards(self, node: str) -> int | None:
        """The enflame.com/gcu cards the unfinished pods bound to ``node`` hold (one LIST by
        ``spec.nodeName`` from the API server's watch cache, as a kubelet's, asked only for a
        node about to get a validator pod: a deploy on 5,000 nodes reads no pod from etcd for
        it); None when the API does not answer (the validator pod is made, the kubelet decides)."""
        try:
            found = self._api.list(api.POD, fields={"spec.nodeName": node}, cached=True)
        except api.ApiError as exc:
            LOG.warning("the pods on node %s could not be listed: %s", node, exc)
            return None
        return sum(pods.cards_held(p, names.GCU_RESOURCE) for p in found)

    def apply(self, kind: api.Kind, resource: Obj, action: Action) -> None:
        """Carry out one action."""
        if not self._may_write():
            raise NotLeading()
        if isinstance(action, Create):
            try:
                self._api.create(api.BY_KIND[action.obj["kind"]], action.obj)
            except api.ApiError as exc:
                if exc.status != api.CONFLICT:
                    raise
        elif isinstance(action, Replace):
            self._api.replace(api.BY_KIND[action.obj["kind"]], action.obj)
        elif isinstance(action, Delete):
            self._api.delete(api.BY_KIND[action.kind], action.name, action.namespace)
        elif isinstance(action, PatchNode):
            self._api.patch(api.NODE, action.name, action.patch)
        elif isinstance(action, Evict):
            try:
                self._api.evict(action.namespace, action.name)
            except api.ApiError as exc:
                if exc.status != api.TOO_MANY_REQUESTS:
                    raise
                # A PodDisruptionBudget says not now: the drain waits (and says so), the pass
                # goes on to write the status.
                blocked = self._blocked.setdefault(str(resource["metadata"].get("uid")), {})
                blocked[f"{action.namespace}/{action.name}"] = exc.message
        elif isinstance(action, SetFinalizers):
            meta = resource["metadata"]
            self._api.patch(
                kind,
                meta["name"],
                {
                    "metadata": {
                        "finalizers": list(action.finalizers),
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )
        elif isinstance(action, WriteStatus):
            current = self._api.get(kind, resource["metadata"]["name"])
            if current is not None:
                current["status"] = action.status
                self._api.replace_status(kind, current)

    def reconcile(
        self,
        kind: api.Kind,
        resource: Obj,
        conflict: str = "",
        taken: Mapping[tuple[str, str], str] | None = None,
    ) -> PassResult:
        """Observe, plan and apply for one resource (``conflict``: why it must deploy nothing).

        An action the API server refuses (a namespace that does not exist, an invalid label) is
        not retried every pass: the resource's status says which object and why (condition
        reason Refused), an Event says it once, and the resource waits a doubling delay (from
        one pass up to MAX_BACKOFF seconds) before it is tried again; a spec change (a new
        generation) retries at once.
        """
        meta = resource["metadata"]
        result = PassResult(str(meta["name"]))
        backoff = self._backoff.get(str(meta.get("uid")))
        generation = int(meta.get("generation") or 0)
        waiting = backoff is not None and backoff.generation == generation
        if backoff is not None and waiting and self._clock() < backoff.next_try:
            result.error = backoff.message
            result.retry_at = backoff.next_try
            return result
        action: Action | None = None
        try:
            observed = dataclasses.replace(
                self.observe(kind, resource),
                conflict=conflict,
                taken=dict(taken or {}),
                allowed_namespaces=self._allowed_namespaces,
                dra_service_account=self._dra_service_account,
                scraper_namespace=self._scraper_namespace,
                blocked=self._blocked.pop(str(meta.get("uid")), {}),
            )
            plan = reconcile.plan(observed)
            for action in plan.actions:
                self.apply(kind, resource, action)
                result.actions += 1
            result.settled = not result.actions and plan.status.get("phase") in SETTLED
        except api.ApiError as exc:
            if exc.status == api.UNREACHABLE:
                raise  # the whole pass stops; the main loop says so once and backs off
            result.error = str(exc)
            if exc.status == api.CONFLICT or action is None:
                # A lost race (stale resourceVersion) or a failed read: the next pass re-reads.
                LOG.warning("reconcile of %s stopped: %s (next pass retries)", result.resource, exc)
                return result
            self._refused(
                kind,
                resource=resource,
                report=plan.status,
                action=action,
                exc=exc,
                generation=generation,
            )
            result.retry_at = self._backoff[str(meta.get("uid"))].next_try
            return result
        self._backoff.pop(str(meta.get("uid")), None)
        return result

    def _refused(
        self,
        kind: api.Kind,
        *,
        resource: Obj,
        report: Obj,
        action: Action,
        exc: api.ApiError,
        generation: int,
    ) -> None:
        meta = resource["metadata"]
        uid = str(meta.get("uid"))
        message = f"the API server refused to {describe(action)}: {exc}"
        previous = self._backoff.get(uid)
        failures = previous.failures + 1 if previous and previous.generation == generation else 1
        delay = min(MAX_BACKOFF, BACKOFF_START * 2 ** (failures - 1))
        self._backoff[uid] = _Backoff(generation, failures, self._clock() + delay, message)
        if previous is not None and previous.message == message:
            LOG.debug("%s: %s (again; next try in %.0f s)", meta["name"], message, delay)
        else:
            LOG.warning("%s: %s (next try in %.0f s)", meta["name"], message, delay)
        condition = {
            "action": "deploy",
            "status": "failed",
            "progress": 0,
            "reason": "Refused",
            "message": message,
            "lastUpdateTime": pods.rfc3339(self._clock()),
        }
        try:
            current = self._api.get(kind, str(meta["name"]))
            if current is not None:
                old = [c for c in (current.get("status") or {}).get("conditions") or []]
                if not any(c.get("message") == message for c in old):
                    current["status"] = {**report, "phase": "Failed", "conditions": [condition]}
                    self._api.replace_status(kind, current)
                    self._event(resource, message)
        except api.ApiError as again:
            LOG.warning("%s: could not report the refusal: %s", meta["name"], again)

    def _event(self, resource: Obj, message: str) -> None:
        """A Warning Event on the resource (cluster-scoped: the Event lives in default)."""
        meta = resource["metadata"]
        now = pods.rfc3339(self._clock())
        self._api.create(
            api.EVENT,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta['name']}.{int(self._clock() * 1000):x}",
                    "namespace": "default",
                },
                "involvedObject": {
                    "apiVersion": resource.get("apiVersion"),
                    "kind": rs.KIND,
                    "name": meta["name"],
                    "uid": meta.get("uid"),
                },
                "reason": "Refused",
                "message": message[:1024],
                "type": "Warning",
                "source": {"component": names.OPERATOR},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    def run_once(self) -> list[PassResult]:
        """One pass over every GcuResource in both groups, oldest first: the first resource to
        want a component on a node owns it there; a later one that wants the same is ignored
        (status Ignored, reason Conflict) and deploys nothing until the owner is gone."""
        found = list_resources(self._api)
        self.seen_resources = frozenset(resource_key(kind.group, r) for kind, r in found)
        self.seen_nodes = None
        self.seen_pods = {}
        for kind, resource in found:
            resource.setdefault("apiVersion", kind.api_version)
            if self._component_namespace:
                default_namespace(resource, self._component_namespace)
        if not found:
            return []
        found.sort(key=lambda item: ownership_order(item[1]))
        every_node = self._api.list(api.NODE)
        self._listed_nodes = every_node
        self.seen_nodes = {node_name(n): node_labels(n) for n in every_node}
        gcu_nodes = [n for n in every_node if nodes.is_gcu_node(n)]
        # One owner per (component, node), sticky (reconcile.ownership).
        owned = reconcile.ownership([r for _, r in found], gcu_nodes, self._dra_served is not False)
        results = []
        for kind, resource in found:
            conflict, taken = owned.get(str(resource["metadata"].get("uid")), ("", {}))
            results.append(self.reconcile(kind, resource, conflict, taken))
        self._listed_nodes = None  # never carried into a later pass
        return results


def resource_key(group: str, resource: Mapping[str, Any]) -> tuple[str, str, str]:
    """(group, uid, resourceVersion): changes whenever the resource does."""
    meta = resource.get("metadata") or {}
    return (group, str(meta.get("uid")), str(meta.get("resourceVersion")))


# The spec keys (both groups' spellings) whose value is one component's BaseFields.
COMPONENT_KEYS = frozenset(
    {rs.TOOLKIT, rs.DEVICE_PLUGIN, rs.DRA, rs.EXPORTER, rs.GFD, rs.VALIDATOR, *rs.ALIASES}
)


def default_namespace(resource: Obj, namespace: str) -> None:
    """Give every component of ``resource`` (as read, in memory only) that names no namespace
    ``namespace``: the operator's own, so that components need no write access elsewhere."""
    spec = resource.get("spec")
    if not isinstance(spec, dict):
        return
    for key, value in spec.items():
        if key in COMPONENT_KEYS and isinstance(value, dict) and not value.get("namespace"):
            value["namespace"] = namespace
    # The validator runs unless turned off, named or not.
    if rs.VALIDATOR not in spec:
        spec[rs.VALIDATOR] = {"namespace": namespace}


def version_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(uid, resourceVersion) of an object."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("uid")), str(meta.get("resourceVersion")))


def node_name(node: Mapping[str, Any]) -> str:
    """The node's name."""
    return str((node.get("metadata") or {}).get("name"))


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    """The node's labels (what decides which components it gets and how)."""
    return dict((node.get("metadata") or {}).get("labels") or {})


def _display(resource: Mapping[str, Any]) -> str:
    group = str(resource.get("apiVersion", "")).rpartition("/")[0]
    return f"GcuResource {resource['metadata']['name']} ({group})"


def ownership_order(resource: Mapping[str, Any]) -> tuple[float, str, str]:
    """Older first; same second: by name, then group (a stable order on every replica)."""
    meta = resource["metadata"]
    created = pods.timestamp(meta.get("creationTimestamp"))
    return (
        created if created is not None else float("inf"),
        str(meta.get("name")),
        str(resource.get("apiVersion")),
    )


def claims(resource: Mapping[str, Any], gcu_nodes: list[Obj]) -> set[tuple[str, str]]:
    """(component, node) pairs the resource's node daemons would run on."""
    spec = rs.parse(resource.get("spec"))
    out: set[tuple[str, str]] = set()
    for key in nodes.DAEMON_KEYS:
        component = spec.components.get(key)
        if component is None:
            continue
        for node in gcu_nodes:
            if nodes.in_scope(node, component):
                out.add((key, str(node["metadata"]["name"])))
    return out


def _uses_gcu(pod: Mapping[str, Any]) -> bool:
    return pods.requests_gcu(pod)
