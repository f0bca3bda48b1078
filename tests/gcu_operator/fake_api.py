"""A hand-written in-memory API server and a simulated cluster (DaemonSet controller + kubelets).

FakeApi keeps what a real API server keeps that the operator relies on: uids, resourceVersions
(a stale PUT is a 409), generations, finalizers (delete only marks), owner-reference garbage
collection, the status subresource, JSON merge patches. FakeCluster.step() plays the
controllers and kubelets: DaemonSet pods on the nodes their nodeSelector picks (OnDelete: never
replaced by itself), pods becoming ready (or crash-looping for a broken image), validator pods
succeeding (or failing on a bad node), terminating pods going away.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

from enflame_gcu.gcu_operator import api, components, pods

Obj = dict[str, Any]
Key = tuple[str, str, str]
WRITES = frozenset({"create", "replace", "patch", "delete", "replace_status", "evict"})


T = TypeVar("T")


def _copy(obj: T) -> T:
    """A copy of a stored object as a client would get it: through JSON, as from a real API
    server (an object that is not plain JSON fails here as it would there). Also much cheaper
    than a deep copy under coverage's tracer, which the restart sweeps call thousands of times."""
    return cast(T, json.loads(json.dumps(obj)))


# Label values as kube-apiserver validates them (at most 63 characters).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def _label_maps(obj: Obj) -> list[tuple[str, Mapping[str, Any]]]:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    found = [
        ("metadata.labels", (obj.get("metadata") or {}).get("labels")),
        ("spec.nodeSelector", spec.get("nodeSelector")),
        ("spec.selector.matchLabels", (spec.get("selector") or {}).get("matchLabels")),
        ("spec.template.metadata.labels", (template.get("metadata") or {}).get("labels")),
        ("spec.template.spec.nodeSelector", (template.get("spec") or {}).get("nodeSelector")),
    ]
    return [(path, m) for path, m in found if isinstance(m, Mapping)]


def validate(kind: api.Kind, obj: Obj) -> None:
    """What kube-apiserver refuses of an object the operator writes: a namespace that does not
    exist (404) and label values that are not label values (422)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    if kind.namespaced and namespace and namespace not in NAMESPACES:
        raise api.ApiError(404, f'namespaces "{namespace}" not found')
    for path, labels in _label_maps(obj):
        for value in labels.values():
            text = str(value)
            if len(text) > 63 or not LABEL_VALUE.match(text):
                raise api.ApiError(
                    422,
                    f'{kind.kind} "{meta.get("name")}" is invalid: {path}: Invalid value: '
                    f'"{text}": a valid label must be an empty string or consist of '
                    "alphanumeric characters, '-', '_' or '.', at most 63 characters",
                )


class Crash(Exception):
    """The operator 'dies' at this call (raised instead of carrying it out)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return _copy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# Fields kube-apiserver leaves out of what it stores when they are empty (``omitempty`` in the
# API types): an object written with ``ingress: []`` reads back without ``ingress``.
OMITTED_WHEN_EMPTY = {"NetworkPolicy": ("ingress", "egress")}


def _as_stored(obj: Obj) -> Obj:
    """``obj`` as the API server stores it: the empty fields it omits are gone."""
    spec = obj.get("spec")
    for field in OMITTED_WHEN_EMPTY.get(str(obj.get("kind")), ()):
        if isinstance(spec, dict) and spec.get(field) in ([], None) and field in spec:
            del spec[field]
    return obj


