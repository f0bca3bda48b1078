"""The kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``) as plain JSON.

The Go types carry no JSON tags, so the keys are the field names: ``ExtenderArgs`` is
``{"Pod": ..., "Nodes": {"items": [...]}, "NodeNames": [...]}``; a filter answers
``{"NodeNames": [...], "FailedNodes": {...}, "Error": ""}`` (or ``"Nodes"`` when it was sent
nodes), a prioritize answers ``[{"Host": ..., "Score": 0..10}, ...]``. Go's decoder matches keys
case-insensitively, and so does this reader. Everything read is bounded: a request that is too
big, not JSON or not shaped like ``ExtenderArgs`` raises :class:`ProtocolError` naming why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The C string encoder json.dumps uses with ensure_ascii (its default), so priority_list's
# bytes are json.dumps's.
_quote_ascii: Any = getattr(json.encoder, "c_encode_basestring_ascii", None) or (
    json.encoder.py_encode_basestring_ascii
)

MAX_BODY = 16 * 1024 * 1024  # 5000 full Node objects fit; NodeNames alone are far smaller
MAX_NODES = 5000
MAX_CONTAINERS = 64


class ProtocolError(ValueError):
    """A request the extender cannot read; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod asks of GCUs: whole cards in all, and slices per container."""

    namespace: str
    name: str
    uid: str
    cards: int
    slices: tuple[int, ...]

    @property
    def key(self) -> str:
        """``namespace/name``, as the node state lists holders."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize call: the pod, the candidate names, the Node objects if sent
    (answered back as they came; their annotations are not read)."""

    pod: PodRequest
    node_names: tuple[str, ...]
    # The Node objects by name when the scheduler sent them (nodeCacheCapable false); None
    # when it sent names only and the extender's cache must answer.
    nodes: Mapping[str, Mapping[str, Any]] | None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def get_key(document: Mapping[str, Any], key: str) -> Any:
    """A key matched as Go's decoder does (exact first, then ignoring case)."""
    if key in document:
        return document[key]
    lowered = key.lower()
    for name, value in document.items():
        if isinstance(name, str) and name.lower() == lowered:
            return value
    return None


def _quantity(value: Any, where: str) -> int:
    """A whole-number quantity (``"2"`` or ``2``); extended resources take no fractions."""
    text = str(value).strip() if isinstance(value, (str, int)) else ""
    if not text.isdigit() or len(text) > 6:
        raise ProtocolError(f"{where} is {value!r:.40}, not a whole number of devices")
    return int(text)


