"""``make chaos``: GCU pods churning on the real-cluster tier while its components are killed,
restarted or cut off; the invariants read from what the nodes actually do, all along.

Run by scripts/chaos.sh (the tier lock, the cached builds, a private network namespace, the host
ledger undone and checked after, as ``make demo-cluster``)::

    python -m tests.cluster.chaos --seed 1 --minutes 10 --min-faults 50 --report chaos.json

On the tier's session (tests/cluster/session.py: a real control plane, gcu-node-1 with the
vendor's 8-card board, gcu-node-2 with a flat 4-card one) the product is installed as the
guide says: the chart with the operator (``helm install``), its ``GcuResource`` (``helm
upgrade``) deploying the toolkit and the device plugin, the extender beside the cluster's
kube-scheduler. gcu-node-2 shares two of its cards as ``enflame.com/shared-gcu`` slices (a
config file the plugin reads on that node only). Then, for ``--minutes``:

- a **workload** (namespace ``chaos``) keeps about 80 % of the cards asked for: pods of 1, 2, 4
  or 8 whole cards or 1-2 slices, no node selector, random lifetimes;
- **faults** (:data:`KINDS`) start at seeded random times, overlapping, each a small function;
- a **checker** thread reads every ~2.5 s each node's running containers from containerd's
  bundles and runc's state (the OCI config's ``linux.devices``, the container's own ``/dev``
  through ``/proc/<pid>/root``) and the kubelet's PodResources, and records every violation
  with its evidence (:class:`Checker`);
- a **probe** thread records once a second whether each node's allocatable equals its healthy
  cards, the plugin pods are Ready and no pending pod that fits waits; recovery per fault kind
  is the time from a fault's end to the first probe where each holds again.

After the last fault: within 60 s every recovery condition holds and the ``GcuResource`` is
``Running``; no pod is left Pending or Failed without a reason a user can read; every workload
pod deleted is gone within 2 minutes. The JSON report (:func:`summarize`) says faults by kind,
pods created / ran / failed and why, violations, recovery p50/max; the exit status is 1 when a
violation was recorded or fewer than ``--min-faults`` faults ran. One ``random.Random(seed)``
makes the fault schedule and then the workload's choices.

The pure parts (schedule, checker, recovery, report) have unit tests in
tests/test_chaos_checks.py; tests/cluster/test_chaos.py runs a short bounded chaos on the tier
(marker ``chaos``, not part of ``make e2e-cluster``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

# -- the pure parts (no cluster needed: tests/test_chaos_checks.py) -------------------------

# Fault kinds in the default set; each is a function of ChaosRun (``fault_<kind>``).
KINDS = (
    "plugin-kill",
    "toolkit-kill",
    "extender-kill",
    "operator-leader-kill",
    "kubelet-restart",
    "containerd-restart",
    "apiserver-down",
    "etcd-restart",
    "scheduler-restart",
    "card-unplug",
    "node-network-cut",
    "plugin-rollout-restart",
    "plugin-version-change",
)
# Seconds a fault keeps its target down (or a card unplugged): (shortest, longest).
DURATIONS: dict[str, tuple[float, float]] = {
    "kubelet-restart": (1, 10),
    "containerd-restart": (1, 8),
    "apiserver-down": (5, 30),
    "etcd-restart": (0, 3),
    "scheduler-restart": (0, 5),
    "card-unplug": (10, 30),
    "node-network-cut": (30, 30),
}
ONCE = ("plugin-version-change",)  # at most once per run, in its middle
STUCK_TERMINATING = 120.0  # seconds a deleted pod may stay after the faults stop
RECOVERY_DEADLINE = 60.0  # seconds after the last fault for the recovery conditions
CONDITIONS = ("allocatable", "plugins_ready", "pending_scheduled")
# The workload's asks: (resource kind, count, weight).
ASKS = (
    ("gcu", 1, 4),
    ("gcu", 2, 4),
    ("gcu", 4, 2),
    ("gcu", 8, 1),
    ("shared", 1, 3),
    ("shared", 2, 2),
)
POD_NAME = re.compile(r"^c(\d+)-([gs])(\d+)$")


@dataclass(frozen=True)
class Fault:
    """One planned fault: when (seconds after the start), what, for how long, and ``pick``, a
    number that chooses its target among those there at the time."""

    number: int
    kind: str
    at: float
    duration: float
    pick: int


def schedule(rng: random.Random, seconds: float, kinds: Sequence[str], count: int) -> list[Fault]:
    """``count`` faults over ``seconds`` (the last quarter minute left quiet), kinds dealt from
    shuffled rounds of ``kinds`` so each kind comes up, times uniform (so they overlap); a kind
    of :data:`ONCE` once, at 35-50 % of the run."""
    if seconds <= 0 or count < 0:
        raise ValueError(f"a run needs time and a fault count (seconds {seconds}, count {count})")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    faults: list[tuple[float, str]] = []
    once = [k for k in kinds if k in ONCE]
    many = [k for k in kinds if k not in ONCE]
    for kind in once:
        faults.append((rng.uniform(0.35, 0.5) * seconds, kind))
    deck: list[str] = []
    end = max(seconds - 15.0, seconds * 0.5)
    while many and len(faults) < count:
        if not deck:
            deck = list(many)
            rng.shuffle(deck)
        faults.append((rng.uniform(min(5.0, end / 10), end), deck.pop()))
    faults.sort()
    planned = []
    for number, (at, kind) in enumerate(faults, 1):
        low, high = DURATIONS.get(kind, (0.0, 0.0))
        planned.append(
            Fault(
                number, kind, round(at, 2), round(rng.uniform(low, high), 2), rng.randrange(1 << 30)
            )
        )
    return planned


def ask_of(pod: str) -> tuple[str, int] | None:
    """The workload's ask in a pod name ``c<n>-g<cards>`` / ``c<n>-s<slices>``."""
    match = POD_NAME.match(pod)
    if not match:
        return None
    return ("gcu" if match.group(2) == "g" else "shared", int(match.group(3)))


@dataclass(frozen=True)
class Seen:
    """One running container as its node shows it."""

    node: str
    namespace: str
    pod: str
    container: str
    cid: str
    cards: frozenset[str]  # gcuN in the runtime config's linux.devices
    dev: frozenset[str] | None = None  # gcuN in the container's own /dev (None: not read)
    slices: tuple[str, ...] | None = None  # shared-gcu device IDs, PodResources (None: unknown)
    whole: tuple[str, ...] | None = None  # gcu device IDs, PodResources (None: unknown)

    @property
    def key(self) -> str:
        return f"{self.node}/{self.namespace}/{self.pod}/{self.container}"

    def evidence(self) -> dict[str, Any]:
        return {
            "pod": f"{self.namespace}/{self.pod}",
            "container": self.container,
            "id": self.cid[:12],
            "cards": sorted(self.cards),
            "dev": None if self.dev is None else sorted(self.dev),
            "podresources": {"gcu": self.whole, "shared-gcu": self.slices},
        }