_META_FIELDS = ("metadata.name", "metadata.namespace")
# The field selectors kube-apiserver accepts by kind (beyond these it answers 400).
FIELD_SELECTABLE = {
    "Pod": (
        *_META_FIELDS,
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
}


def _field(obj: Mapping[str, Any], path: str) -> str:
    """A field's value as a field selector compares it (a string; "" when absent)."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


class FakeApi:
    """An in-memory API server implementing api.ClusterApi."""

    def __init__(self, dra_served: bool = False, cert_manager_served: bool = False) -> None:
        self.store: dict[Key, Obj] = {}
        # cert-manager's CRDs (the DRA webhook's certificate): absent unless said.
        self.cert_manager_served = cert_manager_served
        self.now = 1_700_000_000.0
        self.calls: list[tuple[str, str]] = []
        self.fail_at: dict[int, Exception] = {}
        self.dra_served = dra_served
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self.deleted: list[Key] = []
        # Pods ("namespace/name") a PodDisruptionBudget keeps: their eviction is a 429.
        self.pdb_protected: set[str] = set()
        # What a watch's timeout is measured on and how it waits between looks at the store:
        # real time by default (tests wait on watches from other threads); a test on simulated
        # time gives its clock's.
        self.watch_clock: Callable[[], float] = time.monotonic
        self.watch_sleep: Callable[[float], None] = time.sleep
        self.watch_poll = 0.01

    # --- bookkeeping -------------------------------------------------------------------
    def _call(self, verb: str, kind: api.Kind) -> None:
        index = len(self.calls)
        self.calls.append((verb, kind.kind))
        if index in self.fail_at:
            raise self.fail_at.pop(index)

    def writes(self) -> int:
        """How many write calls were made."""
        return sum(1 for verb, _ in self.calls if verb in WRITES)

    @staticmethod
    def _key(kind: api.Kind, name: str, namespace: str | None) -> Key:
        return (f"{kind.api_version}/{kind.kind}", namespace or "" if kind.namespaced else "", name)

    def put(self, kind: api.Kind, obj: Obj) -> Obj:
        """Store an object as if created (test setup; no call recorded)."""
        obj = _copy(obj)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", pods.rfc3339(self.now))
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        self.store[self._key(kind, meta["name"], meta.get("namespace"))] = _as_stored(obj)
        return _copy(obj)

    def objects(self, kind: api.Kind) -> list[Obj]:
        """Every stored object of a kind (test reads; no call recorded)."""
        prefix = f"{kind.api_version}/{kind.kind}"
        return [_copy(o) for k, o in sorted(self.store.items()) if k[0] == prefix]

    def find(self, kind: api.Kind, name: str, namespace: str | None = None) -> Obj | None:
        """One stored object (test read)."""
        obj = self.store.get(self._key(kind, name, namespace))
        return _copy(obj) if obj else None

    def remove(self, key: Key) -> None:
        """Really delete, then collect dependents (background garbage collection)."""
        obj = self.store.pop(key, None)
        if obj is None:
            return
        self.deleted.append(key)
        uid = obj["metadata"]["uid"]
        for k, dependent in list(self.store.items()):
            refs = dependent["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                self._mark_deleted(k)

    def _mark_deleted(self, key: Key) -> None:
        obj = self.store.get(key)
        if obj is None:
            return
        if obj["metadata"].get("finalizers") or obj["kind"] == "Pod":
            # Pods terminate (grace period) and objects with finalizers wait for them.
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = pods.rfc3339(self.now)
                obj["metadata"]["resourceVersion"] = str(next(self._rv))
            return
        self.remove(key)

    # --- ClusterApi ------------------------------------------------------------------------
    def get(self, kind: api.Kind, name: str, namespace: str | None = None) -> Obj | None:
        self._call("get", kind)
        return self.find(kind, name, namespace)

    def list(
        self,
        kind: api.Kind,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
        cached: bool = False,  # one store: its cache is never behind
    ) -> list[Obj]:
        self._call("list", kind)
        if not self._serves(kind):
            raise api.ApiError(404, "the server could not find the requested resource")
        for name in fields or {}:
            # As kube-apiserver: a field selector names only the fields the kind indexes.
            if name not in FIELD_SELECTABLE.get(kind.kind, _META_FIELDS):
                raise api.ApiError(
                    400, f"field label not supported: {name}"
                )  # the API server's words
        out = []
        for obj in self.objects(kind):
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                continue
            have = obj["metadata"].get("labels") or {}
            if labels and any(have.get(k) != v for k, v in labels.items()):
                continue
            if fields and any(_field(obj, k) != v for k, v in fields.items()):
                continue
            out.append(obj)
        return out

    def create(self, kind: api.Kind, obj: Obj) -> Obj:
        self._call("create", kind)
        meta = obj["metadata"]
        if self._key(kind, meta["name"], meta.get("namespace")) in self.store:
            raise api.ApiError(409, f"{kind.kind} {meta['name']} already exists")
        for field in ("uid", "resourceVersion", "deletionTimestamp"):
            if field in meta:
                raise api.ApiError(400, f"metadata.{field} must not be set on create")
        validate(kind, obj)
        if not self._serves(kind):
            raise api.ApiError(404, "the server could not find the requested resource")
        runtime_class = (obj.get("spec") or {}).get("runtimeClassName")
        if kind == api.POD and runtime_class and not self.find(api.RUNTIME_CLASS, runtime_class):
            # The RuntimeClass admission plugin, as kube-apiserver runs it.
            raise api.ApiError(403, f'pod rejected: RuntimeClass "{runtime_class}" not found')
        return self.put(kind, obj)

    def _current(self, kind: api.Kind, obj: Obj) -> Obj:
        meta = obj["metadata"]
        have = self.store.get(self._key(kind, meta["name"], meta.get("namespace")))
        if have is None:
            raise api.ApiError(404, f"{kind.kind} {meta['name']} not found")
        if meta.get("resourceVersion") != have["metadata"]["resourceVersion"]:
            raise api.ApiError(
                409, "the object has been modified; please apply your changes to the latest version"
            )
        return have

    def replace(self, kind: api.Kind, obj: Obj) -> Obj:
        self._call("replace", kind)
        have = self._current(kind, obj)
        validate(kind, obj)
        binding = kind in (api.CLUSTER_ROLE_BINDING, api.ROLE_BINDING)
        if binding and obj.get("roleRef") != have.get("roleRef"):
            raise api.ApiError(
                422,
                f'{kind.kind} "{obj["metadata"]["name"]}" is invalid: roleRef: '
                "Invalid value: cannot change roleRef",
            )
        new = _as_stored(_copy(obj))
        for field in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if field in have["metadata"]:
                new["metadata"][field] = have["metadata"][field]
        if "status" in have:
            new["status"] = have["status"]
        if new.get("spec") != have.get("spec"):
            new["metadata"]["generation"] = have["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.store[self._key(kind, new["metadata"]["name"], new["metadata"].get("namespace"))] = new
        self._finish(kind, new)
        return _copy(new)

    def replace_status(self, kind: api.Kind, obj: Obj) -> Obj:
        self._call("replace_status", kind)
        have = self._current(kind, obj)
        have["status"] = _copy(obj.get("status"))
        have["metadata"]["resourceVersion"] = str(next(self._rv))
        return _copy(have)

    def patch(self, kind: api.Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        self._call("patch", kind)
        key = self._key(kind, name, namespace)
        have = self.store.get(key)
        if have is None:
            raise api.ApiError(404, f"{kind.kind} {name} not found")
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != have["metadata"]["resourceVersion"]:
            raise api.ApiError(409, "the object has been modified")
        new = merge_patch(have, patch)
        validate(kind, new)
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.store[key] = new
        self._finish(kind, new)
        return _copy(new)

    def _finish(self, kind: api.Kind, obj: Obj) -> None:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and kind.kind != "Pod":
            self.remove(self._key(kind, meta["name"], meta.get("namespace")))

    def delete(self, kind: api.Kind, name: str, namespace: str | None = None) -> None:
        self._call("delete", kind)
        self._mark_deleted(self._key(kind, name, namespace))

    def evict(self, namespace: str, name: str) -> None:
        self._call("evict", api.POD)
        if f"{namespace}/{name}" in self.pdb_protected:
            raise api.ApiError(
                429, "Cannot evict pod as it would violate the pod's disruption budget."
            )
        self._mark_deleted(self._key(api.POD, name, namespace))

    def served(self, kind: api.Kind) -> bool:
        self._call("get", kind)
        return self._serves(kind)

    def _serves(self, kind: api.Kind) -> bool:
        if kind in (api.DEVICE_CLASS, api.RESOURCE_CLAIM_TEMPLATE):
            return self.dra_served
        if kind in (api.CERTIFICATE, api.ISSUER):
            return self.cert_manager_served
        return True

    def _versions(self, kind: api.Kind, labels: Mapping[str, str] | None) -> dict[Key, str]:
        prefix = f"{kind.api_version}/{kind.kind}"
        while True:
            try:
                items = list(self.store.items())  # another thread may be writing
                break
            except RuntimeError:
                continue
        out = {}
        for key, obj in items:
            have = obj["metadata"].get("labels") or {}
            if key[0] == prefix and not (
                labels and any(have.get(k) != v for k, v in labels.items())
            ):
                out[key] = obj["metadata"]["resourceVersion"]
        return out

    def watch(
        self, kind: api.Kind, timeout: int, labels: Mapping[str, str] | None = None
    ) -> Iterator[tuple[str, Obj]]:
        """As kube-apiserver's watch without a resourceVersion: ADDED for every object there
        is, then each change (an object leaving the label selector is DELETED) until
        ``timeout`` seconds have passed on ``watch_clock``."""
        self._call("watch", kind)
        if not self._serves(kind):
            raise api.ApiError(404, "the server could not find the requested resource")
        if timeout < 1:
            raise api.ApiError(400, "timeoutSeconds must be a positive integer")
        return self._events(kind, timeout, labels)

    def _events(
        self, kind: api.Kind, timeout: int, labels: Mapping[str, str] | None
    ) -> Iterator[tuple[str, Obj]]:
        end = self.watch_clock() + timeout
        known: dict[Key, str] = {}
        last: dict[Key, Obj] = {}
        while True:
            now = self._versions(kind, labels)
            for key, version in now.items():
                if known.get(key) != version:
                    obj = self.store.get(key)
                    if obj is None:
                        continue
                    last[key] = _copy(obj)
                    yield ("MODIFIED" if key in known else "ADDED"), last[key]
                    known[key] = version
            for key in [k for k in known if k not in now]:
                del known[key]
                yield "DELETED", last.pop(key)
            if self.watch_clock() >= end:
                return
            self.watch_sleep(self.watch_poll)


# The tolerations the real DaemonSet controller adds to every DaemonSet pod (and not-ready /
# unreachable with NoExecute): a cordoned or pressured node still runs daemons.
DAEMONSET_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """A toleration matches a taint as the scheduler reads them (an empty key with Exists
    matches every taint; an empty effect every effect)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def node_taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The taints that keep pods off: NoSchedule and NoExecute (a cordon is the unschedulable
    taint the node lifecycle controller adds)."""
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or () if t.get("effect") in ("NoSchedule", "NoExecute")]
    if spec.get("unschedulable") and not any(
        t.get("key") == UNSCHEDULABLE_TAINT["key"] for t in taints
    ):
        taints.append(UNSCHEDULABLE_TAINT)
    return taints


def untolerated(node: Mapping[str, Any], tolerations: list[Any]) -> list[Mapping[str, Any]]:
    """The node's NoSchedule/NoExecute taints that none of ``tolerations`` matches."""
    return [t for t in node_taints(node) if not any(tolerates(x, t) for x in tolerations)]


def _term_matches(node: Mapping[str, Any], term: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": str((node.get("metadata") or {}).get("name"))}
    for source, have in (("matchExpressions", labels), ("matchFields", fields)):
        for expr in term.get(source) or ():
            key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
            present = key in have
            if op == "In" and not (present and have[key] in values):
                return False
            if op == "NotIn" and present and have[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
            if op in ("Gt", "Lt"):
                try:
                    number, bound = int(have[key]), int(values[0])
                except (KeyError, IndexError, ValueError):
                    return False
                if (op == "Gt" and not number > bound) or (op == "Lt" and not number < bound):
                    return False
    return True


def affinity_fits(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """The pod's required node affinity admits ``node`` (terms ORed, expressions ANDed)."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    return any(_term_matches(node, t) for t in required.get("nodeSelectorTerms") or ())


class FakeCluster:
    """Controllers and kubelets over a FakeApi: step() moves the world on by one tick.

    As Kubernetes refuses: the DaemonSet controller places a pod only where the node's
    NoSchedule/NoExecute taints are tolerated (with the tolerations it adds itself, so a cordon
    does not stop a daemon) and the template's required node affinity fits; the scheduler binds
    a pod only where its taints, including a cordon's, are tolerated.
    """

    def __init__(
        self, fake: FakeApi, node_names: list[str], gcu: bool = True, ready_after: int = 1
    ) -> None:
        self.api = fake
        # Ticks a new pod takes to become ready (or to finish, for a validator pod).
        self.ready_after = ready_after
        self._ticks: dict[str, int] = {}
        self.broken_images: set[str] = set()
        # Nodes whose kubelet is gone (NotReady): nothing there starts or finishes terminating.
        self.down_nodes: set[str] = set()
        self.bad_nodes: set[str] = set()
        # Nodes whose kubelet refuses the next GCU pod it admits as a real kubelet does while
        # its device plugin re-registers (after a kubelet or plugin restart): Failed,
        # UnexpectedAdmissionError, "devices unavailable ... which is unexpected".
        self.unexpected_admission: set[str] = set()
        # Nodes whose kubelet refuses every GCU pod that way: their plugin serves no card (or
        # none is free), for good.
        self.refusing_nodes: set[str] = set()
        self.undo_log: list[str] = []
        for name in node_names:
            # A node name may run to 253 characters; a label value only to 63.
            labels = {"kubernetes.io/hostname": name} if len(name) <= 63 else {}
            if gcu:
                labels["enflame.com/gcu.present"] = "true"
            fake.put(api.NODE, {"metadata": {"name": name, "labels": labels}, "spec": {}})
        # The DRA driver's account, which the chart (or deploy/dra/) installs beside the operator.
        fake.put(
            api.SERVICE_ACCOUNT,
            {"metadata": {"name": components.DRA_SERVICE_ACCOUNT, "namespace": "kube-system"}},
        )

    # --- what the scheduler and the kubelet refuse ------------------------------------------
    def _ready_component(self, node: str, component: str) -> Obj | None:
        for pod in self.api.objects(api.POD):
            labels = pod["metadata"].get("labels") or {}
            if (
                labels.get("enflame.com/gcu.component") == component
                and pods.node_of(pod) == node
                and pods.ready(pod)
            ):
                return pod
        return None

    def _node_mode(self, node: str) -> str:
        """The node mode the toolkit on ``node`` installed (its --mode argument)."""
        toolkit = self._ready_component(node, "containerToolkit")
        if toolkit is None:
            return ""
        command = toolkit["spec"]["containers"][0].get("command") or []
        return str(command[command.index("--mode") + 1]) if "--mode" in command else ""

    def _claims_allocatable(self, pod: Obj, node: str) -> bool:
        """Every claim of ``pod`` comes from a template of the GCU DeviceClass, and ``node``
        runs a ready DRA driver."""
        if self._ready_component(node, "dra") is None:
            return False
        for claim in pod["spec"].get("resourceClaims") or []:
            template = self.api.find(
                api.RESOURCE_CLAIM_TEMPLATE,
                str(claim.get("resourceClaimTemplateName")),
                pod["metadata"]["namespace"],
            )
            if template is None:
                return False
            for request in template["spec"]["spec"]["devices"]["requests"]:
                if (request.get("exactly") or {}).get("deviceClassName") != "gcu.enflame.com":
                    return False
        return True

    def _schedule(self) -> None:
        """The scheduler: binds an unbound pod to the node its affinity names, allocating its
        claims there (a claim is only ever allocated here, never for a pod bound by nodeName)."""
        for pod in list(self.api.store.values()):
            if (
                pod["kind"] != "Pod"
                or pods.node_of(pod)
                or pod["metadata"].get("deletionTimestamp")
            ):
                continue
            terms = (
                ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", {})
                .get("nodeSelectorTerms", [])
            )
            names_ = [
                v
                for term in terms
                for field in term.get("matchFields") or []
                if field.get("key") == "metadata.name"
                for v in field.get("values") or []
            ]
            for node in names_:
                node_obj = self.api.find(api.NODE, node)
                if node_obj is None or untolerated(node_obj, pod["spec"].get("tolerations") or []):
                    continue  # cordoned or tainted: the scheduler leaves the pod Pending
                if self._claims_allocatable(pod, node):
                    pod["spec"]["nodeName"] = node
                    pod["status"] = {
                        "phase": "Pending",
                        "resourceClaimStatuses": [
                            {"name": c["name"], "resourceClaimName": f"{pod['metadata']['name']}-x"}
                            for c in pod["spec"].get("resourceClaims") or []
                        ],
                    }
                    pod["metadata"]["resourceVersion"] = str(next(self.api._rv))
                    break

    def _allocatable(self, node: str) -> int | None:
        """The node's allocatable enflame.com/gcu cards, when its status gives them (a test
        sets them; None: not counted)."""
        found = self.api.find(api.NODE, node)
        allocatable = ((found or {}).get("status") or {}).get("allocatable") or {}
        value = allocatable.get("enflame.com/gcu")
        return None if value is None else int(value)

    def _admit(self, pod: Obj) -> Obj | None:
        """The kubelet's admission: the failed status it gives ``pod``, or None to run it."""
        node = pods.node_of(pod)
        for container in pod["spec"]["containers"]:
            wanted = ((container.get("resources") or {}).get("limits") or {}).get("enflame.com/gcu")
            if wanted and (node in self.unexpected_admission or node in self.refusing_nodes):
                self.unexpected_admission.discard(node)
                return {
                    "phase": "Failed",
                    "reason": "UnexpectedAdmissionError",
                    "message": "Pod Allocate failed due to requested number of devices "
                    f"unavailable for enflame.com/gcu. Requested: {wanted}, Available: 0, "
                    "which is unexpected",
                }
            if wanted and self._ready_component(node, "devicePlugin") is None:
                return {
                    "phase": "Failed",
                    "reason": "OutOfenflame.com/gcu",
                    "message": "Pod Node didn't have enough resource: enflame.com/gcu, "
                    f"requested: {wanted}, used: 0, capacity: 0",
                }
            offered = self._allocatable(node)
            if wanted and offered is not None:
                used = sum(
                    pods.cards_held(p, "enflame.com/gcu")
                    for p in self.api.objects(api.POD)
                    if pods.node_of(p) == node and p is not pod and pods.phase(p) == "Running"
                )
                if used + int(wanted) > offered:  # the kubelet's resource fit, as it words it
                    return {
                        "phase": "Failed",
                        "reason": "OutOfenflame.com/gcu",
                        "message": "Pod Node didn't have enough resource: enflame.com/gcu, "
                        f"requested: {wanted}, used: {used}, capacity: {offered}",
                    }
        claims = pod["spec"].get("resourceClaims") or []
        if claims and not pod.get("status", {}).get("resourceClaimStatuses"):
            # Bound by nodeName, so the scheduler never allocated its claim: it waits forever.
            return {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "message": "resource claim is not allocated",
                    }
                ],
            }
        return None

    def _gets_devices(self, pod: Obj) -> bool:
        """Whether the runtime gives the pod its GCUs: on a runtimeclass node, only through
        RuntimeClass enflame."""
        node = pods.node_of(pod)
        if self._node_mode(node) == "runtimeclass":
            return bool(pod["spec"].get("runtimeClassName") == "enflame")
        return True

    @staticmethod
    def _keeps(node: Obj, pod_spec: Obj, selector: Mapping[str, str]) -> bool:
        """A pod already on a node the DaemonSet no longer would place it on stays when only a
        NoSchedule taint is in the way (NoSchedule never evicts); a changed selector, affinity
        or an untolerated NoExecute taint removes it."""
        labels = node["metadata"].get("labels") or {}
        if not all(labels.get(k) == v for k, v in selector.items()):
            return False
        if not affinity_fits(node, pod_spec):
            return False
        blocking = untolerated(node, [*(pod_spec.get("tolerations") or []), *DAEMONSET_TOLERATIONS])
        return all(t.get("effect") == "NoSchedule" for t in blocking)

    def taint(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        """Adds a taint to the node (as kubectl taint does)."""
        node = self.api.store[self.api._key(api.NODE, name, None)]
        spec = node.setdefault("spec", {})
        spec["taints"] = [
            *(spec.get("taints") or []),
            {"key": key, "value": value, "effect": effect},
        ]
        node["metadata"]["resourceVersion"] = str(next(self.api._rv))

    def node_labels(self, name: str) -> dict[str, str]:
        node = self.api.find(api.NODE, name)
        assert node is not None
        return dict(node["metadata"].get("labels") or {})

    def set_allocatable(self, node: str, cards: int) -> None:
        """The node's status says ``cards`` allocatable enflame.com/gcu (its kubelet's count of
        what the plugin lists); the kubelet here then refuses a pod that would exceed it."""
        found = self.api.store[self.api._key(api.NODE, node, None)]
        status = found.setdefault("status", {})
        status["allocatable"] = {"enflame.com/gcu": str(cards)}
        status["capacity"] = {"enflame.com/gcu": str(cards)}
        found["metadata"]["resourceVersion"] = str(next(self.api._rv))

    def add_workload(self, node: str, name: str, cards: str) -> None:
        """A running GCU pod holding ``cards`` on ``node`` (as the kubelet allocated them)."""
        self.api.put(
            api.POD,
            {
                "metadata": {"name": name, "namespace": "default", "annotations": {"cards": cards}},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {"name": "c", "resources": {"limits": {"enflame.com/gcu": "1"}}}
                    ],
                },
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            },
        )

    def step(self, seconds: float = 5.0) -> None:
        fake = self.api
        fake.now += seconds
        for name in self.down_nodes:
            node = fake.store.get(fake._key(api.NODE, name, None))
            if node is not None:
                node["status"] = {"conditions": [{"type": "Ready", "status": "Unknown"}]}
        for key, pod in list(fake.store.items()):
            if pods.node_of(pod) in self.down_nodes:
                continue
            if pod["kind"] == "Pod" and pod["metadata"].get("deletionTimestamp"):
                component = (pod["metadata"].get("labels") or {}).get("enflame.com/gcu.component")
                if component == "containerToolkit":
                    self.undo_log.append(pods.node_of(pod))
                fake.remove(key)
        nodes = fake.objects(api.NODE)
        for ds in fake.objects(api.DAEMONSET):
            template = ds["spec"]["template"]
            selector = template["spec"].get("nodeSelector") or {}
            ns = ds["metadata"]["namespace"]
            mine = [
                p
                for p in fake.objects(api.POD)
                if any(
                    r.get("uid") == ds["metadata"]["uid"]
                    for r in p["metadata"].get("ownerReferences") or []
                )
            ]
            desired = 0
            for node in nodes:
                name = node["metadata"]["name"]
                labels = node["metadata"].get("labels") or {}
                fits = (
                    all(labels.get(k) == v for k, v in selector.items())
                    and affinity_fits(node, template["spec"])
                    and not untolerated(
                        node, [*(template["spec"].get("tolerations") or []), *DAEMONSET_TOLERATIONS]
                    )
                )
                desired += fits
                here = [p for p in mine if pods.node_of(p) == name]
                account = template["spec"].get("serviceAccountName")
                if (
                    fits
                    and not here
                    and account
                    and not fake.find(api.SERVICE_ACCOUNT, account, ns)
                ):
                    # The ServiceAccount admission plugin refuses the pod; the controller retries.
                    continue
                if fits and not here:
                    fake.put(
                        api.POD,
                        {
                            "metadata": {
                                "name": f"{ds['metadata']['name']}-{name}-{fake.now:.0f}",
                                "namespace": ns,
                                "labels": _copy(template["metadata"].get("labels")),
                                "annotations": _copy(template["metadata"].get("annotations")),
                                "ownerReferences": [
                                    {
                                        "apiVersion": "apps/v1",
                                        "kind": "DaemonSet",
                                        "name": ds["metadata"]["name"],
                                        "uid": ds["metadata"]["uid"],
                                        "controller": True,
                                    }
                                ],
                            },
                            "spec": {
                                **_copy(template["spec"]),
                                "nodeName": name,
                                "tolerations": [
                                    *_copy(template["spec"].get("tolerations") or []),
                                    *_copy(DAEMONSET_TOLERATIONS),
                                ],
                            },
                            "status": {"phase": "Pending"},
                        },
                    )
                elif not fits and not self._keeps(node, template["spec"], selector):
                    for p in here:
                        fake._mark_deleted(fake._key(api.POD, p["metadata"]["name"], ns))
            stored = fake.store.get(fake._key(api.DAEMONSET, ds["metadata"]["name"], ns))
            if (
                stored is not None
                and (stored.get("status") or {}).get("desiredNumberScheduled") != desired
            ):
                # As the DaemonSet controller reports it: the nodes that should run its pod.
                stored["status"] = {"desiredNumberScheduled": desired}
                stored["metadata"]["resourceVersion"] = str(next(fake._rv))
        self._schedule()
        for pod in list(fake.store.values()):
            if pod["kind"] != "Pod" or pod["metadata"].get("deletionTimestamp"):
                continue
            if not pods.node_of(pod) or pods.node_of(pod) in self.down_nodes:
                continue  # unschedulable, or no kubelet to run it
            uid = pod["metadata"]["uid"]
            starting = pods.phase(pod) == "Pending" or (
                uid in self._ticks and pods.phase(pod) == "Running" and not pods.ready(pod)
            )
            if not starting:
                continue
            self._ticks[uid] = self._ticks.get(uid, 0) + 1
            if self._ticks[uid] < self.ready_after:
                if pod["spec"].get("restartPolicy") != "Never":
                    pod["status"] = {"phase": "Running", "conditions": []}
                    pod["metadata"]["resourceVersion"] = str(next(fake._rv))
                continue
            self._ticks.pop(uid)
            container = pod["spec"]["containers"][0]
            refused = self._admit(pod)
            if refused is not None:
                pod["status"] = refused
                pod["metadata"]["resourceVersion"] = str(next(fake._rv))
                continue
            if pod["spec"].get("restartPolicy") == "Never" and not self._gets_devices(pod):
                pod["status"] = {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": "validator",
                            "state": {
                                "terminated": {
                                    "exitCode": 1,
                                    "message": "ENFLAME_VISIBLE_DEVICES is not set",
                                }
                            },
                        }
                    ],
                }
            elif pod["spec"].get("restartPolicy") == "Never":
                bad = pods.node_of(pod) in self.bad_nodes
                pod["status"] = {
                    "phase": "Failed" if bad else "Succeeded",
                    "containerStatuses": [
                        {
                            "name": "validator",
                            "state": {
                                "terminated": {
                                    "exitCode": 1 if bad else 0,
                                    "message": "/dev/gcu0 is missing" if bad else "ok",
                                }
                            },
                        }
                    ],
                }
            elif container.get("image") in self.broken_images:
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": container["name"],
                            "state": {
                                "waiting": {
                                    "reason": "CrashLoopBackOff",
                                    "message": "back-off restarting failed container",
                                }
                            },
                        }
                    ],
                }
            else:
                pod["status"] = {
                    "phase": "Running",
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "lastTransitionTime": pods.rfc3339(fake.now),
                        }
                    ],
                }
            pod["metadata"]["resourceVersion"] = str(next(fake._rv))
