"""What the webhook makes of one AdmissionReview: the pod's JSONPatch and the claim template.

A container asking ``enflame.com/gcu: N`` loses that resource and gets a pod claim made from the
namespace's ResourceClaimTemplate ``enflame-gcu-switch-local-N``: ``firstAvailable`` N cards
under one PCIe switch, else one root port, else one NUMA node, else any N, each alternative
bound by a ``matchAttribute`` constraint (the order the device plugin prefers, docs/dra.md,
"Unmodified pods"). Pure: no I/O; :mod:`.server` asks the API server (:mod:`.cluster`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from enflame_gcu import naming, resourceslices

RESOURCE = "enflame.com/gcu"
DEVICE_CLASS = "gcu.enflame.com"  # whole cards (deploy/dra/deviceclasses.yaml)
OPT_OUT_LABEL = "gcu.enflame.com/switch-local"  # "false" on a pod: leave it as written
ANNOTATION = "gcu.enflame.com/switch-local"  # set on a rewritten pod: what it asked
TEMPLATE_PREFIX = "enflame-gcu-switch-local-"
MANAGED_BY = "enflame-dra-webhook"
REQUEST = "gcus"
# A claim's allocation holds at most 32 devices (resource.k8s.io AllocationResultsMaxSize).
MAX_CARDS = 32
# (subrequest, attribute): the device plugin's preference, narrowest first; "any" follows.
LEVELS = (
    ("switch", f"{naming.DRA_DRIVER}/pcieSwitch"),
    ("rootport", f"{naming.DRA_DRIVER}/pcieRootPort"),
    ("numa", f"{resourceslices.STANDARD_DOMAIN}/numaNode"),
)
REVIEW_API = "admission.k8s.io/v1"
_DIGITS = re.compile(r"^[0-9]{1,6}$")


class ReviewError(ValueError):
    """The body is not an AdmissionReview request this webhook can answer."""


@dataclass(frozen=True, slots=True)
class Review:
    """The parts of an AdmissionReview request the webhook reads."""

    uid: str
    kind: str
    operation: str
    namespace: str
    dry_run: bool
    pod: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """A pod's rewrite: ``claims`` maps (container list, index) to the cards it asks."""

    claims: dict[tuple[str, int], int] = field(default_factory=dict)
    skip: str = ""  # why the pod is left as written ("" = rewrite it)
    warn: bool = False  # tell the user why (an admission warning)

    @property
    def sizes(self) -> list[int]:
        """The distinct card counts, i.e. the templates needed."""
        return sorted(set(self.claims.values()))


def parse_review(body: bytes) -> Review:
    """The request of an ``admission.k8s.io/v1`` AdmissionReview; ReviewError naming the
    problem for anything else."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ReviewError("the body is not JSON an API server sends: nested too deeply") from None
    if not isinstance(document, dict):
        raise ReviewError("the body is not a JSON object")
    if document.get("apiVersion") != REVIEW_API or document.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"want an {REVIEW_API} AdmissionReview, got apiVersion "
            f"{document.get('apiVersion')!r} kind {document.get('kind')!r}"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        raise ReviewError("request.uid must be a non-empty string")
    kind = request.get("kind") or {}
    pod = request.get("object")
    if not isinstance(kind, dict) or not isinstance(pod, dict | None):
        raise ReviewError("request.kind and request.object must be objects")
    namespace = request.get("namespace") or ""
    if not isinstance(namespace, str):
        raise ReviewError("request.namespace must be a string")
    return Review(
        uid=uid,
        kind=f"{kind.get('group', '')}/{kind.get('version', '')}/{kind.get('kind', '')}",
        operation=str(request.get("operation") or ""),
        namespace=namespace,
        dry_run=request.get("dryRun") is True,
        pod=pod or {},
    )


def _cards(value: Any) -> int:
    """The whole number of cards a quantity asks; ValueError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise ValueError(f"{value!r} is not a quantity")
    if not _DIGITS.match(text):
        raise ValueError(f"{value!r} is not a whole number of cards")
    return int(text)


def _asked(container: Mapping[str, Any], resource: str) -> int:
    """Cards one container asks (0: none); ValueError when the request cannot be served."""
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise ValueError("resources is not an object")
    found = {}
    for part in ("limits", "requests"):
        values = resources.get(part) or {}
        if not isinstance(values, dict):
            raise ValueError(f"resources.{part} is not an object")
        if resource in values:
            found[part] = _cards(values[resource])
    if len(set(found.values())) > 1:
        raise ValueError(f"requests {found['requests']} and limits {found['limits']} differ")
    cards = next(iter(found.values()), 0)
    if cards > MAX_CARDS:
        raise ValueError(f"{cards} cards is more than one claim holds ({MAX_CARDS})")
    return cards