@dataclass
class Violation:
    """An invariant broken, with what showed it."""

    rule: str
    at: float  # seconds after the run's start
    what: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Checker:
    """The invariants over successive observations of the nodes' running containers."""

    def __init__(self, slices_per_card: int) -> None:
        self.slices_per_card = slices_per_card
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, ...]] = set()
        self._first: dict[str, tuple[frozenset[str], float, str]] = {}
        self.observations = 0

    def _flag(self, key: tuple[str, ...], violation: Violation) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self.violations.append(violation)

    def observe(self, at: float, seen: Iterable[Seen]) -> list[Violation]:
        """Check one observation (every node's running containers); the new violations."""
        before = len(self.violations)
        self.observations += 1
        # Containers that hold cards through Kubernetes: the workload's, and any other the
        # kubelet lists with GCU devices (the validator). A privileged container (the toolkit)
        # sees every device of the node by design and holds none.
        containers = [s for s in seen if ask_of(s.pod) or s.whole or s.slices]
        by_card: dict[tuple[str, str], list[Seen]] = {}
        for item in containers:
            for card in item.cards:
                by_card.setdefault((item.node, card), []).append(item)
            self._check_own(at, item)
        for (node, card), holders in sorted(by_card.items()):
            if len(holders) < 2:
                continue
            shared = [h for h in holders if (ask_of(h.pod) or ("", 0))[0] == "shared"]
            if len(shared) < len(holders):
                self._flag(
                    ("double", node, card, *sorted(h.key for h in holders)),
                    Violation(
                        "card-in-two-containers",
                        at,
                        f"{node} {card} is in {len(holders)} running containers at once, "
                        f"{len(holders) - len(shared)} of them holding it whole",
                        {"node": node, "card": card, "holders": [h.evidence() for h in holders]},
                    ),
                )
            elif len(shared) > self.slices_per_card:
                self._flag(
                    ("overshared", node, card),
                    Violation(
                        "card-beyond-its-share",
                        at,
                        f"{node} {card} is in {len(shared)} containers, more than its "
                        f"{self.slices_per_card} slices",
                        {"node": node, "card": card, "holders": [h.evidence() for h in holders]},
                    ),
                )
        for resource in ("whole", "slices"):
            by_id: dict[tuple[str, str], list[Seen]] = {}
            for item in containers:
                for device in getattr(item, resource) or ():
                    by_id.setdefault((item.node, device), []).append(item)
            for (node, device), holders in sorted(by_id.items()):
                if len(holders) > 1:
                    self._flag(
                        ("podresources", node, device, *sorted(h.key for h in holders)),
                        Violation(
                            "device-id-in-two-containers",
                            at,
                            f"the kubelet on {node} lists {device} for {len(holders)} containers",
                            {"node": node, "device": device,
                             "holders": [h.evidence() for h in holders]},
                        ),
                    )  # fmt: skip
        return self.violations[before:]

    def _check_own(self, at: float, item: Seen) -> None:
        ask = ask_of(item.pod)
        if ask is not None:
            kind, count = ask
            wrong = len(item.cards) != count if kind == "gcu" else not 1 <= len(item.cards) <= count
            if wrong:
                self._flag(
                    ("ask", item.key, ",".join(sorted(item.cards))),
                    Violation(
                        "running-without-its-ask",
                        at,
                        f"{item.namespace}/{item.pod} asked for {count} {kind} and runs with "
                        f"{len(item.cards)} cards",
                        item.evidence(),
                    ),
                )
        if item.dev is not None and ask is not None and item.dev != item.cards:
            self._flag(
                ("dev", item.key, ",".join(sorted(item.dev))),
                Violation(
                    "dev-differs-from-runtime-config",
                    at,
                    f"{item.namespace}/{item.pod}'s /dev shows {sorted(item.dev)}, its runtime "
                    f"config {sorted(item.cards)}",
                    item.evidence(),
                ),
            )
        first = self._first.setdefault(item.key, (item.cards, at, item.cid))
        if first[0] != item.cards:
            self._flag(
                ("changed", item.key, ",".join(sorted(item.cards))),
                Violation(
                    "cards-changed-while-running",
                    at,
                    f"{item.namespace}/{item.pod} ran with {sorted(first[0])} from "
                    f"{first[1]:.0f} s and now with {sorted(item.cards)}",
                    {**item.evidence(), "first": sorted(first[0]), "first_at": first[1],
                     "first_id": first[2][:12]},
                ),
            )  # fmt: skip

    def pods(self, at: float, pods: Iterable[Mapping[str, Any]], quiet_since: float | None,
             now_wall: float) -> list[Violation]:  # fmt: skip
        """The pod-level invariants at ``at`` (run seconds; ``now_wall`` the wall clock the
        API's timestamps compare with; ``quiet_since`` the wall time the last fault ended, None
        while faults still run): none stuck Terminating, none Pending or Failed without a
        reason a user can read."""
        before = len(self.violations)
        for pod in pods:
            meta = pod.get("metadata") or {}
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            status = pod.get("status") or {}
            deleted = meta.get("deletionTimestamp")
            if deleted and quiet_since is not None:
                since = max(parse_time(deleted), quiet_since)
                if now_wall - since > STUCK_TERMINATING:
                    self._flag(
                        ("terminating", name),
                        Violation(
                            "stuck-terminating",
                            at,
                            f"{name} is still Terminating {now_wall - since:.0f} s after its "
                            "deletion (faults over)",
                            {"pod": name, "deletionTimestamp": deleted,
                             "phase": status.get("phase"),
                             "node": (pod.get("spec") or {}).get("nodeName")},
                        ),
                    )  # fmt: skip
                continue
            reason = readable_reason(pod)
            if status.get("phase") in ("Pending", "Failed") and reason is None:
                self._flag(
                    ("unreadable", name, str(status.get("phase"))),
                    Violation(
                        "no-readable-reason",
                        at,
                        f"{name} is {status.get('phase')} with no reason a user can read",
                        {"pod": name, "status": status},
                    ),
                )
        return self.violations[before:]


