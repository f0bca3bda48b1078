"""Operator benchmark: API requests a minute of a running operator (enflame-gcu-operator's serve
loop, its Lease thread and its idle watches) with nothing to do; JSON.

Three states, each run for ``--minutes`` of the operator's time at the chart's defaults
(--interval 5, --max-interval 300, --retry-period 10) scaled down by ``--scale`` (0.01: one
second of the operator's is 10 ms here): converged with working watches; converged while every
watch fails with ``504 Too large resource version`` after 3 s (an API server whose watch cache
lags, issue 47 point 7); and a resource waiting on a pod that never becomes ready (Deploying,
nothing to do). The API server is the tests' in-memory one (tests/gcu_operator/fake_api.py);
every request it answers is counted, the Lease's included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.gcu_operator import api, main, runner
from tests.gcu_operator.fake_api import FakeApi, FakeCluster
from tests.gcu_operator.helpers import converge, ours


class Counting(FakeApi):
    """Serialised calls, each counted; every watch can fail as a lagging watch cache's does."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.counted: Counter[str] = Counter()
        self.watch_fails_after: float | None = None
        for name in ("get", "list", "create", "replace", "patch", "delete", "replace_status"):
            method = getattr(self, name)

            def call(*a: Any, _m: Any = method, **k: Any) -> Any:
                with self.lock:
                    return _m(*a, **k)

            setattr(self, name, call)

    def _call(self, verb: str, kind: api.Kind) -> None:
        self.counted[f"{verb} {kind.kind}"] += 1
        super()._call(verb, kind)

    def watch(self, kind: api.Kind, timeout: int, labels: Any = None) -> Iterator[Any]:
        if self.watch_fails_after is not None:
            self._call("watch", kind)
            time.sleep(self.watch_fails_after)
            raise api.ApiError(504, "Timeout: Too large resource version: 406, current: 299")
        return super().watch(kind, timeout, labels)


def _state(state: str, nodes: int) -> Counting:
    fake = Counting()
    if state == "deploying":
        FakeCluster(fake, [f"node-{i}" for i in range(nodes)], ready_after=10**9)
        fake.put(api.GCU_RESOURCE, ours())
        return fake
    cluster = FakeCluster(fake, [f"node-{i}" for i in range(nodes)])
    fake.put(api.GCU_RESOURCE, ours())
    converge(runner.Operator(fake, clock=lambda: fake.now), cluster, passes=200)
    return fake


def run(state: str, nodes: int, minutes: float, scale: float) -> dict[str, Any]:
    """Requests a minute (the operator's minutes) in one state."""
    fake = _state(state, nodes)
    if state == "failing-watches":
        fake.watch_fails_after = 3 * scale
    args = argparse.Namespace(
        namespace="kube-system",
        identity="op-1",
        interval=5 * scale,
        max_interval=300 * scale,
        lease_duration=40,
        renew_deadline=30.0,
        retry_period=10 * scale,
    )
    stop = threading.Event()
    thread = threading.Thread(target=main.serve, args=(args, fake, stop, lambda: fake.now))
    thread.start()
    time.sleep(10 * scale)  # the first pass (what deploying does first is not idle)
    fake.counted.clear()
    started = time.monotonic()
    time.sleep(minutes * 60 * scale)
    elapsed = (time.monotonic() - started) / scale / 60
    counted = Counter(fake.counted)
    stop.set()
    thread.join(timeout=30)
    total = sum(counted.values())
    return {
        "state": state,
        "gcu_nodes": nodes,
        "operator_minutes": round(elapsed, 2),
        "requests_per_minute": round(total / elapsed, 1),
        "lease_requests_per_minute": round(
            sum(v for k, v in counted.items() if k.endswith(" Lease")) / elapsed, 1
        ),
        "watch_requests_per_minute": round(
            sum(v for k, v in counted.items() if k.startswith("watch ")) / elapsed, 1
        ),
        "full_passes_per_minute": round(counted["list DaemonSet"] / elapsed, 2),
        "by_request": dict(counted.most_common()),
    }


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--nodes", type=int, default=20)
    opts = parser.parse_args()
    results = {
        "benchmark": "operator_idle",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "scale": opts.scale,
        "states": [
            run(state, opts.nodes, opts.minutes, opts.scale)
            for state in ("converged", "failing-watches", "deploying")
        ],
    }
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main_()