def plan(pod: Mapping[str, Any], resource: str = RESOURCE) -> Plan:
    """Which containers get a switch-local claim, or why the pod stays as written."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return Plan(skip="the object has no pod spec", warn=True)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if isinstance(labels, dict) and labels.get(OPT_OUT_LABEL) == "false":
        return Plan(skip=f"the pod is labelled {OPT_OUT_LABEL}=false")
    if spec.get("nodeName"):
        # Bound by name, the pod never meets the scheduler, and only it allocates claims.
        return Plan(skip="the pod names its node (spec.nodeName): no scheduler allocates a claim")
    claims: dict[tuple[str, int], int] = {}
    for part in ("initContainers", "containers"):
        containers = spec.get(part) or []
        if not isinstance(containers, list):
            return Plan(skip=f"spec.{part} is not a list", warn=True)
        for index, container in enumerate(containers):
            if not isinstance(container, dict):
                return Plan(skip=f"spec.{part}[{index}] is not an object", warn=True)
            name = container.get("name", index)
            try:
                cards = _asked(container, resource)
            except ValueError as exc:
                return Plan(skip=f"container {name}: {resource}: {exc}", warn=True)
            if not cards:
                continue
            if (container.get("resources") or {}).get("claims"):
                return Plan(skip=f"container {name} already uses resource claims")
            if part == "initContainers" and container.get("restartPolicy") != "Always":
                # The device plugin lets the app containers reuse an init container's cards; a
                # claim is held for the pod's life, so the pod would need more cards than
                # before and might never fit. Left to the plain path.
                return Plan(
                    skip=f"init container {name} asks {resource}: a claim would hold its cards "
                    "for the pod's life (the device plugin reuses them)",
                    warn=True,
                )
            claims[(part, index)] = cards
    if not claims:
        return Plan(skip=f"no container asks {resource}")
    if spec.get("resourceClaims"):
        return Plan(skip="the pod already uses resource claims")
    return Plan(claims=claims)


def template_name(cards: int) -> str:
    """The ResourceClaimTemplate of ``cards`` switch-local cards."""
    return f"{TEMPLATE_PREFIX}{cards}"


def claim_spec(cards: int, device_class: str = DEVICE_CLASS) -> dict[str, Any]:
    """The claim: one card plainly; N cards switch, root port, NUMA node, any, in that order."""

    def exact(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": cards,
        }

    if cards == 1:
        request = exact(REQUEST)
        request.pop("name")
        return {"devices": {"requests": [{"name": REQUEST, "exactly": request}]}}
    names = [name for name, _ in LEVELS] + ["any"]
    return {
        "devices": {
            "requests": [{"name": REQUEST, "firstAvailable": [exact(n) for n in names]}],
            "constraints": [
                {"requests": [f"{REQUEST}/{name}"], "matchAttribute": attribute}
                for name, attribute in LEVELS
            ],
        }
    }


def template(cards: int, namespace: str, device_class: str = DEVICE_CLASS) -> dict[str, Any]:
    """The ResourceClaimTemplate the rewritten pod names."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(cards),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "spec": {"spec": claim_spec(cards, device_class)},
    }


def _pointer(*parts: str | int) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def claim_name(part: str, index: int) -> str:
    """The pod claim of one container (a DNS label whatever the container is called)."""
    return f"enflame-gcu-{'init' if part == 'initContainers' else 'c'}{index}"


def patch(pod: Mapping[str, Any], chosen: Plan, resource: str = RESOURCE) -> list[dict[str, Any]]:
    """The JSONPatch: the resource removed, a claim per container, the pod's claims, a note."""
    spec = pod["spec"]
    operations: list[dict[str, Any]] = []
    pod_claims = []
    asked = []
    for (part, index), cards in sorted(chosen.claims.items()):
        container = spec[part][index]
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if resource in (resources.get(section) or {}):
                path = _pointer("spec", part, index, "resources", section, resource)
                operations.append({"op": "remove", "path": path})
        name = claim_name(part, index)
        where = _pointer("spec", part, index, "resources")
        if "resources" not in container:
            operations.append({"op": "add", "path": where, "value": {"claims": [{"name": name}]}})
        else:
            operations.append({"op": "add", "path": where + "/claims", "value": [{"name": name}]})
        pod_claims.append({"name": name, "resourceClaimTemplateName": template_name(cards)})
        asked.append(f"{container.get('name', index)}={cards}")
    operations.append({"op": "add", "path": "/spec/resourceClaims", "value": pod_claims})
    note = f"{resource}: " + ",".join(asked)
    metadata = pod.get("metadata") or {}
    if "metadata" not in pod:
        operations.append({"op": "add", "path": "/metadata", "value": {}})
    if metadata.get("annotations"):
        path = _pointer("metadata", "annotations", ANNOTATION)
        operations.append({"op": "add", "path": path, "value": note})
    else:
        value = {ANNOTATION: note}
        operations.append({"op": "add", "path": "/metadata/annotations", "value": value})
    return operations


def response(
    review: Review | None,
    operations: Sequence[Mapping[str, Any]] = (),
    warnings: Sequence[str] = (),
    uid: str = "",
) -> dict[str, Any]:
    """The AdmissionReview answer: always allowed; the patch when there is one."""
    answer: dict[str, Any] = {"uid": review.uid if review else uid, "allowed": True}
    if operations:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(list(operations)).encode()).decode()
    if warnings:
        # Short: kubectl prints each on one line, and the server bounds what it keeps.
        answer["warnings"] = [w if len(w) <= 256 else w[:253] + "..." for w in warnings]
    return {"apiVersion": REVIEW_API, "kind": "AdmissionReview", "response": answer}
