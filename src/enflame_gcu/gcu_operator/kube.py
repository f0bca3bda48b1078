"""The operator's ClusterApi on a real API server, through lightkube's generic resources.

lightkube rather than kopf: the operator needs a level-triggered loop over a few lists, a Lease,
status writes and ordered deletion, all of which it does itself so that the planner stays a pure
function; kopf's handler model (per-event handlers, its own peering objects instead of a Lease,
its own state annotations) would sit between the two and add aiohttp and its own client, while
lightkube is already the DRA driver's client.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import lightkube
from lightkube import generic_resource
from lightkube.core.exceptions import ApiError as LightkubeApiError
from lightkube.core.resource_registry import resource_registry
from lightkube.core.selector import build_selector
from lightkube.types import CascadeType, PatchType

from enflame_gcu.gcu_operator import api

Obj = dict[str, Any]
T = TypeVar("T")
EVICTION_V1 = "policy/v1"
EVICTION_V1BETA1 = "policy/v1beta1"
# Seconds a watch may stay silent beyond its own timeoutSeconds before the client gives up on it.
WATCH_GRACE = 30


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


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of an error lightkube did not wrap (its list raises httpx's own)."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


# Modules whose exceptions mean "the API server could not be reached or did not answer in time".
_TRANSPORT_MODULES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "ssl"})


def _is_transport(exc: BaseException) -> bool:
    if isinstance(exc, OSError | TimeoutError):
        return True
    return any(cls.__module__.partition(".")[0] in _TRANSPORT_MODULES for cls in type(exc).__mro__)


def _request(call: Callable[[], T]) -> T:
    """``call()`` with every failure as :class:`api.ApiError`: the server's refusals with their
    status; a connection refused, reset or timed out as ``api.UNREACHABLE``."""
    try:
        return call()
    except LightkubeApiError as exc:
        raise _error(exc) from exc
    except api.ApiError:
        raise
    except Exception as exc:
        status = _http_status(exc)
        if status is not None:
            raise api.ApiError(status, str(exc).splitlines()[0]) from exc
        if not _is_transport(exc):
            raise
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise api.ApiError(api.UNREACHABLE, f"API server unreachable: {text}") from exc


class LightkubeApi:
    """ClusterApi over lightkube's synchronous client."""

    def __init__(self, client: lightkube.Client) -> None:
        self._client = client
        self._eviction_version = EVICTION_V1

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def get(self, kind: api.Kind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None."""
        try:
            return _plain(
                _request(lambda: self._client.get(_resource(kind), name, namespace=namespace))
            )
        except api.ApiError as exc:
            if exc.status == api.NOT_FOUND:
                return None
            raise

    def list(
        self,
        kind: api.Kind,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
        cached: bool = False,
    ) -> list[Obj]:
        """Objects of ``kind``."""

        def fetch() -> list[Obj]:
            where = namespace if namespace is not None else ("*" if kind.namespaced else None)
            if cached:
                # resourceVersion=0: the API server answers from its watch cache (lightkube's
                # list sends none, which is a read of the whole kind from etcd).
                generic = self._client._client
                request = generic.prepare_request(
                    "list",
                    res=_resource(kind),
                    namespace=where,
                    params={
                        "labelSelector": build_selector(dict(labels)) if labels else None,
                        "fieldSelector": build_selector(dict(fields), for_fields=True)
                        if fields
                        else None,
                        "resourceVersion": "0",
                    },
                )
                found = generic.list(request)
            else:
                found = self._client.list(
                    _resource(kind),
                    namespace=where,
                    labels=dict(labels) if labels else None,
                    fields=dict(fields) if fields else None,
                )
            out = []
            for item in found:
                obj = _plain(item)
                obj.setdefault("apiVersion", kind.api_version)
                obj.setdefault("kind", kind.kind)
                out.append(obj)
            return out

        return _request(fetch)

    def create(self, kind: api.Kind, obj: Obj) -> Obj:
        """Create."""
        body = _resource(kind).from_dict(copy.deepcopy(obj))
        return _plain(_request(lambda: self._client.create(body)))

    def replace(self, kind: api.Kind, obj: Obj) -> Obj:
        """PUT."""
        body = _resource(kind).from_dict(copy.deepcopy(obj))
        return _plain(_request(lambda: self._client.replace(body)))

    def patch(self, kind: api.Kind, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        """JSON merge patch."""
        return _plain(
            _request(
                lambda: self._client.patch(
                    _resource(kind), name, patch, namespace=namespace, patch_type=PatchType.MERGE
                )
            )
        )

    def delete(self, kind: api.Kind, name: str, namespace: str | None = None) -> None:
        """Delete in the background; gone already is fine."""
        try:
            _request(
                lambda: self._client.delete(
                    _resource(kind), name, namespace=namespace, cascade=CascadeType.BACKGROUND
                )
            )
        except api.ApiError as exc:
            if exc.status != api.NOT_FOUND:
                raise

    def replace_status(self, kind: api.Kind, obj: Obj) -> Obj:
        """PUT status."""
        body = _resource(kind).Status.from_dict(copy.deepcopy(obj))
        return _plain(_request(lambda: self._client.replace(body)))

    def evict(self, namespace: str, name: str) -> None:
        """Evict through policy/v1 (policy/v1beta1 is gone since Kubernetes 1.25); a server
        older than 1.22, which has only policy/v1beta1, gets that body instead."""
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415 - only when draining

        def send(version: str) -> None:
            body = {
                "apiVersion": version,
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            }
            eviction: Any = Pod.Eviction.from_dict(body)
            # lightkube's model puts its own apiVersion (policy/v1) in from_dict's result: a
            # server before 1.22 refuses that body with 400 "no kind Eviction is registered for
            # version policy/v1", so the version asked for is set on the object itself.
            eviction.apiVersion = version
            _request(lambda: self._client.create(eviction, name=name, namespace=namespace))

        try:
            send(self._eviction_version)
        except api.ApiError as exc:
            unknown_version = (
                exc.status in (400, api.NOT_FOUND) and "policy/v1" in exc.message
            ) or "could not find the requested resource" in exc.message
            if self._eviction_version == EVICTION_V1 and unknown_version:
                self._eviction_version = EVICTION_V1BETA1
                try:
                    send(self._eviction_version)
                except api.ApiError as again:
                    if again.status != api.NOT_FOUND:
                        raise
                return
            if exc.status != api.NOT_FOUND:
                raise

    def served(self, kind: api.Kind) -> bool:
        """Whether listing ``kind`` works (404: not served)."""
        try:
            self.list(kind)
        except api.ApiError as exc:
            if exc.status == api.NOT_FOUND:
                return False
            raise
        return True

    def watch(
        self, kind: api.Kind, timeout: int, labels: Mapping[str, str] | None = None
    ) -> Iterator[tuple[str, Obj]]:
        """One watch request that ends when the server ends it (``timeoutSeconds``).

        lightkube's own watch reconnects for ever; the idle wait wants exactly one request per
        period, so this sends the request lightkube prepares and reads its lines itself."""
        generic = self._client._client
        request = generic.prepare_request(
            "list",
            res=_resource(kind),
            namespace="*" if kind.namespaced else None,
            watch=True,
            params={
                "timeoutSeconds": max(1, int(timeout)),
                "labelSelector": ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))
                or None,
            },
        )
        params = {k: v for k, v in request.params.items() if v is not None}
        built = generic._client.build_request(
            request.method, request.url, params=params, timeout=float(timeout + WATCH_GRACE)
        )
        response = _request(lambda: generic.send(built, stream=True))
        try:
            if response.status_code >= 400:
                body = _request(response.read)
                try:
                    message = str(json.loads(body).get("message") or "")
                except ValueError:
                    message = body[:200].decode(errors="replace")
                raise api.ApiError(response.status_code, message)
            lines = _request(lambda: iter(response.iter_lines()))
            while True:
                line = _request(lambda: next(lines, None))
                if line is None:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise api.ApiError(int(obj.get("code") or 0), str(obj.get("message") or ""))
                yield str(event.get("type")), obj
        finally:
            response.close()
