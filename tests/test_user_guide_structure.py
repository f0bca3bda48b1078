"""The user guides' contents, section numbers and cross-references agree (EN and ZH alike)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDES = ("docs/user-guide.md", "docs/user-guide.zh-CN.md")
_HEADING = re.compile(r"^(#{2,4}) (.+?)\s*$", re.MULTILINE)
_SECTION = re.compile(r"^(\d+)\. ")
_CONTENTS = re.compile(r"^(\d+)\. \[([^\]]+)\]\(#([^)]+)\)", re.MULTILINE)
_LINK = re.compile(r"\]\(#([^)]+)\)")
# "section 7" / "sections 7" in English, "第 7 节" in Chinese (not "step 3": those are lists).
_REFERENCE = {"en": re.compile(r"\bsections? (\d+)\b"), "zh": re.compile(r"第 ?(\d+) ?节")}


def _text(guide: str) -> str:
    text = (ROOT / guide).read_text("utf-8")
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks are not prose


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def sections(guide: str) -> list[tuple[int, str]]:
    """``[(number, title)]`` of the numbered ``##`` sections, in order."""
    found = []
    for level, title in _HEADING.findall(_text(guide)):
        number = _SECTION.match(title)
        if level == "##" and number:
            found.append((int(number.group(1)), title))
    return found


@pytest.mark.parametrize("guide", GUIDES)
def test_sections_are_numbered_one_by_one(guide: str) -> None:
    numbers = [number for number, _ in sections(guide)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


@pytest.mark.parametrize("guide", GUIDES)
def test_the_contents_list_every_section_in_order_with_working_anchors(guide: str) -> None:
    listed = _CONTENTS.findall(_text(guide))
    assert [(int(n), title) for n, title, _ in listed] == [
        (number, title.split(". ", 1)[1]) for number, title in sections(guide)
    ], "the contents and the sections differ"
    for number, title, anchor in listed:
        assert anchor == slug(f"{number}. {title}"), f"{guide}: contents link #{anchor}"


@pytest.mark.parametrize("guide", GUIDES)
def test_every_link_inside_the_guide_reaches_a_heading(guide: str) -> None:
    text = _text(guide)
    anchors = {slug(title) for _, title in _HEADING.findall(text)}
    broken = sorted({a for a in _LINK.findall(text) if a not in anchors})
    assert not broken, f"{guide}: links to no heading: {broken}"


@pytest.mark.parametrize(("guide", "language"), [(GUIDES[0], "en"), (GUIDES[1], "zh")])
def test_section_references_name_sections_that_exist(guide: str, language: str) -> None:
    count = len(sections(guide))
    refs = [int(n) for n in _REFERENCE[language].findall(_text(guide))]
    assert refs and all(1 <= n <= count for n in refs), (refs, count)


def test_both_languages_have_the_same_sections_subsections_and_references() -> None:
    en, zh = (_text(guide) for guide in GUIDES)
    assert len(sections(GUIDES[0])) == len(sections(GUIDES[1]))
    levels = [[level for level, _ in _HEADING.findall(text)] for text in (en, zh)]
    assert levels[0] == levels[1], "the guides' heading structure differs"
    refs = [sorted(_REFERENCE[lang].findall(text)) for lang, text in (("en", en), ("zh", zh))]
    assert refs[0] == refs[1], "the guides refer to different sections"
