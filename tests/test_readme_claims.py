"""The README's "Not done yet" list and the user guide's chart defaults table, checked against
the code, so neither goes stale again (issue 50 point 6: three of the list's items had become
false, and the guide gave a default the chart never had).

Each bullet of the list (English and Chinese, in the same order) is matched to one entry of
:data:`NOT_DONE`, whose check says the limitation still exists; when work removes it, the
check fails and names the bullet to take out. :data:`DONE` holds what the list once said
and must not say again while the code shows it done.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from enflame_gcu.gcu_operator import components, resource

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART_VALUES = ROOT / "deploy" / "helm" / "enflame-gcu" / "values.yaml"


def _text(path: str) -> str:
    return (ROOT / path).read_text("utf-8")


def _values() -> dict[str, Any]:
    return yaml.safe_load(CHART_VALUES.read_text("utf-8"))  # type: ignore[no-any-return]


def _programs() -> set[str]:
    """The console scripts pyproject.toml declares (tomllib is Python 3.11+; we run on 3.10)."""
    section = _text("pyproject.toml").split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    return {line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line}


def _bullets(readme: str, heading: str) -> list[str]:
    """The bullets of one section, each joined into one line."""
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [" ".join(b.split()) for b in re.split(r"\n- ", "\n" + section.strip())[1:]]


Check = Callable[[], bool]
# (English words, Chinese words, still true?): None where it is a fact about the world.
NOT_DONE: list[tuple[str, str, Check | None]] = [
    ("run on a real GCU", "真实的 GCU", None),
    (
        "Kubernetes ≥ 1.21",
        "Kubernetes ≥ 1.21",
        # The real-kubelet and cluster tiers build Kubernetes 1.20 from Debian's sources.
        lambda: "v1.20" in _text("scripts/e2e-build-cluster.sh"),
    ),
    ("not its memory", "不分割显存", None),  # a design limit: slices share the card's memory
    (
        "No labelling daemon",
        "没有自己的打标签守护进程",
        lambda: not any("label" in p or "discovery" in p for p in _programs()),
    ),
    (
        "no driver and no Node Feature Discovery",
        "不部署驱动",
        lambda: {"driver", "nfd"} <= resource.NOT_OURS.keys(),
    ),
    (
        "the operator at 5,000 nodes has not been run",
        "5,000 个节点上尚未运行过",
        lambda: "At 5,000 nodes (not run" in _text("docs/benchmarks.md"),
    ),
    (
        "Card telemetry is off by default",
        "卡遥测默认关闭",
        lambda: _values()["metrics"]["telemetry"]["enabled"] is False,
    ),
    (
        "DRA driver without a NetworkPolicy",
        "DRA 驱动没有 NetworkPolicy",
        lambda: (
            not any(
                "dra" in key.lower() and "polic" in key.lower() for key in components.EXTRA_KEYS
            )
        ),
    ),
]
# (words the list once had, in English and Chinese; the code showing it done).
DONE: list[tuple[str, str, Check]] = [
    (
        "under the real kubelet still fails",
        "仍然失败",
        (ROOT / "tests" / "kubelet" / "test_migration.py").exists,
    ),
    ("not yet part of CI", "还不在 CI 中", lambda: "make chaos" in _text(".ci/run")),
    (
        "without card telemetry",
        "不带卡遥测",
        lambda: "telemetry" in _text("src/enflame_gcu/gcu_operator/components.py"),
    ),
    (
        "the operator at 1,000 nodes is not yet measured",
        "尚未测量",
        lambda: "1,000 nodes" in _text("docs/benchmarks.md"),
    ),
]


def test_every_not_done_bullet_is_known_and_still_true() -> None:
    english = _bullets(_text("README.md"), "Not done yet")
    chinese = _bullets(_text("README.zh-CN.md"), "尚未完成")
    assert len(english) == len(chinese) == len(NOT_DONE), (english, chinese)
    for (en, zh, still), bullet_en, bullet_zh in zip(NOT_DONE, english, chinese, strict=True):
        assert en in bullet_en, (en, bullet_en)
        # A Chinese line break joins with a space no Chinese text has.
        assert zh.replace(" ", "") in bullet_zh.replace(" ", ""), (zh, bullet_zh)
        if still is not None:
            assert still(), f"no longer true, take it out of both READMEs: {bullet_en}"


@pytest.mark.parametrize(("en", "zh", "done"), DONE, ids=[d[0] for d in DONE])
def test_what_is_done_is_not_listed_as_not_done(en: str, zh: str, done: Check) -> None:
    assert done(), f"the code no longer shows {en!r} done: is the list right?"
    english = " ".join(_bullets(_text("README.md"), "Not done yet"))
    chinese = "".join(_bullets(_text("README.zh-CN.md"), "尚未完成")).replace(" ", "")
    assert en not in english and zh.replace(" ", "") not in chinese


def _value(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


# Rows whose default column describes rather than quotes: (value names) -> how to check it.
DESCRIBED: dict[tuple[str, ...], Callable[[dict[str, Any]], bool]] = {
    ("image.repository", "image.tag"): lambda v: v["image"]["tag"] == "",  # = the chart version
    ("nodeSelection.anyOfLabels",): lambda v: len(v["nodeSelection"]["anyOfLabels"]) == 3,
    ("tolerations", "priorityClassName"): lambda v: (
        [t["key"] for t in v["tolerations"]] == ["CriticalAddonsOnly", "enflame.com/gcu"]
        and v["priorityClassName"] == "system-node-critical"
    ),
}


@pytest.mark.parametrize(
    ("guide", "marker"),
    [("docs/user-guide.md", "Its main values:"), ("docs/user-guide.zh-CN.md", "主要的值：")],
)
def test_the_user_guides_chart_defaults_are_the_charts(guide: str, marker: str) -> None:
    table = _text(guide).split(marker, 1)[1].split("\n\n", 2)[1]
    values = _values()
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) >= 10, table
    for cells in rows:
        names = re.findall(r"`([^`]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        if tuple(names) in DESCRIBED:
            assert DESCRIBED[tuple(names)](values), (guide, names)
            continue
        assert len(names) == len(defaults), (guide, cells)
        for name, default in zip(names, defaults, strict=True):
            assert _value(values, name) == yaml.safe_load(default or '""'), (guide, name, default)


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_operator_install_waits_for_its_crd_before_the_gcu_resource(readme: str) -> None:
    """helm install with operator.enabled cannot create the GcuResource itself (its CRD is
    installed by that same release): the README prints the wait between the two steps."""
    text = _text(readme)
    install = text.index("--set operator.enabled=true\n")
    wait = text.index("kubectl wait --for condition=established crd/gcuresources.topscloud.")
    apply = text.index("kubectl apply -f deploy/operator/examples/gcu-resource.yaml")
    assert install < wait < apply
    crd = _text("deploy/helm/enflame-gcu/crds/gcuresource-crd.yaml")
    assert "name: gcuresources.topscloud.enflame.com" in crd


@pytest.mark.parametrize(
    ("readme", "heading"), [("README.md", "Development"), ("README.zh-CN.md", "开发")]
)
def test_one_table_gives_every_heavy_targets_costs(readme: str, heading: str) -> None:
    section = _text(readme).split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split(" | ")[0].strip("| `")
        for line in section.splitlines()
        if line.startswith("| `make ")
    }
    makefile = _text("Makefile")
    heavy = {"make test", "make e2e", "make e2e-cluster", "make demo-cluster", "make chaos"}
    assert heavy <= rows, rows
    for target in heavy:
        assert f"\n{target.split()[1]}:" in makefile, target  # a real target
    assert "/var/cache/enflame-e2e" in section and "du -sh" in section
