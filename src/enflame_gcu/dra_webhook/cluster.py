"""What the webhook asks the API server before it rewrites a pod (lightkube, synchronous).

Two facts, each remembered for ``remember`` seconds: ``resource.k8s.io/v1`` serves the
whole-card DeviceClass (an API server before 1.34 has no such group and would silently drop
``spec.resourceClaims`` from a pod, taking its cards away: such a cluster never gets a rewritten
pod), and the namespace holds the switch-local template as this webhook writes it (created
when missing; one whose spec differs, edited by hand or stored without ``firstAvailable`` by a
server with ``DRAPrioritizedList`` off, is not used). Every failure is a sentence for the
admission warning, never an exception: the pod is then admitted as written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import httpx2
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaimTemplate

from enflame_gcu.dra_webhook import rewrite
from enflame_gcu.errors import ConfigError

log = logging.getLogger(__name__)
NOT_FOUND = 404
CONFLICT = 409


def connect(kubeconfig: str = "", timeout: float = 2.0) -> Client:
    """A client from a kubeconfig file, else from the pod's service account."""
    try:
        config = (
            KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
        )
    except Exception as exc:  # lightkube raises several kinds for a bad or missing config
        where = kubeconfig or "the in-cluster service account"
        raise ConfigError(f"cannot configure the API client from {where}: {exc}") from exc
    return Client(config=config, timeout=httpx2.Timeout(timeout), field_manager=rewrite.MANAGED_BY)


def _code(exc: Exception) -> int:
    """The HTTP status of a failed call (0: none came back)."""
    if isinstance(exc, ApiError):
        return int(getattr(exc.status, "code", 0) or 0)
    if isinstance(exc, httpx2.HTTPStatusError):
        # A group the server does not serve answers "404 page not found", text, not a Status.
        return int(exc.response.status_code)
    return 0


def covers(wanted: Any, got: Any) -> bool:
    """Whether ``got`` holds everything ``wanted`` says (the server may add defaults)."""
    if isinstance(wanted, Mapping):
        return isinstance(got, Mapping) and all(covers(v, got.get(k)) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(got, list)
            and len(got) == len(wanted)
            and all(covers(w, g) for w, g in zip(wanted, got, strict=True))
        )
    return bool(wanted == got)


class Cluster:
    """The DRA API and the namespaces' templates, as far as the webhook needs them."""

    def __init__(
        self,
        client: Client,
        device_class: str = rewrite.DEVICE_CLASS,
        *,
        remember: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.device_class = device_class
        self.remember = remember
        self._clock = clock
        self._lock = threading.Lock()
        self._api: tuple[float, str] | None = None  # (checked at, problem or "")
        self._templates: dict[tuple[str, int], float] = {}  # found good at

    def dra_problem(self) -> str:
        """Why pods cannot be given claims here ("" when they can)."""
        with self._lock:
            if self._api is not None and self._clock() - self._api[0] < self.remember:
                return self._api[1]
        problem = self._check_api()
        with self._lock:
            self._api = (self._clock(), problem)
        if problem:
            log.warning("not rewriting pods: %s", problem)
        return problem

    def _check_api(self) -> str:
        try:
            self.client.get(DeviceClass, self.device_class)
        except (ApiError, httpx2.HTTPStatusError) as exc:
            if _code(exc) == NOT_FOUND:
                return (
                    f"the API server does not serve DeviceClass {self.device_class} in "
                    "resource.k8s.io/v1 (Kubernetes before 1.34, or the DRA driver's classes "
                    "are not installed)"
                )
            return f"reading DeviceClass {self.device_class} failed: {exc}"
        except Exception as exc:  # transport errors of every kind: the server is not reachable
            return f"the API server did not answer reading DeviceClass {self.device_class}: {exc}"
        return ""

    def template_problem(self, namespace: str, cards: int, *, create: bool = True) -> str:
        """Make sure ``namespace`` has the template of ``cards`` cards; why not ("" = it has)."""
        key = (namespace, cards)
        with self._lock:
            found = self._templates.get(key)
            if found is not None and self._clock() - found < self.remember:
                return ""
        wanted = rewrite.template(cards, namespace, self.device_class)
        name = wanted["metadata"]["name"]
        try:
            stored = self._read_or_create(wanted, create)
        except (ApiError, httpx2.HTTPStatusError) as exc:
            return f"ResourceClaimTemplate {namespace}/{name}: {exc}"
        except Exception as exc:  # transport errors of every kind
            return (
                f"the API server did not answer for ResourceClaimTemplate {namespace}/{name}: {exc}"
            )
        if stored is None:
            return f"ResourceClaimTemplate {namespace}/{name} does not exist (dry run: not created)"
        if not covers(wanted["spec"], stored.get("spec")):
            return (
                f"ResourceClaimTemplate {namespace}/{name} exists with another spec (edited, or "
                "stored without firstAvailable by a server with DRAPrioritizedList off)"
            )
        with self._lock:
            self._templates[key] = self._clock()
        return ""

    def _read_or_create(self, wanted: dict[str, Any], create: bool) -> dict[str, Any] | None:
        meta = wanted["metadata"]
        try:
            found = self.client.get(
                ResourceClaimTemplate, meta["name"], namespace=meta["namespace"]
            )
            return cast(dict[str, Any], found.to_dict())
        except (ApiError, httpx2.HTTPStatusError) as exc:
            if _code(exc) != NOT_FOUND or not create:
                if _code(exc) == NOT_FOUND:
                    return None
                raise
        template = cast(ResourceClaimTemplate, ResourceClaimTemplate.from_dict(wanted))
        try:
            made = self.client.create(template, namespace=meta["namespace"])
        except ApiError as exc:
            if _code(exc) != CONFLICT:
                raise
            # Another replica created it in between: read what is there.
            made = self.client.get(ResourceClaimTemplate, meta["name"], namespace=meta["namespace"])
        log.info("created ResourceClaimTemplate %s/%s", meta["namespace"], meta["name"])
        return cast(dict[str, Any], made.to_dict())
