"""What the extender knows of the cluster: each node's state and the GCU pods of the cluster.

Fed by the API watches (:mod:`.watch`) and read by the HTTP handlers from other threads, so
every method takes the one lock and copies out what it returns.

A node's state comes from its Lease (:func:`node_state.from_lease`) and is *unknown* (scored
neutrally, never filtered) when it is missing, unreadable, of an unknown version, not held by
the node it is named after, older than ``max_age`` seconds or more than ``max_age`` seconds
ahead (its ``observed`` time, the Lease's ``renewTime``, which the plugin renews even when
nothing changes, against this process's clock). Where the admission grace and releases compare
a state's time with a binding or a pod's end seen here, they use the state's time on this
process's clock: the node's time plus the least lag of the node's last writes, so a node clock
ahead or behind does not move them. A pod bound to a node
but not yet listed in the node's state (the kubelet has not admitted it, or the plugin has not
written since) is *pending* there: its GCUs are counted against the node, in the order the pods
were bound, until the state lists it or was observed more than ``admission_grace`` seconds after
the extender saw the binding. The other way round, a pod that ends (deleted, or Succeeded or
Failed) while the node's state still lists it has *released* its cards and slices: a state
observed before the extender saw the pod end counts the cards the state names as the pod's as
free again (:meth:`node_state.NodeState.released`), for ``admission_grace`` seconds at most, by
which time the plugin has read the kubelet again. Kubernetes' own scheduler frees a pod's
resources the moment it ends; without this the extender would see the node fuller than it is
for up to one plugin read (5 s). Between a prioritize and the binding's watch event, the node this
extender ranked first for a pod holds a *guess* for ``guess_ttl`` seconds, so a burst of pods
does not all land on the same free pair. A guess is made only for a pod the extender's own watch
shows waiting to be scheduled, with the GCUs that watch shows (a caller cannot plant one for a
made-up pod or size); guesses only lower scores, never fail a filter.

Prioritize asks for every candidate node on every call (5,000 names at most), so the cache keeps
per node an *entry*: the node's view with nothing excluded, and per request asked so far a
column of the nodes' answers. Every change that can move a node's view drops that node's entry
and its answers (its Lease's state or renewal, a pod bound to it or leaving it, a guess placed
on it or expiring, a release past its grace); staleness is checked against each entry's
``observed`` time on every call, and a node holding the scheduled pod itself (bound or guessed)
is computed afresh without it. A call then costs a lookup per node, and the scoring work only
for the nodes that changed since the last call. Filter (shared slices) and prioritize share the
entries, each under its own key, so neither walks the cluster's bound pods.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from enflame_gcu import node_state
from enflame_gcu.errors import NodeStateError
from enflame_gcu.scheduler_extender import protocol

log = logging.getLogger(__name__)
MAX_PODS = 200_000
MAX_REQUESTS = 64  # distinct requests (verb and pod size) remembered before the memo restarts
MAX_RELEASED_PER_NODE = node_state.MAX_PODS  # ended pods remembered per node (oldest go first)
LAG_SAMPLES = 8  # writes per node whose lag estimates its clock's offset
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A GCU pod: where it is bound (or guessed, or "" while waiting), what it asks for, and
    since when the extender knows (monotonic, and wall clock for comparing with node states)."""

    node: str
    key: str
    cards: int
    slices: tuple[int, ...]
    since: float
    seen_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as a handler sees it: its state (or why there is none), the pods bound there
    that the state does not count yet, and the guessed ones."""

    state: node_state.NodeState | None
    problem: str
    pending_cards: tuple[int, ...]
    pending_slices: tuple[tuple[int, ...], ...]
    guessed_cards: tuple[int, ...] = ()
    guessed_slices: tuple[tuple[int, ...], ...] = ()


@dataclass(slots=True, eq=False)  # compared by identity
class _Entry:
    """A node's view with nothing excluded (its answers are in the cache's columns)."""

    view: NodeView
    observed: float = field(init=False)  # the state's, or -inf: unknown at any age

    def __post_init__(self) -> None:
        state = self.view.state
        self.observed = state.observed if state is not None else float("-inf")


class ClusterCache:
    """Node states and bound GCU pods; thread-safe."""

    def __init__(
        self,
        resource: str = "enflame.com/gcu",
        shared: str = "enflame.com/shared-gcu",
        *,
        max_age: float = 180.0,
        admission_grace: float = 10.0,
        guess_ttl: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.resource, self.shared = resource, shared
        self.max_age, self.admission_grace, self.guess_ttl = max_age, admission_grace, guess_ttl
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._texts: dict[str, tuple[Any, Any, Any]] = {}  # node -> what its Lease said
        self._states: dict[str, node_state.NodeState | str] = {}
        self._bound: dict[str, BoundPod] = {}
        self._waiting: dict[str, BoundPod] = {}
        self._guesses: dict[str, BoundPod] = {}
        # node -> uids bound there / guessed there, in the order they came (dicts as ordered
        # sets, so a node's pods come in the order views() finds them), and node -> memoized
        # entry (see the module).
        self._bound_on: dict[str, dict[str, None]] = {}
        self._guessed_on: dict[str, dict[str, None]] = {}
        self._entries: dict[str, _Entry] = {}
        # The memo by request, then node (request -> node -> answer), and each entry's
        # observed time: a call looks its 5,000 nodes up in two dicts, in C (map), instead
        # of visiting 5,000 entries' own dicts keyed by a tuple hashed afresh each time
        # (issue 49: the less a call computes, the less its tail). A node's answers live
        # exactly as long as its entry (_drop_entry).
        self._columns: dict[Hashable, dict[str, Any]] = {}
        self._observed: dict[str, float] = {}
        # node -> pod key -> when (wall clock) the extender saw that pod end there.
        self._released: dict[str, dict[str, float]] = {}
        # node -> lags (this clock minus the node's) of its last writes, and its state's
        # observed time on this clock: the admission grace and releases compare with that,
        # so a node whose clock is ahead or behind neither drops a just-bound pod at once nor
        # keeps it for ever.
        self._lags: dict[str, collections.deque[float]] = {}
        self._local: dict[str, float] = {}
        self._updated = 0.0  # monotonic: when a watch event last reached the cache

    # --- nodes ------------------------------------------------------------------------------

    def set_lease(self, name: str, lease: Mapping[str, Any]) -> None:
        """A node's state Lease was added or changed; read once per new content or renewal."""
        self._updated = self._clock()
        key = node_state.lease_key(lease)
        with self._lock:
            if name in self._texts and self._texts[name] == key:
                return
            self._texts[name] = key
        state = _read(name, lease)
        received = self._wall()
        with self._lock:
            if name not in self._texts:
                return
            self._states[name] = state
            self._drop_entry(name)
            if isinstance(state, node_state.NodeState):
                # The node's clock against this one: the least lag of its recent writes (a
                # write follows its read within the plugin's settle time, so the least lag is
                # the clock offset plus that).
                lags = self._lags.setdefault(name, collections.deque(maxlen=LAG_SAMPLES))
                lags.append(received - state.observed)
                self._local[name] = state.observed + min(lags)

    def delete_lease(self, name: str) -> None:
        """A node's state Lease is gone."""
        self._updated = self._clock()
        with self._lock:
            self._forget(name)

    def _drop_entry(self, name: str) -> None:
        """Forget a node's entry and every answer memoized from it (the lock is held)."""
        if self._entries.pop(name, None) is not None:
            del self._observed[name]
            for column in self._columns.values():
                column.pop(name, None)

    def _forget(self, name: str) -> None:
        """Drop everything known of a node's state (the lock is held)."""
        self._texts.pop(name, None)
        self._states.pop(name, None)
        self._drop_entry(name)
        self._released.pop(name, None)
        self._lags.pop(name, None)
        self._local.pop(name, None)

    def replace_leases(self, leases: Mapping[str, Mapping[str, Any]]) -> None:
        """A fresh listing: exactly these node-state Leases (node name -> Lease)."""
        with self._lock:
            for gone in set(self._texts) - set(leases):
                self._forget(gone)
        for name, found in leases.items():
            self.set_lease(name, found)

    # --- pods -------------------------------------------------------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed: kept when it asks for GCUs and is not done, as bound
        (with a node) or waiting (without)."""
        self._updated = self._clock()
        meta, spec, status = (_dict(pod.get(key)) for key in ("metadata", "spec", "status"))
        uid = str(meta.get("uid") or "")
        node = spec.get("nodeName")
        node = node if isinstance(node, str) else ""
        if not uid:
            return
        try:
            cards, slices = protocol.container_requests(pod, self.resource, self.shared)
        except protocol.ProtocolError as exc:
            log.debug("pod %s/%s ignored: %s", meta.get("namespace"), meta.get("name"), exc)
            cards, slices = 0, []
        done = status.get("phase") in ("Succeeded", "Failed")
        with self._lock:
            if done or not (cards or slices):
                self._drop_bound(uid)
                self._waiting.pop(uid, None)
                return
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            if not node:
                if uid not in self._bound and uid not in self._waiting:
                    if len(self._waiting) >= MAX_PODS:
                        log.warning("more than %d GCU pods waiting; %s not tracked", MAX_PODS, uid)
                        return
                    self._waiting[uid] = BoundPod("", key, cards, tuple(slices), self._clock())
                return
            self._waiting.pop(uid, None)
            self._drop_guess(uid)
            old = self._bound.get(uid)
            if old is not None and old.node == node:
                return
            if len(self._bound) >= MAX_PODS:
                log.warning("more than %d GCU pods bound; %s not tracked", MAX_PODS, uid)
                return
            if old is not None:  # kept in place in _bound, as a dict does on assignment
                _unindex(self._bound_on, old.node, uid)
                self._drop_entry(old.node)
            self._bound[uid] = BoundPod(
                node, key, cards, tuple(slices), self._clock(), self._wall()
            )  # fmt: skip
            self._bound_on.setdefault(node, {})[uid] = None
            self._drop_entry(node)
            released = self._released.get(node)
            if released:  # the same name again: what the state lists under it is not released
                released.pop(key, None)

    def delete_pod(self, uid: str) -> None:
        """A pod is gone."""
        self._updated = self._clock()
        with self._lock:
            self._drop_bound(uid)
            self._waiting.pop(uid, None)
            self._drop_guess(uid)

    def unwait(self, uid: str) -> None:
        """A pod left the waiting watch (it was bound, or deleted)."""
        self._updated = self._clock()
        with self._lock:
            self._waiting.pop(uid, None)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A fresh listing of bound pods: exactly these."""
        listed = list(pods)
        uids = {str(_dict(p.get("metadata")).get("uid") or "") for p in listed}
        with self._lock:
            for gone in set(self._bound) - uids:
                self._drop_bound(gone)
        for pod in listed:
            self.set_pod(pod)

    def replace_waiting(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A fresh listing of pods not bound yet: exactly these."""
        listed = list(pods)
        uids = {str(_dict(p.get("metadata")).get("uid") or "") for p in listed}
        with self._lock:
            for gone in set(self._waiting) - uids:
                del self._waiting[gone]
        for pod in listed:
            self.set_pod(pod)

    def guess(self, uid: str, node: str) -> None:
        """The extender ranked ``node`` first for the pod ``uid``: count it there until it is
        bound. Only for a pod this extender's watch shows waiting, with the GCUs it asks for
        there; anything else (a made-up or already bound uid) is ignored."""
        with self._lock:
            waiting = self._waiting.get(uid)
            if waiting is None:
                return
            old = self._guesses.get(uid)
            if old is not None:  # kept in place in _guesses, as a dict does on assignment
                _unindex(self._guessed_on, old.node, uid)
                self._drop_entry(old.node)
            self._guesses[uid] = BoundPod(
                node, waiting.key, waiting.cards, waiting.slices, self._clock()
            )  # fmt: skip
            self._guessed_on.setdefault(node, {})[uid] = None
            self._drop_entry(node)

    def _drop_bound(self, uid: str) -> None:
        """Forget a bound pod and its node's entry (the lock is held)."""
        old = self._bound.pop(uid, None)
        if old is not None:
            _unindex(self._bound_on, old.node, uid)
            self._drop_entry(old.node)
            released = self._released.setdefault(old.node, {})
            released.pop(old.key, None)
            released[old.key] = self._wall()
            if len(released) > MAX_RELEASED_PER_NODE:
                del released[next(iter(released))]

    def _after_releases(self, name: str, state: node_state.NodeState) -> node_state.NodeState:
        """``state`` with the cards and slices of the pods seen ending on ``name`` after it was
        observed given back (the lock is held); releases older than ``admission_grace`` or
        older than the state are forgotten."""
        released = self._released.get(name)
        if not released:
            return state
        oldest = self._wall() - self.admission_grace
        observed = self._local.get(name, state.observed)
        for key in [k for k, at in released.items() if at < oldest or at <= observed]:
            del released[key]
        if not released:
            del self._released[name]
            return state
        return state.released(released)

    def _expire_releases(self, wall: float) -> None:
        """Forget the releases older than ``admission_grace`` and drop the entries of their
        nodes (the lock is held): an entry built while a pod's release counted must not keep
        counting it once the plugin has had time to read the kubelet again. Each node's
        releases are in the order they came, so its first is its oldest."""
        oldest = wall - self.admission_grace
        due = [n for n, keys in self._released.items() if min(keys.values(), default=0) < oldest]
        for name in due:
            released = self._released[name]
            for key in [k for k, at in released.items() if at < oldest]:
                del released[key]
            if not released:
                del self._released[name]
            self._drop_entry(name)

    def _drop_guess(self, uid: str) -> None:
        """Forget a guess and its node's entry (the lock is held)."""
        old = self._guesses.pop(uid, None)
        if old is not None:
            _unindex(self._guessed_on, old.node, uid)
            self._drop_entry(old.node)

    def _expire_guesses(self, now: float) -> None:
        """Drop the guesses older than ``guess_ttl`` (the lock is held)."""
        for uid, guess in list(self._guesses.items()):
            if now - guess.since >= self.guess_ttl:
                self._drop_guess(uid)

    # --- reading ----------------------------------------------------------------------------

    def views(self, names: Iterable[str], exclude: str = "") -> dict[str, NodeView]:
        """Each named node's view; ``exclude`` is the uid of the pod being scheduled."""
        now, wall = self._clock(), self._wall()
        wanted = set(names)
        pending: dict[str, list[BoundPod]] = {}
        guessed: dict[str, list[BoundPod]] = {}
        with self._lock:
            states = {name: self._states.get(name) for name in wanted}
            for name in wanted & self._released.keys():
                state = states[name]
                if isinstance(state, node_state.NodeState):
                    states[name] = self._after_releases(name, state)
            # Through the node -> pods indexes: a call reads the candidates' pods only, never
            # every bound pod of the cluster.
            for name in wanted & self._bound_on.keys():
                found = [self._bound[u] for u in self._bound_on[name] if u != exclude]
                if found:
                    pending[name] = found
            self._expire_guesses(now)
            for name in wanted & self._guessed_on.keys():
                found = [self._guesses[u] for u in self._guessed_on[name] if u != exclude]
                if found:
                    guessed[name] = found
        oldest = wall - self.max_age
        result = {}
        for name in wanted:
            state = states[name]
            if not isinstance(state, node_state.NodeState):
                problem = state or "no node state known (no state Lease, or not seen yet)"
                result[name] = NodeView(None, problem, (), ())
            elif state.observed < oldest:
                problem = (
                    f"node {name}: state observed {wall - state.observed:.0f} s ago, more than "
                    f"{self.max_age:g} s (the device plugin stopped writing it): unknown"
                )
                result[name] = NodeView(None, problem, (), ())
            elif state.observed > wall + self.max_age:
                # A clock this far ahead would keep a dead plugin's state fresh for ever.
                problem = (
                    f"node {name}: state observed {state.observed - wall:.0f} s in the future "
                    "(is the node's clock set?): unknown"
                )
                result[name] = NodeView(None, problem, (), ())
            elif name not in pending and name not in guessed:
                result[name] = NodeView(state, "", (), ())  # most nodes: nothing in flight
            else:
                result[name] = self._in_flight(
                    state,
                    pending.get(name, ()),
                    guessed.get(name, ()),
                    self._local.get(name, state.observed),
                )
        return result

    def scores(
        self,
        names: Sequence[str],
        exclude: str,
        request: Hashable,
        score: Callable[[NodeView], int],
        unknown: int,
    ) -> dict[str, int]:
        """Each named node's score for one request, the same as ``score(view)`` for its view
        from :meth:`views` (``unknown`` for a node whose state is unknown, unreadable or too
        old), memoized per node until that node's view changes. ``request`` must identify
        everything ``score`` reads of the pod; ``exclude`` is the pod's uid."""
        return self.answers(names, exclude, ("prioritize", request), score, unknown)

    def answers(
        self,
        names: Sequence[str],
        exclude: str,
        request: Hashable,
        compute: Callable[[NodeView], T],
        unknown: T,
    ) -> dict[str, T]:
        """Each named node's ``compute(view)`` for its view from :meth:`views` (``unknown``
        for a node whose state is unknown, unreadable or too old), memoized per node under
        ``request`` until that node's view changes; filter and prioritize share the entries."""
        now, wall = self._clock(), self._wall()
        oldest, newest = wall - self.max_age, wall + self.max_age
        with self._lock:
            self._expire_guesses(now)
            self._expire_releases(wall)
            entries, observed = self._entries, self._observed
            column = self._columns.get(request)
            if column is None:
                if len(self._columns) >= MAX_REQUESTS:
                    self._columns.clear()
                column = self._columns[request] = {}
            # map() and min()/max() run their loops in C: a call costs a few C-level passes
            # over the 5,000 names, not 5,000 rounds of bytecode (the less a call computes,
            # the less often a preemption on a busy node stretches it: issue 49).
            times: list[float | None] = list(map(observed.get, names))
            if None in times:  # only nodes whose view changed since the last call
                for index in [i for i, at in enumerate(times) if at is None]:
                    entry = entries[names[index]] = _Entry(self._view(names[index], ""))
                    times[index] = observed[names[index]] = entry.observed
            values: list[Any] = list(map(column.get, names))
            todo = [i for i, value in enumerate(values) if value is None] if None in values else []
            work = [(i, entries[names[i]], True) for i in todo]
            holding: set[str] = set()  # nodes holding the pod itself: computed without it
            for table in (self._bound, self._guesses) if exclude else ():
                pod = table.get(exclude)
                if pod is not None:
                    holding.add(pod.node)
            if holding:
                work += [
                    (i, _Entry(self._view(name, exclude)), False)
                    for i, name in enumerate(names)
                    if name in holding
                ]
        known = cast("list[float]", times)  # all filled
        if known and (min(known) < oldest or max(known) > newest):  # some unknown: rare
            for index, at in enumerate(known):
                if not oldest <= at <= newest:
                    values[index] = unknown  # neither computed nor memoized
        computed = [
            (i, entry, keep, compute(entry.view))
            for i, entry, keep in work
            if oldest <= known[i] <= newest
        ]
        for i, _, _, value in computed:
            values[i] = value
        if any(keep for _, _, keep, _ in computed):
            with self._lock:  # kept only while the node's entry is still the one computed
                current = self._columns.get(request)
                for i, entry, keep, value in computed:
                    if keep and current is column and entries.get(names[i]) is entry:
                        column[names[i]] = value
        return dict(zip(names, values, strict=True))

    def _view(self, name: str, exclude: str) -> NodeView:
        """A node's view regardless of its state's age (the lock is held; the caller checks
        the age)."""
        state = self._states.get(name)
        if not isinstance(state, node_state.NodeState):
            return NodeView(None, "", (), ())
        state = self._after_releases(name, state)
        bound = [self._bound[u] for u in self._bound_on.get(name, ()) if u != exclude]
        guessed = [self._guesses[u] for u in self._guessed_on.get(name, ()) if u != exclude]
        if not bound and not guessed:
            return NodeView(state, "", (), ())
        return self._in_flight(state, bound, guessed, self._local.get(name, state.observed))

    def _in_flight(
        self,
        state: node_state.NodeState,
        bound: Iterable[BoundPod],
        guessed: Iterable[BoundPod],
        observed: float,
    ) -> NodeView:
        """A node's view with the bound pods its state does not count yet, and its guesses;
        ``observed`` is when the state was read, on this process's clock."""
        waiting = sorted(
            (
                pod
                for pod in bound
                if pod.key not in state.pods and observed < pod.seen_at + self.admission_grace
            ),
            key=lambda pod: pod.since,
        )
        guesses = sorted(guessed, key=lambda pod: pod.since)
        return NodeView(
            state,
            "",
            tuple(p.cards for p in waiting if p.cards),
            tuple(p.slices for p in waiting if p.slices),
            tuple(p.cards for p in guesses if p.cards),
            tuple(p.slices for p in guesses if p.slices),
        )

    def health(self) -> dict[str, Any]:
        """The node states by status, the oldest fresh one's age and the seconds since the
        watches last changed anything (for /metrics)."""
        wall = self._wall()
        oldest, newest = wall - self.max_age, wall + self.max_age
        states = {"fresh": 0, "stale": 0, "future": 0, "unreadable": 0}
        age = 0.0
        with self._lock:
            for state in self._states.values():
                if not isinstance(state, node_state.NodeState):
                    states["unreadable"] += 1
                elif state.observed < oldest:
                    states["stale"] += 1
                elif state.observed > newest:
                    states["future"] += 1
                else:
                    states["fresh"] += 1
                    age = max(age, wall - state.observed)
            return {
                "states": states,
                "oldest_age": age,
                "update_age": self._clock() - self._updated if self._updated else -1.0,
                "pods": {
                    "bound": len(self._bound),
                    "waiting": len(self._waiting),
                    "guessed": len(self._guesses),
                    "released": sum(len(keys) for keys in self._released.values()),
                },
            }

    def counts(self) -> dict[str, int]:
        """How much is cached (for /readyz and logs)."""
        with self._lock:
            good = sum(isinstance(s, node_state.NodeState) for s in self._states.values())
            return {
                "nodes": len(self._texts),
                "nodes_with_state": good,
                "bound_pods": len(self._bound),
                "waiting_pods": len(self._waiting),
                "guesses": len(self._guesses),
                # ended pods whose cards a node's state may still name (pruned as states come)
                "released_pods": sum(len(keys) for keys in self._released.values()),
            }


def _unindex(index: dict[str, dict[str, None]], node: str, uid: str) -> None:
    uids = index.get(node)
    if uids is not None:
        uids.pop(uid, None)
        if not uids:
            del index[node]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _read(name: str, lease: Mapping[str, Any]) -> node_state.NodeState | str:
    """A node's parsed state, or the problem; a bad Lease is logged once per new content."""
    try:
        return node_state.from_lease(name, lease)
    except NodeStateError as exc:
        log.warning("node %s: state Lease ignored, the node gets a neutral score: %s", name, exc)
        return f"node {name}: {exc}"
