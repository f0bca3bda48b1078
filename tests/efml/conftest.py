"""The simulated node with the simulated libefml installed, and the library loaded on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enflame_gcu.efml import library
from enflame_gcu.simulation import efmlsim
from tests.conftest import MakeNode


@pytest.fixture
def node(make_node: MakeNode) -> str:
    root = make_node("vgcu-2card")
    efmlsim.install(root)
    return root


@pytest.fixture
def lib(node: str) -> Iterator[library.Library]:
    loaded = library.Library.load(node)
    loaded.init()
    yield loaded
    loaded.shutdown()
