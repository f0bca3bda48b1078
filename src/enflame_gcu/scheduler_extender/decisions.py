"""Filter and prioritize: read the call, ask :mod:`enflame_gcu.node_fit` per node, answer.

Nothing here raises to the HTTP layer. A call that cannot be read is one WARNING line and a
neutral answer: prioritize gives no scores (the scheduler adds nothing), filter passes every
node it can name (and, when it cannot name any, answers ``Error``, which an ``ignorable``
extender's scheduler skips). A node whose state is unknown, unreadable or too old scores
``node_fit.NEUTRAL`` (mid-scale) and is never filtered out. Guessed pods (see :mod:`.cache`)
lower a node's score, never filter it out: a node they would overfill scores 1.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from enflame_gcu import node_fit
from enflame_gcu.scheduler_extender import cache as extender_cache
from enflame_gcu.scheduler_extender import protocol

log = logging.getLogger(__name__)


class Decisions:
    """The extender's two verbs over one cache."""

    def __init__(self, cache: extender_cache.ClusterCache) -> None:
        self.cache = cache
        self._refusals: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def refusal_counts(self) -> dict[str, int]:
        """Nodes refused by filter calls so far, by reason (for /metrics)."""
        with self._lock:
            return {"slices": 0, "per_container_cap": 0, **self._refusals}

    def _read(self, body: bytes) -> protocol.ExtenderArgs:
        return protocol.parse_args(body, self.cache.resource, self.cache.shared)

    def _views(self, args: protocol.ExtenderArgs) -> dict[str, extender_cache.NodeView]:
        # Whole Node objects or names: either way the state is the node's Lease, from the
        # cache (a Node's annotations are not read: any node-local agent may write a Node).
        return self.cache.views(args.node_names, exclude=args.pod.uid)

    def filter(self, body: bytes) -> bytes:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``: shared-slice pods lose the nodes whose
        own slice policy would not give them their slices after the pods bound there (never
        for guesses); whole-card pods lose nothing. A node refused by its per-container cap
        is reported in ``FailedAndUnresolvableNodes`` (preemption cannot help there), the
        others in ``FailedNodes``."""
        try:
            args = self._read(body)
        except protocol.ProtocolError as exc:
            unfiltered = _unfiltered(body)
            if unfiltered is None:
                log.warning("filter: %s; no node to pass, answering an Error", exc)
                return json.dumps({"Error": f"enflame-scheduler-extender: {exc}"}).encode()
            log.warning("filter: %s; passing all %d node(s) unfiltered", exc, unfiltered[1])
            return json.dumps(unfiltered[0], separators=(",", ":")).encode()
        refused: dict[str, tuple[str, bool]] = {}
        if args.pod.slices:
            slices = args.pod.slices
            if args.nodes is None:  # names only: the cache's per-node memo
                found = self.cache.answers(
                    args.node_names, args.pod.uid, ("filter", slices),
                    lambda view: _refusal(view, slices), _PASS,
                )  # fmt: skip
            else:
                found = {name: _refusal(view, slices) for name, view in self._views(args).items()}
            # In C (compress, map): a call passes over its 5,000 answers without bytecode.
            refused = dict(itertools.compress(found.items(), map(_PASS.__ne__, found.values())))
        failed = {name: reason for name, (reason, final) in refused.items() if not final}
        unresolvable = {name: reason for name, (reason, final) in refused.items() if final}
        if refused:
            with self._lock:
                self._refusals["slices"] += len(failed)
                self._refusals["per_container_cap"] += len(unresolvable)
        passed = (
            list(itertools.filterfalse(refused.__contains__, args.node_names))
            if refused
            else list(args.node_names)
        )
        if refused:
            log.debug("filter %s: %d passed, dropped %s", args.pod.key, len(passed), refused)
        return protocol.filter_result(args, passed, failed, unresolvable)

    def prioritize(self, body: bytes) -> bytes:
        """``ExtenderArgs`` -> ``HostPriorityList`` (0..10 per node, see node_fit)."""
        try:
            args = self._read(body)
        except protocol.ProtocolError as exc:
            log.warning("prioritize: %s; answering no scores (neutral)", exc)
            return b"[]"
        scores = self.scores(args)
        if scores and args.pod.uid:
            best = max(scores.values())
            top = [name for name, score in scores.items() if score == best]
            # Only a node ranked first alone is a safe guess: among tied nodes the scheduler's
            # other plugins choose, and a wrong guess makes a node look fuller than it is.
            if best > node_fit.NEUTRAL and len(top) == 1:
                self.cache.guess(args.pod.uid, top[0])
        return protocol.priority_list(scores)

    def scores(self, args: protocol.ExtenderArgs) -> dict[str, int]:
        """Each candidate's score for the call's pod: from the cache's per-node memo in the
        names-only mode, from each node's view when whole Node objects were sent."""
        pod = args.pod
        if args.nodes is None:
            if not (pod.cards or pod.slices):
                return dict.fromkeys(args.node_names, node_fit.NEUTRAL)
            return self.cache.scores(
                args.node_names,
                pod.uid,
                (pod.cards, pod.slices),
                lambda view: _score(view, pod),
                node_fit.NEUTRAL,
            )
        return self.scores_from_views(args)

    def scores_from_views(self, args: protocol.ExtenderArgs) -> dict[str, int]:
        """Each candidate's score from its view, computed afresh (no memo)."""
        result = {name: _score(view, args.pod) for name, view in self._views(args).items()}
        return {name: result[name] for name in args.node_names if name in result}


