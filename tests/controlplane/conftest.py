"""Fixtures of the control-plane harness (``make controlplane``; marker ``controlplane``,
deselected by ``make test``): one control plane with simulated nodes per test run
(:mod:`tests.controlplane.harness`), shared by every test of the run; each test adds the nodes
it needs under names of its own and removes them after."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Iterator

import pytest

from tests.controlplane import agent
from tests.controlplane.harness import Harness

# Each test module marks itself ``controlplane`` and ``xdist_group("controlplane")``: one
# control plane per run, not one per worker.
MARKS = (pytest.mark.controlplane, pytest.mark.xdist_group("controlplane"))
_serial = itertools.count()


@pytest.fixture(scope="session")
def harness() -> Iterator[Harness]:
    """The control plane and the simulated nodes' agent (Lease renewal every 5 s, the lifecycle
    controller's grace 20 s)."""
    with (
        tempfile.TemporaryDirectory(prefix="enflame-controlplane-") as work,
        Harness.started(work, renew=5.0) as started,
    ):
        yield started


MakeNodes = Callable[..., list[str]]


@pytest.fixture
def sim_nodes(harness: Harness) -> Iterator[MakeNodes]:
    """``sim_nodes(count, **gcu_node options) -> names``: GCU nodes for this test only
    (removed after it, with every pod bound to them)."""
    made: list[str] = []

    def make(count: int = 1, **options: object) -> list[str]:
        prefix = f"sim{next(_serial)}"
        specs = [agent.gcu_node(f"{prefix}-{i}", **options) for i in range(count)]  # type: ignore[arg-type]
        names = harness.add(specs)
        made.extend(names)
        return names

    yield make
    if made:
        harness.remove(made)


@pytest.fixture
def namespace(harness: Harness) -> Iterator[str]:
    """A namespace of this test's own, deleted after it."""
    name = f"t{next(_serial)}"
    harness.plane.api(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    harness.wait(
        "the namespace's default ServiceAccount",
        lambda: harness.plane.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        60,
    )
    yield name
    harness.plane.request("DELETE", f"/api/v1/namespaces/{name}")
