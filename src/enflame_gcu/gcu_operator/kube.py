"""The operator's ClusterApi on a real API server, through lightkube's generic resources.

lightkube rather than kopf: the operator needs a level-triggered loop over a few lists, a Lease,
status writes and ordered deletion, all of which it does itself so that the planner stays a pure
function; kopf's handler model (per-event handlers, its own peering objects instead of a Lease,
its own state annotations) would sit between the two and add aiohttp and its own client, while
lightkube is already the DRA driver's client.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import lightkube
from lightkube import generic_resource
from lightkube.core.exceptions import ApiError as LightkubeApiError
from lightkube.core.resource_registry import resource_registry
from lightkube.types import CascadeType, PatchType

from enflame_gcu.gcu_operator import api

Obj = dict[str, Any]


def _resource(kind: api.Kind) -> Any:
    group, _, version = kind.api_version.rpartition("/")
    known = resource_registry.get(kind.api_version, kind.kind)
    if known is not None:
        return known
    make = (
        generic_resource.create_namespaced_resource
        if kind.namespaced
        else generic_resource.create_global_resource
    )
    return make(group, version, kind.kind, kind.plural)


def _plain(obj: Any) -> Obj:
    if isinstance(obj, dict) and not hasattr(obj, "to_dict"):
        return obj
    return dict(obj.to_dict())


def _error(exc: LightkubeApiError) -> api.ApiError:
    status = exc.status
    return api.ApiError(int(status.code or 0), str(status.message or exc))


def _http_status(exc: Exception) -> int | None:
    """The HTTP status of an error lightkube did not wrap (its list raises httpx's own)."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


class LightkubeApi:
    """ClusterApi over lightkube's synchronous client."""

    def __init__(self, client: lightkube.Client) -> None:
        self._client = client

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def get(self, kind: api.Kind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None."""
        try:
            return _plain(self._client.get(_resource(kind), name, namespace=namespace))
        except LightkubeApiError as exc:
            if exc.status.code == api.NOT_FOUND:
                return None
            raise _error(exc) from exc

    def list(
        self, kind: api.Kind, namespace: str | None = None, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        """Objects of ``kind``."""
        try:
            found = self._client.list(
                _resource(kind),
                namespace=namespace
                if namespace is not None
                else ("*" if kind.namespaced else None),
                labels=dict(labels) if labels else None,
            )
            out = []
            for item in found:
                obj = _plain(item)
                obj.setdefault("apiVersion", kind.api_version)
                obj.setdefault("kind", kind.kind)
                out.append(obj)
            return out
        except LightkubeApiError as exc:
            raise _error(exc) from exc
        except Exception as exc:
            status = _http_status(exc)
            if status is None:
                raise
            raise api.ApiError(status, str(exc).splitlines()[0]) from exc

    def create(self, kind: api.Kind, obj: Obj) -> Obj:
        """Create."""
        try:
            return _plain(self._client.create(_resource(kind).from_dict(copy.deepcopy(obj))))
        except LightkubeApiError as exc:
            raise _error(exc) from exc

    def replace(self, kind: api.Kind, obj: Obj) -> Obj:
        """PUT."""
        try:
            return _plain(self._client.replace(_resource(kind).from_dict(copy.deepcopy(obj))))
        except LightkubeApiError as exc:
            raise _error(exc) from exc

    def patch(self, kind: api.Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """JSON merge patch."""
        try:
            return _plain(
                self._client.patch(
                    _resource(kind), name, patch, namespace=namespace, patch_type=PatchType.MERGE
                )
            )
        except LightkubeApiError as exc:
            raise _error(exc) from exc

    def delete(self, kind: api.Kind, name: str, namespace: str | None = None) -> None:
        """Delete in the background; gone already is fine."""
        try:
            self._client.delete(
                _resource(kind), name, namespace=namespace, cascade=CascadeType.BACKGROUND
            )
        except LightkubeApiError as exc:
            if exc.status.code != api.NOT_FOUND:
                raise _error(exc) from exc

    def replace_status(self, kind: api.Kind, obj: Obj) -> Obj:
        """PUT status."""
        try:
            status_cls = _resource(kind).Status
            return _plain(self._client.replace(status_cls.from_dict(copy.deepcopy(obj))))
        except LightkubeApiError as exc:
            raise _error(exc) from exc

    def evict(self, namespace: str, name: str) -> None:
        """Evict (policy/v1beta1 body: Kubernetes 1.20 has no policy/v1 Eviction)."""
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415 - only when draining

        body = {
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            eviction: Any = Pod.Eviction.from_dict(body)
            self._client.create(eviction, name=name, namespace=namespace)
        except LightkubeApiError as exc:
            if exc.status.code != api.NOT_FOUND:
                raise _error(exc) from exc

    def served(self, kind: api.Kind) -> bool:
        """Whether listing ``kind`` works (404: not served)."""
        try:
            self.list(kind)
        except api.ApiError as exc:
            if exc.status == api.NOT_FOUND:
                return False
            raise
        return True
