"""The harness's list of deliberately broken operators (tests/controlplane/mutants.py) applies
to today's code: each mutation's text is where it says, once, and each test it names exists.
Running them takes the control plane (``make mutants``); this only keeps the list true."""

from __future__ import annotations

import dataclasses

from tests.controlplane import mutants


def test_every_mutant_applies_to_todays_code_and_names_real_tests() -> None:
    assert mutants.problems() == []
    assert len(mutants.MUTANTS) >= 10


def test_a_mutant_whose_text_moved_or_whose_test_is_gone_is_named() -> None:
    first = mutants.MUTANTS[0]
    moved = dataclasses.replace(first, name="moved", old="text that is nowhere in the file")
    gone = dataclasses.replace(first, name="gone", tests=("test_that_does_not_exist",))
    twice = dataclasses.replace(first, name="twice", old="\n")
    found = mutants.problems((moved, gone, twice, first, first))
    assert any(p.startswith("moved: its text is in") and "0 times" in p for p in found), found
    missing = "gone: no test test_that_does_not_exist in tests/controlplane"
    assert any(missing in p for p in found), found
    assert any(p.startswith("twice:") and "not once" in p for p in found), found
    assert "two mutants share a name" in found


def test_the_mutation_of_each_mutant_changes_its_file() -> None:
    for mutant in mutants.MUTANTS:
        assert mutant.old != mutant.new, mutant.name
        assert mutant.tests, mutant.name
