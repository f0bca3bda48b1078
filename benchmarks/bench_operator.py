"""Operator benchmarks: reconcile latency and API calls per reconcile (steady, rollout); JSON.

The operator runs against the tests' in-memory API server and simulated cluster
(tests/gcu_operator/fake_api.py), so the figures are the operator's own cost (observe + plan +
apply) and its call counts, without network or API-server latency; each call against a real API
server adds its round trip (the cluster tier's figures are in docs/benchmarks.md when it ran).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.gcu_operator import api, reconcile, runner
from tests.gcu_operator.fake_api import WRITES, FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours, set_spec

NODE_COUNTS = (3, 20, 100)
PASSES = 30


def _cluster(
    nodes: int, max_unavailable: int | str
) -> tuple[FakeApi, FakeCluster, runner.Operator]:
    fake = FakeApi()
    cluster = FakeCluster(fake, [f"node-{i:03d}" for i in range(nodes)])
    fake.put(
        api.GCU_RESOURCE, ours(upgradePolicy={"maxUnavailable": max_unavailable}, gcuExporter={})
    )
    return fake, cluster, runner.Operator(fake, clock=lambda: fake.now)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def steady(nodes: int) -> dict[str, Any]:
    """A converged cluster: one pass per resource, what it costs and how many calls it makes."""
    fake, cluster, operator = _cluster(nodes, 1)
    deploy_passes = converge(operator, cluster, passes=200)
    pass_times, plan_times, calls = [], [], []
    resource = fake.find(api.GCU_RESOURCE, "gcu")
    assert resource is not None
    for _ in range(PASSES):
        before = len(fake.calls)
        start = time.perf_counter()
        results = operator.run_once()
        pass_times.append(time.perf_counter() - start)
        assert all(r.actions == 0 for r in results)
        calls.append(fake.calls[before:])
        observed = operator.observe(api.GCU_RESOURCE, resource)
        start = time.perf_counter()
        reconcile.plan(observed)
        plan_times.append(time.perf_counter() - start)
    per_pass = Counter(verb for verb, _ in calls[-1])
    return {
        "nodes": nodes,
        "passes_to_deploy": deploy_passes,
        "pass": _ms(pass_times),
        "plan_only": _ms(plan_times),
        "api_calls_per_pass": dict(sorted(per_pass.items())),
        "writes_per_pass": sum(n for verb, n in per_pass.items() if verb in WRITES),
    }


def rollout(nodes: int, max_unavailable: int | str) -> dict[str, Any]:
    """A device plugin version change rolled over every node: passes, calls, writes."""
    fake, cluster, operator = _cluster(nodes, max_unavailable)
    converge(operator, cluster, passes=200)
    set_spec(fake, ours(), ["devicePlugin", "version"], "0.2.0")
    before = len(fake.calls)
    pass_times: list[float] = []
    passes = 0
    while True:
        passes += 1
        start = time.perf_counter()
        results = operator.run_once()
        pass_times.append(time.perf_counter() - start)
        if all(r.actions == 0 and not r.error for r in results) or passes > 2000:
            break
        cluster.step()
    made = fake.calls[before:]
    writes = sum(1 for verb, _ in made if verb in WRITES)
    return {
        "nodes": nodes,
        "max_unavailable": max_unavailable,
        "passes": passes,
        "api_calls": len(made),
        "api_calls_per_pass": round(len(made) / passes, 1),
        "writes": writes,
        "writes_per_node": round(writes / nodes, 1),
        "pass": _ms(pass_times),
    }


def calls_per_minute(
    nodes: int, interval: float = 5.0, old_max: float = 30.0, max_interval: float = 300.0
) -> dict[str, Any]:
    """API calls per minute once converged, steady state: a full pass every ``interval`` s
    (issue 33's before); a full pass every ``old_max`` s with a list of the GcuResources every
    ``interval`` s in between (issue 33's after); and now a full pass every ``max_interval`` s
    with the idle wait's watches in between (enflame_gcu.gcu_operator.main._idle_wait), the
    watches counted by running one wait. The Lease's renewals are apart (leader.py)."""
    from enflame_gcu.gcu_operator import main as operator_main

    fake, cluster, operator = _cluster(nodes, 1)
    converge(operator, cluster, passes=200)
    before = len(fake.calls)
    operator.run_once()
    per_pass = len(fake.calls) - before
    before = len(fake.calls)
    operator_main.fingerprint(fake)
    per_look = len(fake.calls) - before
    before = len(fake.calls)
    args = argparse.Namespace(interval=0.05, max_interval=0.2)
    operator_main._idle_wait(
        fake, threading.Event(), args, idle=10, clock=time.monotonic, operator=operator
    )
    per_wait = len(fake.calls) - before
    passes_before = 60 / interval
    passes_old = 60 / old_max
    return {
        "gcu_nodes": nodes,
        "calls_per_full_pass": per_pass,
        "calls_per_look": per_look,
        "calls_per_idle_wait": per_wait,
        "calls_per_minute_full_pass_every_interval": round(per_pass * passes_before, 1),
        "calls_per_minute_look_every_interval": round(
            per_pass * passes_old + per_look * (passes_before - passes_old), 1
        ),
        "calls_per_minute_watching": round((per_pass + per_wait) * 60 / max_interval, 2),
    }


def main() -> None:
    results: dict[str, Any] = {
        "benchmark": "operator",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "steady_state": [steady(n) for n in NODE_COUNTS],
        "rollout": [rollout(3, 1), rollout(20, 1), rollout(20, "25%"), rollout(100, "10%")],
        "converged_calls_per_minute": calls_per_minute(100),
    }
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
