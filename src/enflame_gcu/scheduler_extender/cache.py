"""What the extender knows of the cluster: each node's state and the GCU pods bound to nodes.

Fed by the API watches (:mod:`.watch`) and read by the HTTP handlers from other threads, so
every method takes the one lock and copies out what it returns. A pod bound to a node but not
yet listed in the node's state (the kubelet has not admitted it, or the plugin has not written
since) is *pending* there: its cards are counted against the node, in the order the pods were
bound, for at most ``pending_ttl`` seconds. Between a prioritize and the binding's watch event,
the node this extender ranked first for the pod holds a *guess* for ``guess_ttl`` seconds, so a
burst of pods does not all land on the same free pair before any binding is seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from enflame_gcu import node_state
from enflame_gcu.errors import NodeStateError
from enflame_gcu.scheduler_extender import protocol

log = logging.getLogger(__name__)
MAX_PODS = 200_000


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A GCU pod on a node: what it asks for and since when the extender knows."""

    node: str
    key: str
    cards: int
    slices: tuple[int, ...]
    since: float


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as a handler sees it: its state (or why there is none) and pending pods."""

    state: node_state.NodeState | None
    problem: str
    pending_cards: tuple[int, ...]
    pending_slices: tuple[tuple[int, ...], ...]


class ClusterCache:
    """Node states and bound GCU pods; thread-safe."""

    def __init__(
        self,
        resource: str = "enflame.com/gcu",
        shared: str = "enflame.com/shared-gcu",
        *,
        pending_ttl: float = 30.0,
        guess_ttl: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource, self.shared = resource, shared
        self.pending_ttl, self.guess_ttl = pending_ttl, guess_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._texts: dict[str, str | None] = {}
        self._states: dict[str, node_state.NodeState | str] = {}
        self._bound: dict[str, BoundPod] = {}
        self._guesses: dict[str, BoundPod] = {}

    # --- nodes ------------------------------------------------------------------------------

    def set_node(self, name: str, annotations: Mapping[str, Any] | None) -> None:
        """A node was added or changed; its annotation is parsed once per new text."""
        text = (annotations or {}).get(node_state.ANNOTATION)
        text = text if isinstance(text, str) else None
        with self._lock:
            if name in self._texts and self._texts[name] == text:
                return
            self._texts[name] = text
        self._states_put(name, _read(name, text))

    def _states_put(self, name: str, state: node_state.NodeState | str) -> None:
        with self._lock:
            if name in self._texts:
                self._states[name] = state

    def delete_node(self, name: str) -> None:
        """A node is gone."""
        with self._lock:
            self._texts.pop(name, None)
            self._states.pop(name, None)

    def replace_nodes(self, nodes: Mapping[str, Mapping[str, Any] | None]) -> None:
        """A fresh listing: exactly these nodes (name -> annotations)."""
        with self._lock:
            for gone in set(self._texts) - set(nodes):
                self._texts.pop(gone, None)
                self._states.pop(gone, None)
        for name, found in nodes.items():
            self.set_node(name, found)

    # --- pods -------------------------------------------------------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed: kept when it is bound, asks for GCUs and is not done."""
        meta, spec, status = (_dict(pod.get(key)) for key in ("metadata", "spec", "status"))
        uid = str(meta.get("uid") or "")
        node = spec.get("nodeName")
        if not uid:
            return
        try:
            cards, slices = protocol.container_requests(pod, self.resource, self.shared)
        except protocol.ProtocolError as exc:
            log.debug("pod %s/%s ignored: %s", meta.get("namespace"), meta.get("name"), exc)
            cards, slices = 0, []
        done = status.get("phase") in ("Succeeded", "Failed")
        with self._lock:
            if not node or done or not (cards or slices):
                self._bound.pop(uid, None)
                return
            self._guesses.pop(uid, None)
            old = self._bound.get(uid)
            if old is not None and old.node == node:
                return
            if len(self._bound) >= MAX_PODS:
                log.warning("more than %d GCU pods bound; %s not tracked", MAX_PODS, uid)
                return
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            self._bound[uid] = BoundPod(node, key, cards, tuple(slices), self._clock())

    def delete_pod(self, uid: str) -> None:
        """A pod is gone."""
        with self._lock:
            self._bound.pop(uid, None)
            self._guesses.pop(uid, None)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A fresh listing of pods: exactly these."""
        listed = list(pods)
        uids = {str(_dict(p.get("metadata")).get("uid") or "") for p in listed}
        with self._lock:
            for gone in set(self._bound) - uids:
                del self._bound[gone]
        for pod in listed:
            self.set_pod(pod)

    def guess(self, pod: protocol.PodRequest, node: str) -> None:
        """The extender ranked ``node`` first for ``pod``: count it there until it is bound."""
        if not pod.uid:
            return
        with self._lock:
            if pod.uid in self._bound:
                return
            self._guesses[pod.uid] = BoundPod(
                node, pod.key, pod.cards, pod.slices, self._clock()
            )  # fmt: skip
            if len(self._guesses) > 10_000:
                oldest = min(self._guesses, key=lambda uid: self._guesses[uid].since)
                del self._guesses[oldest]

    # --- reading ----------------------------------------------------------------------------

    def views(self, names: Iterable[str], exclude: str = "") -> dict[str, NodeView]:
        """Each named node's view; ``exclude`` is the uid of the pod being scheduled."""
        now = self._clock()
        wanted = set(names)
        pending: dict[str, list[BoundPod]] = {}
        with self._lock:
            states = {name: self._states.get(name) for name in wanted}
            for uid, bound in self._bound.items():
                if bound.node in wanted and uid != exclude and now - bound.since < self.pending_ttl:
                    pending.setdefault(bound.node, []).append(bound)
            for uid, guessed in list(self._guesses.items()):
                if now - guessed.since >= self.guess_ttl:
                    del self._guesses[uid]
                elif guessed.node in wanted and uid != exclude:
                    pending.setdefault(guessed.node, []).append(guessed)
        result = {}
        for name in wanted:
            state = states[name]
            if not isinstance(state, node_state.NodeState):
                problem = state or "no node state known (no annotation, or node not seen yet)"
                result[name] = NodeView(None, problem, (), ())
                continue
            if name not in pending:
                result[name] = NodeView(state, "", (), ())
                continue
            waiting = sorted(
                (p for p in pending[name] if p.key not in state.pods), key=lambda p: p.since
            )
            result[name] = NodeView(
                state,
                "",
                tuple(p.cards for p in waiting if p.cards),
                tuple(p.slices for p in waiting if p.slices),
            )
        return result

    def counts(self) -> dict[str, int]:
        """How much is cached (for /readyz and logs)."""
        with self._lock:
            good = sum(isinstance(s, node_state.NodeState) for s in self._states.values())
            return {
                "nodes": len(self._texts),
                "nodes_with_state": good,
                "bound_pods": len(self._bound),
                "guesses": len(self._guesses),
            }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _read(name: str, text: str | None) -> node_state.NodeState | str:
    """A node's parsed state, or the problem; a bad annotation is logged once per new text."""
    if text is None:
        return f"node {name} has no {node_state.ANNOTATION} annotation"
    try:
        return node_state.parse(text)
    except NodeStateError as exc:
        log.warning(
            "node %s: %s annotation ignored, its nodes get a neutral score: %s",
            name,
            node_state.ANNOTATION,
            exc,
        )
        return f"node {name}: {exc}"