def parse_time(stamp: str) -> float:
    """An API timestamp (``2026-11-28T08:00:00Z``) as epoch seconds."""
    import calendar

    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def readable_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is not Running, as a user reads it (None when nothing says why).

    Pending and unscheduled: the PodScheduled condition's message (``0/2 nodes are available:
    2 Insufficient enflame.com/gcu``); Pending on a node: a waiting container's reason, or
    nothing yet for a pod bound in the last 30 s; Failed: status reason and message
    (``UnexpectedAdmissionError``)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Failed":
        if status.get("reason") or status.get("message"):
            return f"{status.get('reason', '')}: {status.get('message', '')}"
        for state in status.get("containerStatuses") or []:
            terminated = (state.get("state") or {}).get("terminated") or {}
            if terminated.get("reason"):
                return str(terminated["reason"])
        return None
    if phase != "Pending":
        return str(phase)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message") or condition.get("reason")
            return str(message) if message else None
    for state in status.get("containerStatuses") or []:
        waiting = (state.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    if (pod.get("spec") or {}).get("nodeName"):
        return "bound, starting"
    return "not yet scheduled" if not status.get("conditions") else None


@dataclass(frozen=True)
class Probe:
    """One probe of the recovery conditions (``at``: run seconds)."""

    at: float
    allocatable: bool
    plugins_ready: bool
    pending_scheduled: bool


@dataclass
class FaultRecord:
    """A fault as it ran (run seconds)."""

    number: int
    kind: str
    started: float
    ended: float = -1.0
    target: str = ""
    error: str = ""  # why it could not be injected (then it does not count)


RECOVERY_WINDOW = 20.0  # seconds after a fault's end in which its dip must show


def _stats(values: Sequence[float | None]) -> dict[str, Any]:
    done = sorted(v for v in values if v is not None)
    return {
        "n": len(values),
        "p50": round(statistics.median(done), 2) if done else None,
        "p99": round(done[min(len(done) - 1, int(0.99 * len(done)))], 2) if done else None,
        "max": done[-1] if done else None,
        "never": len(values) - len(done),
    }


def recovered_after(ordered: Sequence[Probe], record: FaultRecord, condition: str) -> float | None:
    """Seconds from the fault's end until ``condition`` held again after the dip it caused:
    the first probe where it failed (the state at the fault's start, or a probe up to
    :data:`RECOVERY_WINDOW` after its end), then the first probe after that where it held.
    0 when it never failed; None when it never held again. The same from every probe or from
    only the probes where a condition changed (:func:`changes`)."""
    before = [p for p in ordered if p.at <= record.started]
    failed: float | None = None
    if before and not getattr(before[-1], condition):
        failed = record.started
    else:
        failed = next(
            (p.at for p in ordered
             if record.started <= p.at <= record.ended + RECOVERY_WINDOW
             and not getattr(p, condition)),
            None,
        )  # fmt: skip
    if failed is None:
        return 0.0
    held = next((p.at for p in ordered if p.at > failed and getattr(p, condition)), None)
    return None if held is None else round(max(0.0, held - record.ended), 2)


Values = dict[str, dict[str, tuple[list[float | None], list[float | None]]]]


def recovery_values(records: Sequence[FaultRecord], probes: Sequence[Probe]) -> Values:
    """``{kind: {condition: (every value, the isolated ones)}}``: :func:`recovered_after` for
    each injected fault; isolated when no other fault ran between its start and its recovery."""
    ordered = sorted(probes, key=lambda p: p.at)
    injected = [r for r in records if not r.error and r.ended >= 0]
    found: Values = {}
    for record in injected:
        per = found.setdefault(record.kind, {c: ([], []) for c in CONDITIONS})
        for condition in CONDITIONS:
            value = recovered_after(ordered, record, condition)
            until = record.ended + (value if value is not None else 10**9)
            alone = not any(
                other is not record and other.started < until and other.ended > record.started
                for other in injected
            )
            per[condition][0].append(value)
            if alone:
                per[condition][1].append(value)
    return found


def summarize_recovery(found: Values) -> dict[str, dict[str, Any]]:
    """p50, p99, max and how many never recovered, over all and over the isolated faults."""
    return {
        kind: {c: {**_stats(every), "isolated": _stats(alone)} for c, (every, alone) in per.items()}
        for kind, per in sorted(found.items())
    }


def recovery(records: Sequence[FaultRecord], probes: Sequence[Probe]) -> dict[str, dict[str, Any]]:
    """Per fault kind and condition: :func:`recovered_after` for each injected fault; p50,
    p99, max and how many never recovered, over all of them and over the ``isolated`` ones
    (no other fault ran between the fault's start and its recovery)."""
    return summarize_recovery(recovery_values(records, probes))


def probes_of(changed: Sequence[Sequence[Any]]) -> list[Probe]:
    """The probes a report's ``probe_changes`` keeps (enough for :func:`recovery`)."""
    return [Probe(float(c[0]), bool(c[1]), bool(c[2]), bool(c[3])) for c in changed]


def changes(probes: Sequence[Probe]) -> list[list[Any]]:
    """The probes where a condition changed: ``[at, allocatable, plugins_ready,
    pending_scheduled]`` (the first probe, then each change)."""
    found: list[list[Any]] = []
    last: tuple[bool, ...] | None = None
    for probe in sorted(probes, key=lambda p: p.at):
        state = (probe.allocatable, probe.plugins_ready, probe.pending_scheduled)
        if state != last:
            found.append([probe.at, *state])
            last = state
    return found


def summarize(
    *,
    seed: int,
    minutes: float,
    min_faults: int,
    records: Sequence[FaultRecord],
    probes: Sequence[Probe],
    violations: Sequence[Violation],
    pods: Mapping[str, Any],
    observations: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's report (JSON-ready) and its verdict."""
    injected = [r for r in records if not r.error]
    by_kind: dict[str, int] = {}
    for record in injected:
        by_kind[record.kind] = by_kind.get(record.kind, 0) + 1
    errors: dict[str, list[str]] = {}
    for record in records:
        if record.error:
            errors.setdefault(record.kind, []).append(record.error)
    problems = []
    if violations:
        problems.append(f"{len(violations)} invariant violations")
    if len(injected) < min_faults:
        problems.append(f"{len(injected)} faults ran, fewer than --min-faults {min_faults}")
    return {
        "seed": seed,
        "minutes": minutes,
        "faults": {"total": len(injected), "by_kind": dict(sorted(by_kind.items())),
                   "not_injected": errors},
        "pods": dict(pods),
        "checks": observations,
        "violations": [asdict(v) for v in violations],
        "recovery_s": recovery(records, probes),
        "probe_changes": changes(probes),
        "fault_log": [asdict(r) for r in records],
        **dict(extra or {}),
        "ok": not problems,
        "problems": problems,
    }  # fmt: skip


# -- on the tier ------------------------------------------------------------------------------


class ChaosFailed(Exception):
    """The run could not be set up or carried out; the message says which step."""


def _api_errors() -> tuple[type[Exception], ...]:
    from tests.cluster.controlplane import ControlPlaneError
    from tests.kubelet.harness import E2EError

    return (ControlPlaneError, E2EError)


def fail(message: str) -> NoReturn:
    raise ChaosFailed(message)


NAMESPACE = "chaos"
SLICES_PER_CARD = 4
SHARED_NODE, SHARED_CARDS = "gcu-node-2", ("gcu2", "gcu3")
PLUGIN_CONFIG = "/etc/enflame-gcu/chaos-plugin.yaml"  # read by the plugin at /host/...
SHARED = "enflame.com/shared-gcu"
TARGET_LOAD = 0.8
CHECK_EVERY = 2.5


def plugin_config(node: str) -> str:
    """The plugin's config file on ``node``: slices of two cards on the shared node."""
    if node != SHARED_NODE:
        return "version: v1\nflags:\n  resources: [gcu]\n"
    return (
        "version: v1\nflags:\n  resources: [gcu, shared-gcu]\nsharing:\n"
        f"  cards: [{', '.join(SHARED_CARDS)}]\n  slicesPerCard: {SLICES_PER_CARD}\n"
    )


class ChaosRun:
    """One seeded run on a deployed cluster."""

    def __init__(  # noqa: PLR0917 (one call site, each argument named there)
        self, cluster: Any, bench: Any, seed: int, minutes: float, faults: int,
        kinds: Sequence[str], say: Callable[[str], None],
    ) -> None:  # fmt: skip
        from tests.cluster.test_operator import NODES

        self.cluster = cluster
        self.bench = bench
        self.seed = seed
        self.seconds = minutes * 60
        self.minutes = minutes
        self.say = say
        self.rng = random.Random(seed)  # noqa: S311 (a reproducible schedule, not a secret)
        self.plan = schedule(self.rng, self.seconds, kinds, faults)
        self.nodes = {n.name: n for n in cluster.nodes if n.name in NODES}
        self.cards = {name: NODES[name] for name in self.nodes}
        self.checker = Checker(SLICES_PER_CARD)
        self.records: list[FaultRecord] = []
        self.probes: list[Probe] = []
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.creating = threading.Event()
        self.lock = threading.Lock()
        self.unplugged: set[tuple[str, int]] = set()
        self.busy: set[str] = set()  # targets a running fault holds (one fault per target)
        self.latest: list[Seen] = []
        self.counter = 0
        self.lifetimes: dict[str, float] = {}
        self.pod_stats: dict[str, Any] = {
            "created": 0, "create_errors": 0, "ran": 0, "failed": {}, "deleted": 0,
            "pending_at_end": {}, "by_ask": {},
        }  # fmt: skip
        self.ran: set[str] = set()
        self.failed_seen: set[str] = set()
        self.harness_errors: list[str] = []

    # -- clock and API --------------------------------------------------------------------

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def api(self, method: str, path: str, body: Any = None, timeout: float = 5) -> Any:
        return self.cluster.plane.request(method, path, body, timeout=timeout)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        items: list[dict[str, Any]] = self.api(
            "GET", f"/api/v1/namespaces/{namespace}/pods{query}"
        )["items"]
        return items

    # -- node truth -------------------------------------------------------------------------

    def running(self, node: Any) -> list[dict[str, Any]]:
        """The node's running containers from containerd's bundles and runc's state: id, pid,
        annotations (pod, namespace, container), gcuN in linux.devices and in its /dev."""
        bundles = os.path.join(node.ctd_dir, "state", "io.containerd.runtime.v2.task", "k8s.io")
        states = os.path.join(node.ctd_dir, "runc", "k8s.io")
        found = []
        for cid in sorted(os.listdir(bundles)) if os.path.isdir(bundles) else []:
            try:
                with open(os.path.join(bundles, cid, "config.json"), encoding="utf-8") as handle:
                    spec = json.load(handle)
                with open(os.path.join(states, cid, "state.json"), encoding="utf-8") as handle:
                    state = json.load(handle)
            except (OSError, ValueError):
                continue  # being created or removed
            notes = spec.get("annotations") or {}
            if notes.get("io.kubernetes.cri.container-type") != "container":
                continue
            pid = int(state.get("init_process_pid") or 0)
            try:
                with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        continue
            except (OSError, IndexError):
                continue  # exited
            devices = (spec.get("linux") or {}).get("devices") or []
            cards = frozenset(
                os.path.basename(d["path"])
                for d in devices
                if re.fullmatch(r"/dev/gcu\d+", str(d.get("path", "")))
            )
            try:
                dev: frozenset[str] | None = frozenset(
                    e for e in os.listdir(f"/proc/{pid}/root/dev") if re.fullmatch(r"gcu\d+", e)
                )
            except OSError:
                dev = None
            found.append(
                {
                    "cid": cid,
                    "pid": pid,
                    "namespace": notes.get("io.kubernetes.cri.sandbox-namespace", ""),
                    "pod": notes.get("io.kubernetes.cri.sandbox-name", ""),
                    "container": notes.get("io.kubernetes.cri.container-name", ""),
                    "cards": cards,
                    "dev": dev,
                }
            )
        return found

    def podresources(self, node: Any) -> dict[tuple[str, str, str], dict[str, tuple[str, ...]]]:
        """``{(namespace, pod, container): {resource: device IDs}}`` from the node's kubelet
        (empty when the kubelet does not answer)."""
        from enflame_gcu.errors import KubeletApiError
        from enflame_gcu.kubelet_api import podresources

        socket = os.path.join(node.private("/var/lib/kubelet"), "pod-resources", "kubelet.sock")
        try:
            listing = podresources.list_resources(socket, 3, allocatable=False)
        except (KubeletApiError, OSError):
            return {}
        found: dict[tuple[str, str, str], dict[str, tuple[str, ...]]] = {}
        for holding in listing.holdings:
            key = (holding.namespace, holding.pod, holding.container)
            found.setdefault(key, {})[holding.resource] = tuple(holding.device_ids)
        return found

    def observe(self) -> list[Seen]:
        seen = []
        for name, node in self.nodes.items():
            listed = self.podresources(node)
            for item in self.running(node):
                held = listed.get((item["namespace"], item["pod"], item["container"]))
                seen.append(
                    Seen(
                        node=name,
                        namespace=item["namespace"],
                        pod=item["pod"],
                        container=item["container"],
                        cid=item["cid"],
                        cards=item["cards"],
                        dev=item["dev"],
                        whole=None if held is None else held.get("enflame.com/gcu", ()),
                        slices=None if held is None else held.get(SHARED, ()),
                    )
                )
        return seen

    def check_loop(self) -> None:
        while not self.stop.is_set():
            try:
                seen = self.observe()
                with self.lock:
                    self.latest = seen
                for violation in self.checker.observe(self.now(), seen):
                    self.say(f"VIOLATION {violation.rule}: {violation.what}")
            except Exception as exc:
                self.harness_errors.append(f"checker at {self.now()} s: {exc!r}")
            self.stop.wait(CHECK_EVERY)

    # -- recovery probes --------------------------------------------------------------------

    def healthy(self) -> dict[str, dict[str, int]]:
        """Each node's expected allocatable, from the cards plugged in now."""
        with self.lock:
            out = set(self.unplugged)
        expected = {}
        for name, count in self.cards.items():
            cards = [f"gcu{i}" for i in range(count) if (name, i) not in out]
            shared = [c for c in cards if name == SHARED_NODE and c in SHARED_CARDS]
            expected[name] = {
                "enflame.com/gcu": len(cards) - len(shared),
                SHARED: len(shared) * SLICES_PER_CARD,
            }
        return expected

    def conditions(self) -> tuple[bool, bool, bool, dict[str, Any]]:
        """(allocatable right, plugins Ready, no pending pod that fits), with the evidence."""
        from tests.cluster.cluster import PLUGIN_SELECTOR, pod_ready

        expected = self.healthy()
        nodes = {n: self.api("GET", f"/api/v1/nodes/{n}") for n in self.nodes}
        allocatable = {
            n: {
                r: int((node.get("status") or {}).get("allocatable", {}).get(r, 0))
                for r in expected[n]
            }
            for n, node in nodes.items()
        }
        alloc_ok = allocatable == expected
        plugins = [p for p in self.pods("kube-system", PLUGIN_SELECTOR)
                   if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        ready_nodes = {p["spec"].get("nodeName") for p in plugins if pod_ready(p)}
        plugins_ok = ready_nodes == set(self.nodes) and len(plugins) == len(self.nodes)
        workload = self.pods(NAMESPACE)
        free = {n: dict(a) for n, a in allocatable.items()}
        for pod in workload:
            node = pod["spec"].get("nodeName")
            ask = ask_of(pod["metadata"]["name"])
            if node in free and ask and pod["status"].get("phase") in ("Pending", "Running"):
                resource = "enflame.com/gcu" if ask[0] == "gcu" else SHARED
                free[node][resource] -= ask[1]
        now_wall = time.time()
        waiting = []
        for pod in workload:
            ask = ask_of(pod["metadata"]["name"])
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp") or not ask:
                continue
            if now_wall - parse_time(pod["metadata"]["creationTimestamp"]) < 10:
                continue
            resource = "enflame.com/gcu" if ask[0] == "gcu" else SHARED
            if any(f[resource] >= ask[1] for f in free.values()):
                waiting.append(pod["metadata"]["name"])
        evidence = {"allocatable": allocatable, "expected": expected,
                    "plugins_ready_on": sorted(str(n) for n in ready_nodes),
                    "pending_that_fit": waiting, "free": free}  # fmt: skip
        return alloc_ok, plugins_ok, not waiting, evidence

    def probe_loop(self) -> None:
        while not self.stop.is_set():
            at = self.now()
            try:
                alloc, plugins, pending, _ = self.conditions()
            except Exception:
                alloc = plugins = pending = False
            self.probes.append(Probe(at, alloc, plugins, pending))
            self.stop.wait(1.0)

    # -- the workload -----------------------------------------------------------------------

    def pod_manifest(self, name: str, kind: str, count: int) -> dict[str, Any]:
        from tests.kubelet import harness

        resource = "enflame.com/gcu" if kind == "gcu" else SHARED
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "chaos"}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "gcu",
                        "image": harness.IMAGE,
                        "command": ["sleep", "100000"],
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }

    def capacity(self) -> float:
        """Cards the workload may fill: whole cards plus shared cards (in cards)."""
        return float(sum(self.cards.values()))

    def load_of(self, pods: Iterable[Mapping[str, Any]]) -> float:
        load = 0.0
        for pod in pods:
            ask = ask_of(pod["metadata"]["name"])
            if ask is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") in ("Failed", "Succeeded"):
                continue
            load += ask[1] if ask[0] == "gcu" else ask[1] / SLICES_PER_CARD
        return load

    def workload_tick(self) -> None:
        pods = self.pods(NAMESPACE)
        now_wall = time.time()
        for pod in pods:
            name = pod["metadata"]["name"]
            status = pod.get("status") or {}
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if status.get("phase") == "Running" and name not in self.ran:
                self.ran.add(name)
                self.pod_stats["ran"] += 1
            expired = self.lifetimes.get(name, 0) and now_wall > self.lifetimes[name]
            if status.get("phase") == "Failed" and name not in self.failed_seen:
                self.failed_seen.add(name)
                why = status.get("reason") or readable_reason(pod) or "no reason"
                failed = self.pod_stats["failed"]
                failed[why] = failed.get(why, 0) + 1
                self.say(f"pod {name} Failed: {why}: {str(status.get('message', ''))[:200]}")
                expired = True
            if expired:
                with contextlib.suppress(Exception):
                    self.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
                    self.pod_stats["deleted"] += 1
                    self.lifetimes.pop(name, None)
        if not self.creating.is_set():
            return
        load = self.load_of(pods)
        made = 0
        while load < TARGET_LOAD * self.capacity() and made < 2:
            kind, count, _ = self.rng.choices(ASKS, weights=[a[2] for a in ASKS])[0]
            self.counter += 1
            name = f"c{self.counter}-{kind[0]}{count}"
            lifetime = self.rng.uniform(20, 90)
            try:
                self.api(
                    "POST",
                    f"/api/v1/namespaces/{NAMESPACE}/pods",
                    self.pod_manifest(name, kind, count),
                )
            except Exception:
                self.pod_stats["create_errors"] += 1
                return
            self.lifetimes[name] = time.time() + lifetime
            self.pod_stats["created"] += 1
            by_ask = self.pod_stats["by_ask"]
            by_ask[f"{kind}-{count}"] = by_ask.get(f"{kind}-{count}", 0) + 1
            load += count if kind == "gcu" else count / SLICES_PER_CARD
            made += 1

    def workload_loop(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):  # API down: the next tick tries again
                self.workload_tick()
            self.stop.wait(1.0)

    # -- faults -----------------------------------------------------------------------------

    def pick(self, fault: Fault, options: Sequence[Any]) -> Any:
        if not options:
            raise ChaosFailed("no target")
        return sorted(options, key=str)[fault.pick % len(options)]

    def sigkill(self, fault: Fault, pod_prefix: str, namespace: str = "kube-system",
                nodes: Sequence[str] | None = None) -> str:  # fmt: skip
        """SIGKILL the main process of a running container whose pod name starts with
        ``pod_prefix``, found in the nodes' runtime state (not through the API); when none
        runs (the kubelet's back-off after an earlier kill), wait up to a minute for one."""
        deadline = time.monotonic() + 60
        while True:
            targets = [
                (name, item["pod"], item["pid"])
                for name, node in self.nodes.items()
                if nodes is None or name in nodes
                for item in self.running(node)
                if item["namespace"] == namespace and item["pod"].startswith(pod_prefix)
            ]
            if targets or time.monotonic() > deadline:
                break
            time.sleep(2)
        node, pod, pid = self.pick(fault, targets)
        os.kill(pid, signal.SIGKILL)
        return f"{node} {namespace}/{pod} pid {pid}"

    def fault_plugin_kill(self, fault: Fault) -> str:
        return self.sigkill(fault, "enflame-k8s-device-plugin-")

    def fault_toolkit_kill(self, fault: Fault) -> str:
        return self.sigkill(fault, "enflame-container-toolkit-")

    def fault_extender_kill(self, fault: Fault) -> str:
        return self.sigkill(fault, f"{self.extender_prefix}")

    @staticmethod
    def retried(action: Callable[[], Any], seconds: float = 60) -> Any:
        """``action()``, tried again every 2 s for ``seconds`` while the API does not answer
        (another fault may have it down: the fault then starts once it is back)."""
        deadline = time.monotonic() + seconds
        errors: tuple[type[Exception], ...] = (OSError, *_api_errors())
        while True:
            try:
                return action()
            except errors as exc:
                if time.monotonic() > deadline:
                    raise ChaosFailed(f"the API did not answer for {seconds:.0f} s: {exc}") from exc
                time.sleep(2)

    def fault_operator_leader_kill(self, fault: Fault) -> str:
        leader = self.retried(self.bench.operator.leader)
        if not leader:
            raise ChaosFailed("no operator leader in the Lease")
        return self.sigkill(fault, leader)

    @contextlib.contextmanager
    def claim(self, fault: Fault, targets: Sequence[str]) -> Iterator[str]:
        """One of ``targets`` no other running fault holds (two overlapping restarts of one
        daemon would start it twice), held while the fault runs; when every one is held, the
        fault waits for one (ChaosFailed after a minute)."""
        deadline = time.monotonic() + 60
        while True:  # all held: wait (up to a minute) for one to be free
            with self.lock:
                free = [t for t in targets if t not in self.busy]
                if free or time.monotonic() > deadline:
                    target = str(self.pick(fault, free))
                    self.busy.add(target)
                    break
            time.sleep(1)
        try:
            yield target
        finally:
            with self.lock:
                self.busy.discard(target)

    def fault_kubelet_restart(self, fault: Fault) -> str:
        with self.claim(fault, [f"kubelet {n}" for n in self.nodes]) as target:
            self.nodes[target.split()[1]].restart_kubelet(fault.duration)
        return target

    def fault_containerd_restart(self, fault: Fault) -> str:
        with self.claim(fault, [f"containerd {n}" for n in self.nodes]) as target:
            self.nodes[target.split()[1]].restart_containerd(fault.duration)
        return target

    def restart_piece(self, fault: Fault, name: str) -> str:
        with self.claim(fault, [name]):
            down = self.cluster.plane.restart(name, fault.duration)
        return f"{name} down {down:.1f} s"

    def fault_apiserver_down(self, fault: Fault) -> str:
        return self.restart_piece(fault, "kube-apiserver")

    def fault_etcd_restart(self, fault: Fault) -> str:
        return self.restart_piece(fault, "etcd")

    def fault_scheduler_restart(self, fault: Fault) -> str:
        return self.restart_piece(fault, "kube-scheduler")

    def fault_card_unplug(self, fault: Fault) -> str:
        with self.lock:
            held = sorted(
                {(s.node, c) for s in self.latest if ask_of(s.pod) for c in s.cards}
                - {(n, f"gcu{m}") for n, m in self.unplugged}
            )
        node, card = self.pick(fault, held)
        minor = int(card[3:])
        with self.lock:
            self.unplugged.add((node, minor))
        self.nodes[node].unplug(minor)
        try:
            time.sleep(fault.duration)
        finally:
            self.nodes[node].replug(minor)
            with self.lock:
                self.unplugged.discard((node, minor))
        return f"{node} {card} for {fault.duration:.0f} s"

    def fault_node_network_cut(self, fault: Fault) -> str:
        """Drop the TCP packets a node's host-network processes (its kubelet, containerd and
        host-network pods: their sockets are in the node's daemon cgroup) send to the API
        server, in the tier's private network namespace only, for the fault's duration."""
        import subprocess

        if os.environ.get("ENFLAME_E2E_NETNS") != "private":
            raise ChaosFailed("refusing iptables outside the tier's private network namespace")
        with self.claim(fault, [f"network {n}" for n in self.nodes]) as target:
            node = self.nodes[target.split()[1]]
            port = str(self.cluster.plane.port)
            rule = ["OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", port,
                    "-m", "cgroup", "--path", node.daemon_cgroup, "-j", "DROP"]  # fmt: skip
            subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True, timeout=30)
            try:
                time.sleep(fault.duration)
            finally:
                subprocess.run(
                    ["iptables", "-D", *rule], check=True, capture_output=True, timeout=30
                )
        return f"{target} for {fault.duration:.0f} s"

    def fault_plugin_rollout_restart(self, fault: Fault) -> str:
        from tests.cluster.demo import PLUGIN_DS

        self.retried(
            lambda: self.cluster.kubectl(
                "-n", "kube-system", "rollout", "restart", f"ds/{PLUGIN_DS}"
            )
        )
        return PLUGIN_DS

    def fault_plugin_version_change(self, fault: Fault) -> str:
        from tests.cluster.test_operator import GROUP, SECOND_TAG

        self.version = SECOND_TAG if getattr(self, "version", "") != SECOND_TAG else "0.1.0"
        self.retried(
            lambda: self.api(
                "PATCH",
                f"/apis/{GROUP}/v1/gcuresources/{RESOURCE}",
                {"spec": {"devicePlugin": {"version": self.version}}},
            )
        )
        return f"devicePlugin.version -> {self.version}"

    extender_prefix = "enflame-scheduler-extender"

    def run_fault(self, fault: Fault) -> None:
        record = FaultRecord(fault.number, fault.kind, self.now())
        self.records.append(record)
        action = getattr(self, "fault_" + fault.kind.replace("-", "_"))
        try:
            record.target = str(action(fault))
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        record.ended = self.now()
        self.say(
            f"fault {fault.number} {fault.kind} {record.target or record.error} "
            f"({record.started:.0f}-{record.ended:.0f} s)"
        )

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.say(f"seed {self.seed}: {len(self.plan)} faults planned over {self.seconds:.0f} s")
        self.creating.set()
        threads = [threading.Thread(target=t, daemon=True, name=t.__name__)
                   for t in (self.check_loop, self.probe_loop, self.workload_loop)]  # fmt: skip
        for thread in threads:
            thread.start()
        faults: list[threading.Thread] = []
        for fault in self.plan:
            delay = fault.at - (time.monotonic() - self.started)
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=self.run_fault, args=(fault,), daemon=True)
            thread.start()
            faults.append(thread)
        rest = self.seconds - (time.monotonic() - self.started)
        if rest > 0:
            time.sleep(rest)
        self.creating.clear()
        for thread in faults:
            thread.join(300)
        quiet_at = self.now()
        quiet_wall = time.time()
        self.say(f"faults over at {quiet_at:.0f} s; checking recovery")
        final = self.final_checks(quiet_at, quiet_wall)
        self.stop.set()
        for thread in threads:
            thread.join(30)
        return summarize(
            seed=self.seed,
            minutes=self.minutes,
            min_faults=0,
            records=self.records,
            probes=self.probes,
            violations=self.checker.violations,
            pods=self.pod_stats,
            observations=self.checker.observations,
            extra={
                "final": final,
                "harness_errors": self.harness_errors,
                "daemon_exits": self.daemon_exits(),
            },
        )

    def daemon_exits(self) -> dict[str, dict[str, list[list[float]]]]:
        """Each node's daemons that exited by themselves during the run and were started again
        (as systemd's Restart=always does on a node): ``[run seconds, exit status]``."""
        found: dict[str, dict[str, list[list[float]]]] = {}
        for name, node in self.nodes.items():
            for daemon, supervised in getattr(node, "daemons", {}).items():
                exits = [[round(at - self.started, 2), float(status)]
                         for at, status in supervised.exits if at >= self.started]  # fmt: skip
                if exits:
                    found.setdefault(name, {})[daemon] = exits
        return found

    def final_checks(self, quiet_at: float, quiet_wall: float) -> dict[str, Any]:
        """Within 60 s of the last fault: recovery conditions and the GcuResource Running;
        then readable reasons; then every workload pod deleted and gone within 2 minutes."""
        from tests.cluster.test_operator import GROUP

        deadline = time.monotonic() + RECOVERY_DEADLINE
        evidence: dict[str, Any] = {}
        recovered_at = None
        while time.monotonic() < deadline:
            try:
                alloc, plugins, pending, evidence = self.conditions()
                status = (
                    self.api("GET", f"/apis/{GROUP}/v1/gcuresources/{RESOURCE}").get("status") or {}
                )
                evidence["gcuresource"] = {
                    k: status.get(k) for k in ("phase", "readyResource", "conditions", "nodes")
                }
                if alloc and plugins and pending and status.get("phase") == "Running":
                    recovered_at = self.now()
                    break
            except Exception as exc:
                evidence["error"] = repr(exc)
            time.sleep(1)
        if recovered_at is None:
            self.checker.violations.append(
                Violation(
                    "not-recovered-in-60s",
                    self.now(),
                    "60 s after the last fault the cluster was not back",
                    evidence,
                )
            )
        pods = []
        with contextlib.suppress(Exception):
            pods = self.pods(NAMESPACE)
        self.checker.pods(self.now(), pods, quiet_wall, time.time())
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue  # deleted by the workload (a Never-restart pod shows Failed meanwhile)
            reason = readable_reason(pod)
            phase = pod["status"].get("phase")
            if phase in ("Pending", "Failed"):
                at_end = self.pod_stats["pending_at_end"]
                key = f"{phase}: {str(reason)[:120]}"
                at_end[key] = at_end.get(key, 0) + 1
        # Everything deleted: none may stay Terminating 2 minutes.
        with contextlib.suppress(Exception):
            self.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3Dchaos")
        gone_by = time.monotonic() + STUCK_TERMINATING + 10
        left: list[dict[str, Any]] = []
        while time.monotonic() < gone_by:
            try:
                left = self.pods(NAMESPACE)
            except Exception:
                left = left or []
            if not left:
                break
            time.sleep(2)
        self.checker.pods(self.now(), left, quiet_wall, time.time())
        after = None if recovered_at is None else round(recovered_at - quiet_at, 2)
        return {
            "quiet_at": quiet_at,
            "recovered_at": recovered_at,
            "recovered_after_s": after,
            "evidence": evidence,
            "left_after_delete": [p["metadata"]["name"] for p in left],
        }


