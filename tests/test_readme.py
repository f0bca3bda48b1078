"""The README is the map of the system, and stays one.

Every program (console script in pyproject.toml) is in the README's program table and in the user
guides; every page under docs/ is linked from both READMEs; every top-level package is in the
layout; the English and Chinese READMEs have the same tables, row for row; the architecture
picture shows every program and every edge of its Graphviz source.
"""

from __future__ import annotations

import html
import pathlib
import re

import pytest
import tomlkit

ROOT = pathlib.Path(__file__).resolve().parents[1]
READMES = ("README.md", "README.zh-CN.md")
GUIDES = ("docs/user-guide.md", "docs/user-guide.zh-CN.md")
PACKAGE = ROOT / "src" / "enflame_gcu"


def _read(relative: str) -> str:
    return (ROOT / relative).read_text("utf-8")


def console_scripts() -> list[str]:
    project = tomlkit.parse(_read("pyproject.toml")).unwrap()["project"]
    return sorted(project["scripts"])


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table outside code blocks: rows of cells, the separator row dropped."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-{3,}:?", cell) for cell in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def program_table(text: str) -> list[list[str]]:
    """The table whose rows start with the programs (the first naming `enflame-ctk`)."""
    for table in tables(text):
        if any(row[0] == "`enflame-ctk`" for row in table[1:]):
            return table
    raise AssertionError("no table lists `enflame-ctk` in its first column")


def layout_block(text: str) -> str:
    """The package's part of the layout: the indented lines under ``src/enflame_gcu/``."""
    blocks = re.findall(r"```text\nsrc/enflame_gcu/[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, "one ```text block starting with src/enflame_gcu/ (the layout)"
    lines = blocks[0].splitlines()
    ends = [n for n, line in enumerate(lines) if line and not line[0].isspace()]
    return "\n".join(lines[: ends[0] if ends else len(lines)])


def top_level_packages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("readme", READMES)
def test_every_program_is_in_the_program_table(readme: str) -> None:
    rows = [row[0].strip("`") for row in program_table(_read(readme))[1:]]
    assert sorted(rows) == console_scripts(), f"{readme}: the program table's rows"


@pytest.mark.parametrize("guide", GUIDES)
def test_every_program_is_in_the_user_guide(guide: str) -> None:
    text = _read(guide)
    missing = [name for name in console_scripts() if f"`{name}`" not in text]
    assert not missing, f"{guide} never names {missing}"


@pytest.mark.parametrize("readme", READMES)
def test_every_doc_page_is_linked(readme: str) -> None:
    links = set(re.findall(r"\]\((docs/[^)#\s]+)\)", _read(readme)))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert not pages - links, f"{readme} does not link {sorted(pages - links)}"
    broken = [link for link in links if not (ROOT / link).exists()]
    assert not broken, f"{readme} links to missing files {broken}"


@pytest.mark.parametrize("readme", READMES)
def test_every_top_level_package_is_in_the_layout(readme: str) -> None:
    block = layout_block(_read(readme))
    listed = set(re.findall(r"^\s+(\w+)/", block, flags=re.MULTILINE))
    missing = sorted(set(top_level_packages()) - listed)
    assert not missing, f"{readme}'s layout omits {missing}"
    gone = sorted(listed - set(top_level_packages()))
    assert not gone, f"{readme}'s layout names packages that do not exist: {gone}"


def _row_key(row: list[str]) -> tuple[object, ...]:
    """What must match across languages: the cell count and the code spans and links of a row."""
    spans = tuple(re.findall(r"`([^`]+)`", " ".join(row)))
    links = tuple(re.findall(r"\]\(([^)]+)\)", " ".join(row)))
    return len(row), spans, links


def test_both_readmes_have_the_same_tables_row_for_row() -> None:
    english, chinese = (tables(_read(readme)) for readme in READMES)
    assert len(english) == len(chinese), "the READMEs have different numbers of tables"
    for number, (en_table, zh_table) in enumerate(zip(english, chinese, strict=True), 1):
        assert len(en_table) == len(zh_table), f"table {number}: {en_table[0]} rows differ"
        for en_row, zh_row in zip(en_table, zh_table, strict=True):
            assert _row_key(en_row) == _row_key(zh_row), f"table {number}: {en_row[0]!r}"


# --- the architecture picture ------------------------------------------------------------------

DOT = "docs/architecture.dot"
SVG = "docs/architecture.svg"
_DOT_NODE = re.compile(r"^\s*(\w+) \[label=\"([^\"]+)\"", re.MULTILINE)
_DOT_EDGE = re.compile(r"^\s*(\w+) -> (\w+) \[label=\"([^\"]+)\"", re.MULTILINE)


def test_the_picture_shows_every_program() -> None:
    labels = [label.split("\\n")[0] for _, label in _DOT_NODE.findall(_read(DOT))]
    missing = [name for name in console_scripts() if name not in labels]
    assert not missing, f"{DOT} has no node for {missing}"


def test_the_svg_is_rendered_from_the_current_source() -> None:
    """Every node and edge of the .dot, and every edge label, is in the SVG (re-render with dot)."""
    source = _read(DOT)
    svg = html.unescape(_read(SVG))
    titles = set(re.findall(r"<title>([^<]*)</title>", svg))
    texts = set(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    nodes = {name for name, _ in _DOT_NODE.findall(source)}
    edges = _DOT_EDGE.findall(source)
    assert nodes and edges, "the .dot parsed to nothing"
    stale = sorted(nodes - titles) + [f"{a}->{b}" for a, b, _ in edges if f"{a}->{b}" not in titles]
    for _, _, label in edges:
        stale += [line for line in label.split("\\n") if line not in texts]
    assert not stale, f"{SVG} is stale (dot -Tsvg {DOT} -o {SVG}): {stale}"
