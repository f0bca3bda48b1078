"""What one pod says: ready, outdated, failing (and why), finished."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from enflame_gcu.gcu_operator import names

# Waiting reasons that will not fix themselves: a rollout stops on them at once.
_STUCK = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def timestamp(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 API timestamp (None when absent or unreadable)."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339(now: float) -> str:
    """An API timestamp for ``now``."""
    moment = datetime.datetime.fromtimestamp(int(now), tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_of(pod: Mapping[str, Any]) -> str:
    """The node a pod is bound to ("" while unscheduled)."""
    return str(pod.get("spec", {}).get("nodeName") or "")


def template_hash(pod: Mapping[str, Any]) -> str:
    """The template hash the pod was made from."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(names.TEMPLATE_HASH, ""))


def phase(pod: Mapping[str, Any]) -> str:
    """The pod's phase (Pending when not reported yet)."""
    return str(pod.get("status", {}).get("phase") or "Pending")


def ready(pod: Mapping[str, Any]) -> bool:
    """Running with condition Ready=True, and not being deleted."""
    if pod.get("metadata", {}).get("deletionTimestamp") or phase(pod) != "Running":
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def failure(pod: Mapping[str, Any], now: float, timeout: int) -> str | None:
    """Why the pod will not become ready by itself, or None while it still may."""
    if ready(pod):
        return None
    name = pod.get("metadata", {}).get("name", "?")
    for status in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _STUCK:
            message = waiting.get("message") or ""
            return f"pod {name}: {waiting['reason']} {message}".strip()
    if phase(pod) == "Failed":
        return f"pod {name} failed: {pod.get('status', {}).get('message') or 'no message'}"
    created = timestamp(pod.get("metadata", {}).get("creationTimestamp"))
    if created is not None and now - created > timeout:
        return f"pod {name} not ready after {timeout} s"
    return None


def refused_unexpectedly(pod: Mapping[str, Any]) -> str | None:
    """The kubelet's message when it refused the pod at admission for want of GCU cards: for a
    reason it calls unexpected (``UnexpectedAdmissionError``: its device plugin had not listed
    the devices yet, as right after a kubelet or plugin restart, or had none free to list), or
    because the node's allocatable count had none left (``OutOfenflame.com/...``: its cards
    were all held, or not registered again yet). No container ran. None for any other pod."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if phase(pod) != "Failed" or not (
        reason == "UnexpectedAdmissionError"
        or reason.startswith("OutOf" + names.GCU_RESOURCE_PREFIX)
    ):
        return None
    for container in status.get("containerStatuses") or []:
        if (container.get("state") or {}).get("terminated") or container.get("containerID"):
            return None
    return str(status.get("message") or "UnexpectedAdmissionError")


def ready_since(pod: Mapping[str, Any]) -> float | None:
    """When the pod last became Ready (its Ready condition's lastTransitionTime); None when it
    is not Ready or the time is missing or unreadable."""
    if not ready(pod):
        return None
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return timestamp(condition.get("lastTransitionTime"))
    return None


def termination_message(pod: Mapping[str, Any]) -> str:
    """What a finished pod's container said when it ended (its message or exit code)."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated:
            text = str(terminated.get("message") or "").strip()
            return text or f"exit code {terminated.get('exitCode')} ({terminated.get('reason')})"
    return str(pod.get("status", {}).get("message") or pod.get("status", {}).get("reason") or "")


def requests_gcu(pod: Mapping[str, Any]) -> bool:
    """Whether any container of the pod asks for an enflame.com resource."""
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if any(
                str(k).startswith(names.GCU_RESOURCE_PREFIX) for k in resources.get(section) or {}
            ):
                return True
    return False


def _quantity(value: Any) -> int:
    """A whole-card count as a pod spec gives it ("2", 2); 0 for anything else."""
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def cards_held(pod: Mapping[str, Any], resource: str) -> int:
    """How many ``resource`` devices an unfinished pod holds on its node, as the kubelet counts
    them: the larger of its containers' sum and its largest init container (limits, which an
    extended resource's request must equal). 0 for a finished pod."""
    if phase(pod) in ("Succeeded", "Failed"):
        return 0
    spec = pod.get("spec") or {}

    def asked(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        section = resources.get("limits") or resources.get("requests") or {}
        return _quantity(section.get(resource, 0))

    containers = sum(asked(c) for c in spec.get("containers") or [])
    init = max((asked(c) for c in spec.get("initContainers") or []), default=0)
    return max(containers, init)