# -- the tier's logs of a failed run, kept beside its report --------------------------------

LOG_TAIL = 64 << 20  # bytes of each daemon log kept (its end: where a failure shows)
NODE_LOGS = ("kubelet", "containerd", "ns")


def logs_dir(report: str) -> str:
    """Where a failed run's logs go: beside the report, its name with ``.logs`` for ``.json``."""
    base = report[:-5] if report.endswith(".json") else report
    return base + ".logs"


def copy_tail(source: str, target: str, limit: int = LOG_TAIL) -> int:
    """Copy the last ``limit`` bytes of ``source`` to ``target`` (a first line says how much
    was left out); the bytes copied, -1 when ``source`` cannot be read."""
    try:
        with open(source, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            data = handle.read(limit)
    except OSError:
        return -1
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "wb") as out:
        if size > limit:
            out.write(f"[chaos: the first {size - limit} bytes of {source} left out]\n".encode())
        out.write(data)
    return len(data)


def copy_pod_logs(source: str, target: str, limit: int = LOG_TAIL) -> list[str]:
    """A kubelet's ``/var/log/pods`` (``<namespace>_<pod>_<uid>/<container>/<n>.log``, the
    current and the previous container of each) copied to ``target``; the files copied."""
    copied = []
    for top, _, files in sorted(os.walk(source)):
        for name in sorted(files):
            path = os.path.join(top, name)
            relative = os.path.relpath(path, source)
            if os.path.isfile(path) and copy_tail(path, os.path.join(target, relative), limit) >= 0:
                copied.append(relative)
    return copied


