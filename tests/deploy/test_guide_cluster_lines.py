"""Every ``kubectl``/``helm`` line of the English user guide is either run by the real-cluster
tier or listed with the reason it cannot run there (tests/cluster/guide.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import guide


def test_every_guide_line_is_run_or_excused() -> None:
    found = guide.lines()
    assert len(found) >= 20, found  # the extraction itself works
    missing = [line for line in found if line not in guide.RUN and line not in guide.NOT_RUN]
    assert not missing, f"guide lines the cluster tier neither runs nor excuses: {missing}"
    both = set(guide.RUN) & set(guide.NOT_RUN)
    assert not both, f"both run and excused: {both}"


def test_no_entry_names_a_line_the_guide_lost() -> None:
    found = set(guide.lines())
    stale = [line for line in [*guide.RUN, *guide.NOT_RUN] if line not in found]
    assert not stale, f"tests/cluster/guide.py names lines the guide no longer has: {stale}"


def test_a_new_guide_line_is_caught(tmp_path: Path) -> None:
    """The check can fail: a guide with one more kubectl line has an unlisted line."""
    with open(guide.GUIDE, encoding="utf-8") as handle:
        text = handle.read()
    changed = tmp_path / "guide.md"
    changed.write_text(text + "\n```bash\nkubectl get nodes   # new\n```\n", encoding="utf-8")
    lines = guide.lines(str(changed))
    assert "kubectl get nodes" in lines
    assert "kubectl get nodes" not in guide.RUN and "kubectl get nodes" not in guide.NOT_RUN
    with pytest.raises(AssertionError, match="no longer has"):
        guide.line("kubectl get nodes --no-such-line")
