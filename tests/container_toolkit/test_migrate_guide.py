"""The guide's "Migrating from topscloud" commands (EN and ZH), run on a seeded simulated node."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from enflame_gcu.container_toolkit import doctor
from enflame_gcu.container_toolkit.cli import main
from tests.conftest import PROJECT_ROOT, MakeNode
from tests.container_toolkit import topscloud_files as vendor

GUIDES = ("docs/user-guide.md", "docs/user-guide.zh-CN.md")


def commands(guide: str) -> list[list[str]]:
    """The section's shell commands: its first bash block, prompts and comments dropped."""
    with open(os.path.join(PROJECT_ROOT, guide), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("### 3g. ", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None, f"{guide}: the migration section has no bash block"
    found = []
    for line in block.group(1).splitlines():
        words = shlex.split(line.removeprefix("# "), comments=True)
        if words:
            found.append(words)
    return found


def test_both_guides_show_the_same_commands() -> None:
    assert commands(GUIDES[0]) == commands(GUIDES[1])
    assert [words[:2] for words in commands(GUIDES[0])] == [
        ["enflame-ctk", "migrate"],
        ["enflame-ctk", "migrate"],
        ["enflame-ctk", "install"],
        ["enflame-ctk", "doctor"],
    ]


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_migration_runs_on_a_topscloud_kubernetes_node(
    make_node: MakeNode, guide: str
) -> None:
    root = make_node("vendor-8card")
    vendor.seed(root, docker=False)
    os.makedirs(os.path.join(root, "var/lib/kubelet"))
    assert [r.status for r in doctor.run(root) if r.name == "topscloud"] == ["warn"]
    for words in commands(guide):
        status = main([*words[1:], "--host-root", root])
        if words[1] != "doctor":  # a simulated node fails other checks (no kubelet running)
            assert status == 0, words
    assert [r.status for r in doctor.run(root) if r.name == "topscloud"] == ["pass"]
    assert [r.status for r in doctor.run(root) if r.name == "node-mode"] == ["pass"]