def _command_output(command: Sequence[str], target: str, timeout: float = 30) -> None:
    """``command``'s output (or why there is none) in ``target``: a wedged daemon must not
    stop the rest of the logs from being kept."""
    import subprocess

    try:
        result = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
        text = f"$ {' '.join(command)}\n(exit {result.returncode})\n{result.stdout}{result.stderr}"
    except (OSError, subprocess.SubprocessError) as exc:
        text = f"$ {' '.join(command)}\nnot run to the end: {exc!r}\n"
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)


def _kubelet_goroutines(node: Any, target: str) -> None:
    """The kubelet's goroutines (its debug handlers, on by default) into ``target``: where a
    wedged pod worker or probe waits."""
    import ssl
    import urllib.request

    url = f"https://{node.node_ip}:{node.kubelet_port}/debug/pprof/goroutine?debug=2"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the kubelet's own self-signed serving certificate
    try:
        with urllib.request.urlopen(url, timeout=20, context=context) as answer:
            text = answer.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        text = f"GET {url}: {exc!r}\n"
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(text)


def _containerd_goroutines(node: Any, target: str) -> None:
    """SIGUSR1 makes containerd write its goroutines to ``/tmp/containerd.<pid>.stacks.log``
    (and to its log); moved into ``target``."""
    process = node.containerd
    if process is None or process.poll() is not None:
        return
    dump = f"/tmp/containerd.{process.pid}.stacks.log"
    with contextlib.suppress(OSError):
        os.kill(process.pid, signal.SIGUSR1)
        for _ in range(20):
            time.sleep(0.25)
            if os.path.exists(dump):
                break
        time.sleep(0.5)  # written in one go, but let it finish
    with contextlib.suppress(OSError):
        import shutil

        shutil.move(dump, target)


