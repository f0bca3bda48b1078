"""The API server through lightkube: claims for Prepare, ResourceSlices for the publisher.

lightkube (with lightkube-models) is a maintained asyncio client whose ``resource.k8s.io/v1``
models are typed dataclasses; objects cross into the rest of the driver as plain JSON dicts
(``to_dict`` / ``from_dict`` round-trip them exactly), so the domain never sees the client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, cast

from lightkube import AsyncClient, KubeConfig
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from enflame_gcu import resourceslices
from enflame_gcu.dra_plugin import claims, publisher
from enflame_gcu.errors import ClaimError, ConfigError

log = logging.getLogger(__name__)
NOT_FOUND = 404
CONFLICT = 409


def connect(kubeconfig: str = "") -> AsyncClient:
    """A client from a kubeconfig file, else from the pod's service account."""
    try:
        if kubeconfig:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_service_account()
    except Exception as exc:  # lightkube raises several kinds for a bad or missing config
        where = kubeconfig or "the in-cluster service account"
        raise ConfigError(f"cannot configure the API client from {where}: {exc}") from exc
    return AsyncClient(config=config, field_manager="enflame-dra-plugin")


def _slice(document: dict[str, Any]) -> ResourceSlice:
    # from_dict is typed on the base class; the object is the class it is called on.
    return cast(ResourceSlice, ResourceSlice.from_dict(document))


def _code(exc: ApiError) -> int:
    return int(getattr(exc.status, "code", 0) or 0)


# Modules whose exceptions mean "the API server could not be reached or did not answer".
_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "ssl"})


def _is_transport(exc: BaseException) -> bool:
    if isinstance(exc, OSError | TimeoutError):
        return True
    return any(cls.__module__.partition(".")[0] in _TRANSPORT_MODULES for cls in type(exc).__mro__)


class ApiServer:
    """:class:`claims.ClaimSource` and :class:`publisher.SliceApi` for one node and driver."""

    def __init__(
        self, client: AsyncClient, node_name: str, driver: str = resourceslices.DRIVER
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.driver = driver

    @property
    def _fields(self) -> FieldSelector:
        return {"spec.nodeName": self.node_name, "spec.driver": self.driver}

    async def allocated_devices(self, claim: claims.ClaimRef) -> list[claims.AllocatedDevice]:
        """Read the claim and return our driver's allocation results."""
        try:
            found = await self.client.get(ResourceClaim, claim.name, namespace=claim.namespace)
        except ApiError as exc:
            if _code(exc) == NOT_FOUND:
                raise ClaimError(f"claim {claim} not found on the API server") from exc
            raise ClaimError(f"cannot read claim {claim}: {exc}") from exc
        except Exception as exc:
            # An outage fails this claim (the kubelet retries it), not the whole call.
            if not _is_transport(exc):
                raise
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ClaimError(
                f"cannot read claim {claim}: the API server is unreachable ({text})"
            ) from exc
        return claims.allocated_devices(claim, found.to_dict(), self.driver)

    async def list_slices(self) -> tuple[list[dict[str, Any]], str]:
        """Our node's slices of our driver."""
        listing = self.client.list(ResourceSlice, fields=self._fields)
        items = [item.to_dict() async for item in listing]
        return items, str(listing.resourceVersion or "")

    async def create_slice(self, document: dict[str, Any]) -> dict[str, Any]:
        """Create one slice; publisher.NameTaken when another object has its name."""
        try:
            created = await self.client.create(_slice(document))
        except ApiError as exc:
            if _code(exc) == CONFLICT:
                raise publisher.NameTaken(str(exc)) from exc
            raise
        return dict(created.to_dict())

    async def replace_slice(self, document: dict[str, Any]) -> dict[str, Any]:
        """Update one slice; publisher.Conflict when it changed since it was read."""
        try:
            replaced = await self.client.replace(_slice(document))
        except ApiError as exc:
            if _code(exc) == CONFLICT:
                raise publisher.Conflict(str(exc)) from exc
            raise
        return dict(replaced.to_dict())

    async def delete_slice(self, name: str) -> None:
        """Delete one slice (already gone is fine)."""
        try:
            await self.client.delete(ResourceSlice, name)
        except ApiError as exc:
            if _code(exc) != NOT_FOUND:
                raise

    async def watch_slices(
        self, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events on our slices after ``resource_version``."""
        events = self.client.watch(
            ResourceSlice, fields=self._fields, resource_version=resource_version or None
        )
        async for kind, item in events:
            yield kind, item.to_dict()

    async def node_uid(self) -> str | None:
        """The Node's UID; None when the node cannot be read (slices then carry no owner)."""
        try:
            found = await self.client.get(Node, self.node_name)
        except ApiError as exc:
            log.warning(
                "cannot read node %s (%s): slices get no owner reference", self.node_name, exc
            )
            return None
        return found.metadata.uid if found.metadata else None

    async def delete_driver_slices(self, every_node: bool = False) -> int:
        """Delete the driver's slices of this node (or of every node); returns how many."""
        fields: FieldSelector = {"spec.driver": self.driver} if every_node else self._fields
        names = [
            item.metadata.name
            async for item in self.client.list(ResourceSlice, fields=fields)
            if item.metadata and item.metadata.name
        ]
        for name in names:
            await self.delete_slice(name)
        return len(names)