_PASS = ("", False)


def _refusal(view: extender_cache.NodeView, slices: tuple[int, ...]) -> tuple[str, bool]:
    """Why a node cannot give a shared-slice pod its slices after its pending pods, and
    whether preemption could change that (("", False) when it fits, or when its state is
    unknown: never filtered then)."""
    if view.state is None:
        return _PASS
    fit = node_fit.shared_slices(view.state, view.pending_slices, slices)
    return _PASS if fit.fits else (f"enflame.com/shared-gcu: {fit.reason}", fit.unresolvable)


def _score(view: extender_cache.NodeView, pod: protocol.PodRequest) -> int:
    """One node's score: with its guessed pods counted after its pending ones, unless they
    would leave no room for this pod while the pending ones alone do (then 1: guesses come
    from the scheduler's calls and must not make a node that fits look full)."""
    state = view.state
    if state is None or not (pod.cards or pod.slices):
        return node_fit.NEUTRAL
    if pod.cards:
        fit = node_fit.whole_cards(
            state, view.pending_cards + view.guessed_cards, pod.cards
        )  # fmt: skip
        if fit.fits or not view.guessed_cards:
            return fit.score
        alone = node_fit.whole_cards(state, view.pending_cards, pod.cards)
    else:
        fit = node_fit.shared_slices(
            state, view.pending_slices + view.guessed_slices, pod.slices
        )  # fmt: skip
        if fit.fits or not view.guessed_slices:
            return fit.score
        alone = node_fit.shared_slices(state, view.pending_slices, pod.slices)
    return 1 if alone.fits else alone.score


def _unfiltered(body: bytes) -> tuple[dict[str, Any], int] | None:
    """Every candidate of an otherwise unreadable call, in the form it came (names or Node
    objects) with their count; None when there is none to name."""
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    names = protocol.get_key(document, "NodeNames")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return {"NodeNames": names, "FailedNodes": {}, "Error": ""}, len(names)
    nodes = protocol.get_key(document, "Nodes")
    items = protocol.get_key(nodes, "items") if isinstance(nodes, Mapping) else None
    if isinstance(items, list):
        return {"Nodes": {"items": items}, "FailedNodes": {}, "Error": ""}, len(items)
    return None