API_DUMPS = (
    ("pods.txt", ("get", "pods", "-A", "-o", "wide")),
    ("pods.json", ("get", "pods", "-A", "-o", "json")),
    ("nodes.json", ("get", "nodes", "-o", "json")),
    ("daemonsets.json", ("get", "daemonsets", "-A", "-o", "json")),
    ("gcuresources.yaml", ("get", "gcuresources.topscloud.enflame.com", "-A", "-o", "yaml")),
    ("events.txt", ("get", "events", "-A", "--sort-by=.lastTimestamp", "-o", "wide")),
)


def keep_logs(cluster: Any, directory: str, say: Callable[[str], None]) -> str:
    """Everything a failed run's cause shows in, copied to ``directory`` before the tier is
    torn down (which removes it): per node its kubelet's, containerd's and namespace script's
    logs, every pod's container logs (``/var/log/pods``), both daemons' goroutines, its
    containerd tasks and config; the control plane's logs; the API's pods, nodes,
    DaemonSets, GcuResources and events. Best effort: a piece that cannot be had is named in
    its place. Returns ``directory``."""
    os.makedirs(directory, exist_ok=True)
    for node in cluster.nodes:
        into = os.path.join(directory, node.name)
        os.makedirs(into, exist_ok=True)
        _containerd_goroutines(node, os.path.join(into, "containerd-goroutines.txt"))
        _kubelet_goroutines(node, os.path.join(into, "kubelet-goroutines.txt"))
        for piece in NODE_LOGS:
            copy_tail(os.path.join(node.work, f"{piece}.log"), os.path.join(into, f"{piece}.log"))
        copy_pod_logs(node.private("/var/log/pods"), os.path.join(into, "pods"))
        ctr = [node.binaries.ctr, "--address", node.socket, "--namespace", "k8s.io"]
        _command_output([*ctr, "tasks", "ls"], os.path.join(into, "ctr-tasks.txt"))
        _command_output([*ctr, "containers", "ls"], os.path.join(into, "ctr-containers.txt"))
        with contextlib.suppress(OSError, AttributeError):
            copy_tail(node.config_path, os.path.join(into, "containerd-config.toml"))
        for top in ("/etc/enflame-gcu",):
            with contextlib.suppress(OSError):
                for name in sorted(os.listdir(node.private(top))):
                    source = os.path.join(node.private(top), name)
                    if os.path.isfile(source):
                        copy_tail(source, os.path.join(into, "etc-enflame-gcu", name))
    plane_logs = os.path.join(directory, "control-plane")
    for name in sorted(os.listdir(cluster.plane.work)) if os.path.isdir(cluster.plane.work) else []:
        if name.endswith(".log"):
            copy_tail(os.path.join(cluster.plane.work, name), os.path.join(plane_logs, name))
    api = os.path.join(directory, "api")
    os.makedirs(api, exist_ok=True)
    kubectl = os.path.join(cluster.plane.bin, "kubectl")
    for name, args in API_DUMPS:
        _command_output(
            [kubectl, f"--kubeconfig={cluster.plane.kubeconfig}", "--request-timeout=20s", *args],
            os.path.join(api, name),
        )
    _command_output(["ps", "-eo", "pid,ppid,stat,wchan:32,etime,args"],
                    os.path.join(directory, "processes.txt"))  # fmt: skip
    say(f"kept the tier's logs of the failed run in {directory}")
    return directory