def container_requests(pod: Mapping[str, Any], resource: str, shared: str) -> tuple[int, list[int]]:
    """(whole cards, slices per container) a pod asks for, init containers as the kubelet
    counts them: the larger of the biggest init container and the app containers' sum."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise ProtocolError("Pod has no spec object")

    def read(kind: str) -> list[tuple[int, int]]:
        items = spec.get(kind) or []
        if not isinstance(items, list) or len(items) > MAX_CONTAINERS:
            raise ProtocolError(f"Pod spec.{kind} is not a list of at most {MAX_CONTAINERS}")
        result = []
        for index, container in enumerate(items):
            resources = container.get("resources") if isinstance(container, dict) else None
            resources = resources if isinstance(resources, dict) else {}
            want: dict[str, Any] = {}
            for field in ("requests", "limits"):  # limits imply requests for extended resources
                values = resources.get(field)
                if isinstance(values, dict):
                    want = {**values, **want}
            where = f"spec.{kind}[{index}]"
            cards = _quantity(want[resource], f"{where} {resource}") if resource in want else 0
            slices = _quantity(want[shared], f"{where} {shared}") if shared in want else 0
            result.append((cards, slices))
        return result

    apps, inits = read("containers"), read("initContainers")
    cards = max([sum(c for c, _ in apps), *(c for c, _ in inits)])
    slices = [s for _, s in apps if s]
    biggest_init = max((s for _, s in inits), default=0)
    if biggest_init > sum(slices):
        # The kubelet gives the app containers the init container's slices again: the pod
        # holds the larger of the two, and the init container's is chosen alone, first.
        slices = [biggest_init]
    return cards, slices


def parse_args(body: bytes, resource: str, shared: str) -> ExtenderArgs:
    """Read an ``ExtenderArgs`` body."""
    if len(body) > MAX_BODY:
        raise ProtocolError(f"request body of {len(body)} bytes is over {MAX_BODY}")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"request body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ProtocolError("request body is not a JSON object (ExtenderArgs)")
    pod = get_key(document, "Pod")
    if not isinstance(pod, dict):
        raise ProtocolError("ExtenderArgs has no Pod object")
    meta = _dict(pod.get("metadata"))
    cards, slices = container_requests(pod, resource, shared)
    request = PodRequest(
        str(meta.get("namespace") or "default")[:253],
        str(meta.get("name") or "")[:253],
        str(meta.get("uid") or "")[:64],
        cards,
        tuple(slices),
    )
    names = get_key(document, "NodeNames")
    nodes = get_key(document, "Nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise ProtocolError("ExtenderArgs NodeNames is not a list of strings")
        if len(names) > MAX_NODES:
            raise ProtocolError(f"ExtenderArgs names {len(names)} nodes, more than {MAX_NODES}")
        return ExtenderArgs(request, tuple(names), None)
    if nodes is None:
        raise ProtocolError("ExtenderArgs has neither NodeNames nor Nodes")
    items = get_key(nodes, "items") if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        raise ProtocolError("ExtenderArgs Nodes has no items list")
    if len(items) > MAX_NODES:
        raise ProtocolError(f"ExtenderArgs carries {len(items)} nodes, more than {MAX_NODES}")
    sent: dict[str, Mapping[str, Any]] = {}
    for index, node in enumerate(items):
        node_meta = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(node_meta, dict) or not isinstance(node_meta.get("name"), str):
            raise ProtocolError(f"ExtenderArgs Nodes.items[{index}] has no metadata.name")
        sent[node_meta["name"]] = node
    return ExtenderArgs(request, tuple(sent), sent)


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str] | None = None,
) -> bytes:
    """An ``ExtenderFilterResult`` in the form the call came in (names, or the Node objects);
    ``unresolvable`` nodes (``FailedAndUnresolvableNodes``, kube-scheduler >= 1.19) are the
    ones preemption cannot make fit."""
    document: dict[str, Any] = {"FailedNodes": dict(failed), "Error": ""}
    if unresolvable:
        document["FailedAndUnresolvableNodes"] = dict(unresolvable)
    if args.nodes is not None:
        document["Nodes"] = {"items": [args.nodes[name] for name in passed]}
    else:
        document["NodeNames"] = passed
    return json.dumps(document, separators=(",", ":")).encode()


def priority_list(scores: Mapping[str, int]) -> bytes:
    """A ``HostPriorityList``: the bytes ``json.dumps`` writes for ``[{"Host": host, "Score":
    score}, ...]`` with compact separators, written directly (5,000 nodes per call)."""
    prefixes, tails = _HOSTS.prefixes(scores), _SCORE_TAILS
    try:
        items = ",".join([prefixes[host] + tails[score] for host, score in scores.items()])
    except (KeyError, TypeError):  # a score outside 0..10: as json.dumps writes it
        items = ",".join([f"{prefixes[host]}{int(score)}}}" for host, score in scores.items()])
    return f"[{items}]".encode()


class _HostPrefixes:
    """Each host's ``{"Host":"<name>","Score":``, kept from call to call: the scheduler asks
    about the same nodes every time, so a call joins strings in C instead of quoting and
    formatting 5,000 of them (issue 49). Bounded to ``limit`` names of at most ``longest``
    characters; past that the table starts again (a new dict: a call still reading the old
    one on another thread keeps a whole one)."""

    def __init__(self, limit: int, longest: int = 253) -> None:  # a Node name: a DNS subdomain
        self.limit, self.longest = limit, longest
        self._table: dict[str, str] = {}

    def prefixes(self, hosts: Mapping[str, object]) -> Mapping[str, str]:
        """A table holding every one of ``hosts``."""
        table = self._table
        if table.keys() >= hosts.keys():
            return table
        missing = [host for host in hosts if host not in table]
        if len(table) + len(missing) > self.limit:
            table = self._table = {}
        extra: dict[str, str] = {}  # past the bound or too long: answered, not kept
        for host in missing:
            prefix = f'{{"Host":{_quote_ascii(host)},"Score":'
            if len(table) < self.limit and len(host) <= self.longest:
                table[host] = prefix
            else:
                extra[host] = prefix
        return {**table, **extra} if extra else table


_HOSTS = _HostPrefixes(2 * MAX_NODES)
_SCORE_TAILS = {score: f"{score}}}" for score in range(11)}  # the scores 0..10
