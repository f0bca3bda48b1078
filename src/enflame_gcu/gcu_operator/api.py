"""The seam between the operator and the Kubernetes API: a small Protocol over plain dicts.

``kube.LightkubeApi`` implements it against a real API server; the tests' fake implements it
in memory. Objects are the API's JSON as dicts, so the planner never sees a client library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from enflame_gcu.gcu_operator import resource as rs

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """A resource type: how the API names and places it."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]


NODE = Kind("v1", "Node", "nodes", namespaced=False)
POD = Kind("v1", "Pod", "pods", namespaced=True)
SERVICE = Kind("v1", "Service", "services", namespaced=True)
DAEMONSET = Kind("apps/v1", "DaemonSet", "daemonsets", namespaced=True)
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases", namespaced=True)
GCU_RESOURCE = Kind(f"{rs.GROUP}/{rs.VERSION}", rs.KIND, rs.PLURAL, namespaced=False)
LEGACY_GCU_RESOURCE = Kind(f"{rs.LEGACY_GROUP}/{rs.VERSION}", rs.KIND, rs.PLURAL, namespaced=False)
# The DRA API the DRA driver needs; served means this cluster can run it.
DEVICE_CLASS = Kind("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False)
EVENT = Kind("v1", "Event", "events", namespaced=True)
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", namespaced=True)
RUNTIME_CLASS = Kind("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", namespaced=False)
RESOURCE_CLAIM_TEMPLATE = Kind(
    "resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", namespaced=True
)
# The device plugin's node-state account and its RBAC (its Node; its Lease in its namespace).
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts", namespaced=True)
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False)
CLUSTER_ROLE_BINDING = Kind(
    "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False
)
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles", namespaced=True)
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", namespaced=True)
# enflame-dra-webhook (spec.dra.webhook): its Deployment, its registration with the API server,
# and the certificate cert-manager makes for it (served only where cert-manager is installed).
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments", namespaced=True)
MUTATING_WEBHOOK = Kind(
    "admissionregistration.k8s.io/v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
CERTIFICATE = Kind("cert-manager.io/v1", "Certificate", "certificates", namespaced=True)
ISSUER = Kind("cert-manager.io/v1", "Issuer", "issuers", namespaced=True)
BY_KIND = {
    k.kind: k
    for k in (
        NODE,
        POD,
        SERVICE,
        DAEMONSET,
        LEASE,
        EVENT,
        NETWORK_POLICY,
        RUNTIME_CLASS,
        RESOURCE_CLAIM_TEMPLATE,
        SERVICE_ACCOUNT,
        CLUSTER_ROLE,
        CLUSTER_ROLE_BINDING,
        ROLE,
        ROLE_BINDING,
        DEPLOYMENT,
        MUTATING_WEBHOOK,
        CERTIFICATE,
        ISSUER,
    )
}


class ApiError(Exception):
    """The API refused a request (status code and the server's message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


NOT_FOUND = 404
# No answer: connection refused or reset, or no reply within the client's timeout.
UNREACHABLE = 0
CONFLICT = 409
# An eviction a PodDisruptionBudget does not allow now.
TOO_MANY_REQUESTS = 429


class ClusterApi(Protocol):
    """What the operator asks of the Kubernetes API."""

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        ...

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
        cached: bool = False,
    ) -> list[Obj]:
        """Objects of ``kind`` (every namespace when None), filtered by equality on labels and
        on fields (a field selector: only the fields the API server indexes for the kind, as
        a Pod's ``spec.nodeName``). ``cached``: from the API server's watch cache
        (``resourceVersion=0``: may lag a moment behind, and reads nothing from etcd)."""
        ...

    def create(self, kind: Kind, obj: Obj) -> Obj:
        """Create ``obj``; ApiError 409 when it exists."""
        ...

    def replace(self, kind: Kind, obj: Obj) -> Obj:
        """PUT ``obj``; ApiError 409 when its resourceVersion is stale."""
        ...

    def patch(self, kind: Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """A JSON merge patch."""
        ...

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        """Delete (background propagation); a missing object is not an error."""
        ...

    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        """PUT the status subresource."""
        ...

    def evict(self, namespace: str, name: str) -> None:
        """Evict a pod through the Eviction API."""
        ...

    def served(self, kind: Kind) -> bool:
        """Whether the API server serves ``kind``."""
        ...

    def watch(
        self, kind: Kind, timeout: int, labels: Mapping[str, str] | None = None
    ) -> Iterator[tuple[str, Obj]]:
        """One watch request from now (no resourceVersion): first an ADDED event for every
        object there is, then each change (ADDED, MODIFIED, DELETED) until the server ends the
        request after ``timeout`` seconds; closing the iterator ends it sooner. ApiError as
        for :meth:`list` (404 when ``kind`` is not served)."""
        ...