RESOURCE = "enflame-gcu-resource"


def deploy(cluster: Any, say: Callable[[str], None]) -> tuple[Any, str]:
    """The product as the guide installs it (operator, its GcuResource, the extender beside
    the scheduler), with slices on gcu-node-2; the operator's Bench and the extender's pod
    name prefix."""
    from tests.cluster.cluster import PLUGIN_SELECTOR, wait_for
    from tests.cluster.demo import PLUGIN_DS
    from tests.cluster.test_extender_chart import (
        CONTROL_PLANE_LABEL,
        extender_beside_scheduler,
    )
    from tests.cluster.test_helm import CHART, HELM_PYTHON, helm
    from tests.cluster.test_operator import (
        GROUP,
        PLUGIN_IMAGE,
        RELEASE,
        SECOND_TAG,
        Bench,
        Operator,
        chart_values,
        ours_spec,
    )

    if not os.access(HELM_PYTHON, os.X_OK):
        fail(f"no {HELM_PYTHON}: scripts/bootstrap.sh makes it (helm-python-sdk)")
    started = time.monotonic()
    nodes = [n for n in cluster.nodes]
    for node in nodes:
        cluster.kubectl("label", "node", node.name, "enflame.com/gcu.present=true", "--overwrite")
        path = os.path.join(node.private("/etc/enflame-gcu"), os.path.basename(PLUGIN_CONFIG))
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(plugin_config(node.name))
        # The "new release" for the version change: the plugin image under a second tag.
        node.ctr(
            "images", "tag", "--force", f"{PLUGIN_IMAGE}:0.1.0", f"{PLUGIN_IMAGE}:{SECOND_TAG}"
        )
    cluster.kubectl("label", "node", "gcu-node-2", f"{CONTROL_PLANE_LABEL}=", "--overwrite")
    cluster.kubectl("create", "namespace", NAMESPACE)
    bench = Bench(cluster, Operator(cluster))
    extender = {"enabled": True, "mode": "daemonset"}
    helm(cluster, "install", RELEASE, CHART, "kube-system",
         json.dumps({**chart_values(cluster, None), "extender": extender}))  # fmt: skip
    for group in (GROUP, "topsops.enflame.com"):
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/gcuresources.{group}", "--timeout=60s"
        )
    bench.operator.wait_ready()
    # Node state on: the extender beside the scheduler reads it (off in the example since
    # issue 47 point 10).
    spec = ours_spec(args=[f"--config-file=/host{PLUGIN_CONFIG}"], nodeState=True)
    helm(cluster, "upgrade", RELEASE, CHART, "kube-system",
         json.dumps({**chart_values(cluster, spec), "extender": extender}))  # fmt: skip
    status = bench.wait_running(RESOURCE)
    wait_for(
        "a Ready plugin pod on each node",
        lambda: bench.on_each_node(PLUGIN_SELECTOR, PLUGIN_DS),
        180,
    )
    probe = ChaosRun(cluster, bench, 0, 1, 0, (), say)
    expected = probe.healthy()

    def shown() -> bool:
        return all(
            {r: int(cluster.node(n)["status"].get("allocatable", {}).get(r, 0)) for r in want}
            == want
            for n, want in expected.items()
        )

    wait_for(f"allocatable {expected}", shown, 120, 1,
             detail=lambda: cluster.describe("node", SHARED_NODE))  # fmt: skip
    pod = extender_beside_scheduler(cluster)
    probe.extender_prefix = pod["metadata"]["name"].rsplit("-", 1)[0] + "-"
    say(
        f"deployed in {time.monotonic() - started:.0f} s: {RESOURCE} {status.get('phase')}, "
        f"allocatable {expected}, extender {pod['metadata']['name']} beside the scheduler"
    )
    return bench, probe.extender_prefix


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the fault schedule and workload"
    )
    parser.add_argument("--minutes", type=float, default=10, help="length of each run")
    parser.add_argument(
        "--runs", type=int, default=1, help="runs back to back (seeds seed, seed+1, ...)"
    )
    parser.add_argument(
        "--faults", type=int, default=0, help="faults per run (default: 6 a minute)"
    )
    parser.add_argument("--min-faults", type=int, default=0, help="exit 1 when fewer ran")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma list")
    parser.add_argument("--report", default="chaos-report.json", help="the JSON report's path")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from tests.cluster.service_route import ServiceRoute
    from tests.cluster.session import running_cluster

    options = parse(argv)
    kinds = [k for k in options.kinds.split(",") if k]
    count = options.faults or round(6 * options.minutes)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"chaos [{time.monotonic() - started:6.0f} s] {text}", flush=True)

    reports: list[dict[str, Any]] = []
    teardown: list[str] = []
    how = "run `make chaos` (scripts/chaos.sh builds everything and sets the variables)"
    error = ""
    if os.path.isdir(logs_dir(options.report)):
        import shutil

        # An earlier run's, under this report's name: the report it explained is replaced too.
        shutil.rmtree(logs_dir(options.report))
    try:
        with running_cluster(fail, teardown.append, how) as cluster:
            say("cluster up")
            with (
                kept_on_failure(cluster, options.report, reports, say),
                ServiceRoute(cluster.plane.port),
            ):
                bench, extender_prefix = deploy(cluster, say)
                for number in range(options.runs):
                    seed = options.seed + number
                    run = ChaosRun(cluster, bench, seed, options.minutes, count, kinds, say)
                    run.extender_prefix = extender_prefix
                    report = run.run()
                    report["problems"] = list(report["problems"])
                    injected = report["faults"]["total"]
                    if injected < options.min_faults:
                        report["problems"].append(
                            f"{injected} faults ran, fewer than --min-faults {options.min_faults}"
                        )
                    report["ok"] = not report["problems"]
                    report["load_average"] = os.getloadavg()
                    reports.append(report)
                    say(
                        f"run seed {seed}: {'OK' if report['ok'] else 'FAILED'} "
                        f"{report['problems']}"
                    )
                    write(options.report, reports, teardown, error)
    except ChaosFailed as exc:
        error = str(exc)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
    write(options.report, reports, teardown, error)
    for report in reports:
        print(table(report))
    if error:
        print(f"chaos FAILED: {error}", file=sys.stderr)
    ok = not error and bool(reports) and all(r["ok"] for r in reports)
    say(f"report {options.report}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


@contextlib.contextmanager
def kept_on_failure(
    cluster: Any, report: str, reports: list[dict[str, Any]], say: Callable[[str], None]
) -> Iterator[None]:
    """The tier's logs kept beside ``report`` (:func:`keep_logs`) when a run failed or the
    runs could not be carried out, while the cluster still stands."""
    failed = True
    try:
        yield
        failed = not reports or not all(r["ok"] for r in reports)
    finally:
        if failed:
            try:
                keep_logs(cluster, logs_dir(report), say)
            except Exception as exc:  # the run's own failure is the one to report
                say(f"could not keep all the logs in {logs_dir(report)}: {exc!r}")


def write(path: str, reports: list[dict[str, Any]], teardown: list[str], error: str) -> None:
    kept = logs_dir(path)
    logs = kept if os.path.isdir(kept) else None
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(
            {"runs": reports, "teardown": teardown, "error": error, "logs": logs}, handle, indent=1
        )


def table(report: Mapping[str, Any]) -> str:
    """A short text summary of one run."""
    lines = [
        f"seed {report['seed']}, {report['minutes']} min: {report['faults']['total']} faults "
        f"{report['faults']['by_kind']}; pods {report['pods']}; "
        f"{len(report['violations'])} violations; {'OK' if report['ok'] else report['problems']}"
    ]
    for kind, per in report["recovery_s"].items():
        parts = [
            f"{c} p50 {v['p50']} p99 {v['p99']} max {v['max']} never {v['never']}"
            for c, v in per.items()
        ]
        lines.append(f"  {kind}: " + "; ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
