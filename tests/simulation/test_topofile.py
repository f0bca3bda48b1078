"""Topology descriptions: the format's round trip, its errors and the built-ins."""

from __future__ import annotations

import os

import pytest

from enflame_gcu.errors import TopologyError
from enflame_gcu.simulation import topofile


@pytest.mark.parametrize("name", topofile.builtin_names())
def test_render_parses_back_to_the_same_topology(name: str) -> None:
    topo = topofile.load(name)
    assert topofile.parse(topofile.render(topo), topo.name) == topo


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu0 0000:01:00.0 <- cpu", "starts with gcuN"),
        ("gcu0 0000:01:00.0 <- 0000:00:01.0", "want 'gcuN <BDF>"),
        ("gcu0 0000:1:00.0 <- cpu", "is not a PCI address"),
        ("gcu0 0000:01:00.0 <- cpu colour=red", "unknown option(s) colour"),
        ("gcu0 0000:01:00.0 <- cpu numa=x", "numa must be a number"),
        ("gcu0 0000:01:00.0 <- cpu dir=other", "dir must be enflame or zixiao"),
        ("flavour: x\ngcu0 0000:01:00.0 <- cpu", "unknown header(s) flavour"),
        ("gcu0 0000:01:00.0 <- cpu\ngcu0 0000:02:00.0 <- cpu", "card minors repeat"),
        (
            "gcu0 0000:02:00.0 <- 0000:01:00.0 <- 0000:00:01.0 <- cpu\n"
            "gcu1 0000:03:00.0 <- 0000:01:00.0 <- 0000:00:02.0 <- cpu",
            "has two parents",
        ),
    ],
)
def test_bad_descriptions_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=None) as caught:
        topofile.parse(text)
    assert message in str(caught.value)


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(TopologyError, match="built-in: 2socket-16card"):
        topofile.load("nope")


def test_description_file_by_path(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "mine.topo")
    with open(path, "w") as handle:
        handle.write("# a comment\ndriver-version: 9.9\ngcu4 0000:01:00.0 <- cpu numa=1\n")
    topo = topofile.load(path)
    assert topo.name == "mine"
    assert topo.driver_version == "9.9"
    assert topo.cards == (topofile.SimCard(4, "0000:01:00.0", (), 1),)
