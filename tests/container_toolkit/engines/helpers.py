"""Golden-file and file-tree helpers for the engine config editor tests."""

from __future__ import annotations

import os

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")

# Set ENFLAME_UPDATE_GOLDEN=1 to rewrite expected outputs; review the diff before committing.
UPDATE = os.environ.get("ENFLAME_UPDATE_GOLDEN") == "1"


def golden_text(name: str) -> str:
    """The content of a golden file."""
    with open(os.path.join(GOLDEN_DIR, name), encoding="utf-8") as handle:
        return handle.read()


def check_golden(name: str, actual: str) -> None:
    """Assert ``actual`` equals the golden file ``name`` (or rewrite it when updating)."""
    path = os.path.join(GOLDEN_DIR, name)
    if UPDATE:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(actual)
    assert actual == golden_text(name), f"output differs from golden/{name}"


def read(path: str) -> str:
    """A file's text."""
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def listing(directory: str) -> list[str]:
    """Every path under ``directory``, relative and sorted."""
    found = []
    for parent, dirs, files in os.walk(directory):
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(parent, name), directory))
    return sorted(found)
