"""Which API requests a converged operator makes, and how many a minute, on Kubernetes' own
control plane (tests/controlplane), by verb and resource from the API server's audit log; JSON.

The set-up is ``bench_scale.py``'s operator section (its simulated vendor nodes, its audit
policy: every request of the operator's ServiceAccount; the chart's RBAC and arguments with
``--interval=5 --max-interval=300``, the Lease's timings at their defaults; the example
resource with ``maxUnavailable: 10%``), without its scheduler arms. After the resource reports
Running it waits ``--settle`` seconds, then counts for ``--idle`` seconds; the windows are
also cut from the operator's last writing pass: 30-90 s (``bench_scale.py``'s window) and
30-330 s (one whole ``--max-interval``: the steady state, a full pass and its watches
included). Watches count when they end (the audit log's ResponseComplete). With
``--rollout`` it then changes the plugin's version and reports how long until every node runs
it Ready, the GcuResource Running again.

    .venv/bin/python benchmarks/bench_operator_requests.py --nodes 200 [--idle 330] [--rollout]

Measuring an older tree: put its ``src`` first on ``PYTHONPATH`` (the operator process
inherits it).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_scale

from tests.controlplane import operator_env
from tests.controlplane.harness import Harness

VERSION = "0.1.1-requests"
WINDOWS = ((30, 90), (30, 330))


def progress(message: str) -> None:
    print(f"[bench_operator_requests {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)


def _when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def requests(audit_log: str) -> list[tuple[datetime.datetime, str]]:
    """Every completed request of the operator: (when, "verb resource")."""
    found = []
    with open(audit_log, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            uri = str(event.get("requestURI", ""))
            verb = "watch" if "watch=true" in uri else str(event.get("verb"))
            resource = (event.get("objectRef") or {}).get("resource")
            found.append((_when(event["stageTimestamp"]), f"{verb} {resource}"))
    return found


def last_writing_pass(operator_log: str) -> datetime.datetime | None:
    """When the operator last logged a pass that acted (its log's ``N actions`` lines)."""
    last = None
    with open(operator_log, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.rstrip().endswith(" actions"):
                last = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return last.replace(tzinfo=datetime.timezone.utc) if last else None


def window(
    found: list[tuple[datetime.datetime, str]], start: datetime.datetime, begin: float, end: float
) -> dict[str, Any]:
    """Requests from ``begin`` to ``end`` seconds after ``start``, counted and by kind."""
    picked = [what for when, what in found if begin <= (when - start).total_seconds() < end]
    return {
        "from_seconds": begin,
        "to_seconds": end,
        "requests": len(picked),
        "per_minute": round(len(picked) * 60 / (end - begin), 2),
        "by_request": dict(collections.Counter(picked).most_common()),
    }


def rollout(harness: Harness, names: list[str], timeout: float) -> dict[str, Any]:
    """Change the plugin's version; seconds until every node runs it Ready and it is Running."""
    started = time.monotonic()
    harness.plane.api(
        "PATCH", f"{operator_env.GR_PATH}/scale", {"spec": {"devicePlugin": {"version": VERSION}}}
    )
    path = (
        f"/api/v1/namespaces/{operator_env.NAMESPACE}/pods?labelSelector=enflame.com/gcu.component"
    )
    steps: list[tuple[float, int]] = []
    while time.monotonic() - started < timeout:
        new = set()
        for pod in harness.plane.api("GET", path)["items"]:
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
            if ready and any(VERSION in c["image"] for c in pod["spec"]["containers"]):
                new.add(pod["spec"].get("nodeName"))
        if not steps or steps[-1][1] != len(new):
            steps.append((round(time.monotonic() - started, 1), len(new)))
        if len(new) >= len(names) and operator_env.phase(harness, "scale") == "Running":
            return {"seconds": round(time.monotonic() - started, 1), "completed": True,
                    "nodes_upgraded_at": steps}  # fmt: skip
        time.sleep(1)
    return {"seconds": round(time.monotonic() - started, 1), "completed": False,
            "nodes_upgraded_at": steps}  # fmt: skip


def run(options: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": options.nodes}
    with tempfile.TemporaryDirectory(prefix="enflame-requests-") as work:
        board = bench_scale.Board(os.path.join(work, "board"), shared=False)
        shared_board = bench_scale.Board(os.path.join(work, "shared-board"), shared=True)
        os.makedirs(os.path.join(work, "plane"))
        with Harness.started(
            os.path.join(work, "plane"),
            renew=10.0 if options.nodes <= 500 else 60.0,
            status_every=3600.0,
            apiserver_args=bench_scale.audit_args(work),
        ) as harness:
            specs = [
                (shared_board if i % 5 == 0 else board).node(harness.nodes, f"gcu-{i:05d}")
                for i in range(options.nodes)
            ]
            harness.add(specs)
            names = list(harness.nodes.nodes)
            kubeconfig = operator_env.install(harness)
            audit_log = os.path.join(work, "audit.log")
            with operator_env.operator_process(
                harness, kubeconfig, "--interval=5", "--max-interval=300"
            ):
                started = time.monotonic()
                body = operator_env.resource_body("scale", upgradePolicy={"maxUnavailable": "10%"})
                harness.plane.api("POST", operator_env.GR_PATH, body)
                harness.wait(
                    "the resource Running",
                    lambda: operator_env.phase(harness, "scale") == "Running",
                    options.timeout,
                )
                result["deploy_seconds"] = round(time.monotonic() - started, 1)
                progress(f"deployed in {result['deploy_seconds']} s")
                time.sleep(options.settle + options.idle)
                operator_log = os.path.join(harness.plane.work, "operator.log")
                found = requests(audit_log)
                last = last_writing_pass(operator_log)
                if last is not None and found:
                    # Each window as far as the log reaches (a pass that wrote after Running,
                    # deleting the validators, moves the windows' origin later).
                    covered = (found[-1][0] - last).total_seconds()
                    cuts = sorted({(b, min(e, covered)) for b, e in WINDOWS if covered > b + 30})
                    result["windows_after_last_writing_pass"] = [
                        window(found, last, begin, end) for begin, end in cuts
                    ]
                result["load_average"] = round(os.getloadavg()[0], 2)
                progress(f"converged: {result.get('windows_after_last_writing_pass')}")
                if options.rollout:
                    result["rollout"] = rollout(harness, names, options.timeout)
                    result["rollout"]["load_average"] = round(os.getloadavg()[0], 2)
                    progress(f"rollout: {result['rollout']}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--idle", type=float, default=330.0, help="seconds counted")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--rollout", action="store_true", help="and a plugin version rollout")
    options = parser.parse_args(argv)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "options": vars(options),
        "run": run(options),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
