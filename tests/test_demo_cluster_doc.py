"""`make demo-cluster` is documented as it runs: the Makefile target runs scripts/demo-cluster.sh,
both READMEs describe the tour in a paragraph naming every step of tests/cluster/demo.py (in its
order) and the first build's time the script states, and list the target with the others."""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.cluster import demo

ROOT = pathlib.Path(__file__).resolve().parents[1]
# README, where the other targets are listed
READMES = (("README.md", "Other targets:"), ("README.zh-CN.md", "其他目标："))


def _read(relative: str) -> str:
    return (ROOT / relative).read_text("utf-8")


def tour_paragraph(text: str) -> str:
    """The README paragraph that starts with `make demo-cluster`."""
    found = [p for p in text.split("\n\n") if p.startswith("`make demo-cluster`")]
    assert len(found) == 1, "one README paragraph starts with `make demo-cluster`"
    return found[0].replace("\n", " ")


def test_the_makefile_target_runs_the_demo_script() -> None:
    makefile = _read("Makefile")
    match = re.search(r"^demo-cluster:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert match is not None, "no demo-cluster target in the Makefile"
    assert "scripts/demo-cluster.sh" in match.group(1)
    assert re.search(r"^\.PHONY:.*\bdemo-cluster\b", makefile, flags=re.MULTILINE)
    script = _read("scripts/demo-cluster.sh")
    assert "tests.cluster.demo" in script and "e2e-cluster-lib.sh" in script
    assert re.search(r"^cluster_tier_run .*tests\.cluster\.demo", script, flags=re.MULTILINE)


def test_the_demo_prints_its_steps_in_order() -> None:
    """Each step of demo.STEPS is printed once, in order (say(N, ...) calls in the source)."""
    source = pathlib.Path(demo.__file__).read_text("utf-8")
    numbers = [int(n) for n in re.findall(r"\bsay\(\s*(\d+),", source)]
    assert numbers == list(range(1, len(demo.STEPS) + 1)), numbers


@pytest.mark.parametrize(("readme", "targets"), READMES)
def test_the_readme_describes_the_steps_the_demo_runs(readme: str, targets: str) -> None:
    text = _read(readme)
    paragraph = tour_paragraph(text)
    phrases = [s.readme_en if readme == "README.md" else s.readme_zh for s in demo.STEPS]
    positions = [paragraph.find(phrase) for phrase in phrases]
    missing = [p for p, at in zip(phrases, positions, strict=True) if at < 0]
    assert not missing, f"{readme}'s tour paragraph does not name: {missing}"
    assert positions == sorted(positions), f"{readme} names the steps out of order: {phrases}"
    # The first build's time, as the tier's shared runner says it.
    script = _read("scripts/e2e-cluster-lib.sh")
    for minutes in re.findall(r"about (\d+) min idle, (\d+) min", script)[0]:
        assert minutes in paragraph, (readme, minutes)
    assert "/var/cache/enflame-e2e" in paragraph
    listed = text[text.index(targets) :].split("\n\n")[0]
    assert "`make demo-cluster`" in listed, (
        f"{readme} does not list make demo-cluster with the targets"
    )


@pytest.mark.parametrize(
    ("node", "cards", "local"),
    [
        ("gcu-node-1", ["gcu0", "gcu1"], True),
        ("gcu-node-1", ["gcu5", "gcu4"], True),
        ("gcu-node-1", ["gcu1", "gcu2"], False),  # one root port, two switches
        ("gcu-node-1", ["gcu2", "gcu3"], False),
        ("gcu-node-1", ["gcu0"], False),  # not a pair
        ("gcu-node-2", ["gcu0", "gcu3"], True),  # the flat board: one switch for all four
        ("gcu-node-2", ["gcu0", "gcu9"], False),  # no such card there
        ("gcu-node-2", ["gcu8", "gcu9"], False),
    ],
)
def test_switch_locality_is_judged_on_the_board_of_the_node_the_pod_got(
    node: str, cards: list[str], local: bool
) -> None:
    # The tour's 2-card pod may land on either node (the scheduler's spreading picks).
    from tests.cluster.test_extender_chart import one_switch

    assert one_switch(node, cards) is local
