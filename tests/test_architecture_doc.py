"""docs/architecture.md stays true: every module it names exists, and it names every part.

Names are dotted and relative to ``enflame_gcu`` (``shim.main``), in code spans and in the
Mermaid diagrams; a name may end in an attribute of its module (``edits.ContainerEdits``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import pkgutil
import re

import enflame_gcu

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
DOTTED = re.compile(r"(?<![\w./-])([a-z_]+(?:\.[A-Za-z_]+)+)(?![\w/-])")


def _children() -> set[str]:
    """Every top-level module and subpackage of enflame_gcu."""
    return {info.name for info in pkgutil.iter_modules(enflame_gcu.__path__)}


def _names(text: str) -> set[str]:
    """Dotted names in code spans and Mermaid blocks whose first part is one of our children."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    diagrams = re.findall(r"```mermaid\n(.*?)```", text, flags=re.DOTALL)
    found = set(spans)
    for block in [*spans, *diagrams]:
        found |= set(DOTTED.findall(block))
    children = _children()
    return {name for name in found if name.split(".")[0] in children}


def _exists(name: str) -> bool:
    full = f"enflame_gcu.{name}"
    try:
        if importlib.util.find_spec(full) is not None:
            return True
    except ModuleNotFoundError:
        pass
    module, _, attribute = full.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError:
        return False


def test_every_module_the_doc_names_exists() -> None:
    names = _names(DOC.read_text("utf-8"))
    assert len(names) > 30, "the extraction found too little: it must see the diagrams' names"
    assert sorted(name for name in names if not _exists(name)) == []


def test_the_doc_names_every_package_and_top_level_module() -> None:
    text = DOC.read_text("utf-8")
    missing = [child for child in sorted(_children()) if f"`{child}`" not in text]
    assert missing == []


def test_the_checker_catches_a_renamed_module() -> None:
    text = 'A `shim.mian` in prose.\n```mermaid\nflowchart TD\n  a["devices.discovr"]\n```\n'
    assert {name for name in _names(text) if not _exists(name)} == {"shim.mian", "devices.discovr"}
