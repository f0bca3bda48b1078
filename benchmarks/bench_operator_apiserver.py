"""Operator against a real Kubernetes 1.20 API server: pass latency and calls when converged; JSON.

The control plane of the cluster tier (tests/cluster/controlplane.py: etcd, kube-apiserver,
kube-controller-manager; built by scripts/e2e-build-cluster.sh, or $ENFLAME_E2E_CLUSTER_DIR),
N Node objects, the example resource, and the scheduler's and kubelets' part played through
the API as in tests/gcu_operator/test_apiserver.py. Needs the build; prints JSON.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enflame_gcu.gcu_operator import resource as rs
from enflame_gcu.gcu_operator import runner
from tests.cluster import controlplane
from tests.gcu_operator import test_apiserver as e2e
from tests.gcu_operator.helpers import EXAMPLE

PASSES = 20


class CountingApi:
    """Counts the calls a ClusterApi gets (by method name)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return counted


def run(nodes: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="enflame-operator-bench-") as work,
        controlplane.ControlPlane(controlplane.build(), work, scheduler=False) as cp,
    ):
        cp.kubectl("apply", "-f", str(e2e.CRD_FILE))
        for group in (rs.GROUP, rs.LEGACY_GROUP):
            cp.kubectl("wait", "--for=condition=Established", f"crd/{rs.PLURAL}.{group}")
        for i in range(nodes):
            cp.api(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": f"node-{i:03d}",
                        "labels": {"enflame.com/gcu.present": "true"},
                    },
                },
            )
        cp.kubectl("apply", "-f", str(EXAMPLE))
        client = e2e._client(cp)
        counting = CountingApi(client)
        operator = runner.Operator(counting)
        start = time.perf_counter()
        deploy_passes = 0
        while True:
            deploy_passes += 1
            results = operator.run_once()
            gr = cp.get(f"/apis/{rs.GROUP}/v1/{rs.PLURAL}/enflame-gcu-resource") or {}
            if (gr.get("status") or {}).get("phase") == "Running" and all(
                r.actions == 0 for r in results
            ):
                break
            e2e._kubelets(cp)
            assert deploy_passes < 200, gr.get("status")
        deploy_seconds = time.perf_counter() - start
        times = []
        counting.calls.clear()
        for _ in range(PASSES):
            begin = time.perf_counter()
            results = operator.run_once()
            times.append(time.perf_counter() - begin)
            assert all(r.actions == 0 for r in results)
        client.close()
        ordered = sorted(times)
        return {
            "nodes": nodes,
            "deploy_passes": deploy_passes,
            "deploy_seconds_with_stand_in_kubelets": round(deploy_seconds, 2),
            "converged_pass_p50_ms": round(statistics.median(ordered) * 1000, 1),
            "converged_pass_max_ms": round(ordered[-1] * 1000, 1),
            "api_calls_per_converged_pass": len(counting.calls) / PASSES,
        }


def main() -> None:
    if not os.environ.get(controlplane.BIN_DIR_ENV):
        # Building the control plane takes 10-30 minutes; make bench does not start that.
        reason = f"${controlplane.BIN_DIR_ENV} is not set (scripts/e2e-build-cluster.sh prints it)"
        json.dump({"benchmark": "operator-apiserver", "not_run": reason}, sys.stdout)
        sys.stdout.write("\n")
        return
    results = {
        "benchmark": "operator-apiserver",
        "kubernetes": "1.20 (Debian's source package)",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": [run(2), run(20)],
    }
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
