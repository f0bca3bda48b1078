"""A short bounded chaos run on the real-cluster tier (tests/cluster/chaos.py; ``make chaos`` is
the long one). Marker ``chaos`` only, so ``make e2e-cluster`` (``-m cluster``) leaves it out:

    bash scripts/e2e-cluster.sh tests/cluster/test_chaos.py -m chaos
"""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster import chaos
from tests.cluster.cluster import Cluster
from tests.cluster.service_route import ServiceRoute

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]
MINUTES = float(os.environ.get("ENFLAME_CHAOS_MINUTES", "2"))


def test_bounded_chaos_keeps_every_invariant(cluster: Cluster) -> None:
    """Two minutes, a fault every ten seconds of every kind, overlapping: no violation, every
    fault injected that was planned (or said why not), the cluster back within 60 s."""
    with ServiceRoute(cluster.plane.port):
        bench, extender_prefix = chaos.deploy(cluster, print)
        run = chaos.ChaosRun(cluster, bench, 5, MINUTES, round(6 * MINUTES), chaos.KINDS, print)
        run.extender_prefix = extender_prefix
        report = run.run()
    print(chaos.table(report))
    assert report["faults"]["total"] >= round(5 * MINUTES), json.dumps(report["faults"])
    assert report["violations"] == [], json.dumps(report["violations"], indent=1)[:6000]
    assert report["final"]["recovered_at"] is not None, json.dumps(report["final"])[:4000]
