"""Shared fixtures: simulated GCU nodes under temporary directories."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from enflame_gcu.simulation import simulate, topofile

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS_DIR = os.path.join(os.path.dirname(PROJECT_ROOT), "shared", "schemas")

MakeNode = Callable[..., str]


@pytest.fixture
def make_node(tmp_path_factory: pytest.TempPathFactory) -> MakeNode:
    """Create a simulated node from a built-in name or description text; returns its root."""

    def make(topology: str = "vendor-8card", *, text: bool = False, **kwargs: object) -> str:
        root = str(tmp_path_factory.mktemp("node"))
        topo = topofile.parse(topology) if text else topofile.load(topology)
        simulate.create(root, topo, **kwargs)  # type: ignore[arg-type]
        return root

    return make


@pytest.fixture
def vendor_node(make_node: MakeNode) -> str:
    """The vendor manual's 8-card machine, simulated."""
    return make_node("vendor-8card")
