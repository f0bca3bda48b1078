"""Parse and render engine configs so that everything we did not touch stays as it was."""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions
from tomlkit import items

from enflame_gcu import fileio
from enflame_gcu.errors import EngineConfigError

Document = MutableMapping[str, Any]


class DocumentFormat(Protocol):
    """A config syntax: parse text to a mutable document and render it back."""

    name: str

    def parse(self, text: str, path: str) -> Document:
        """Parse ``text`` (read from ``path``); malformed input raises EngineConfigError."""
        ...

    def render(self, document: Document, original: str) -> str:
        """Serialise ``document`` in the style of ``original``."""
        ...

    def new_table(self) -> Document:
        """An empty table/object to create a missing intermediate key with."""
        ...

    def finish_table(self, table: Document) -> None:
        """Called once on each table we created, after all its keys were set."""
        ...

    def after_set(self, parent: Document, key: str) -> None:
        """Called after ``parent[key]`` was set, to match the neighbours' layout."""
        ...


def plain(value: Any) -> Any:
    """A tomlkit item (or a JSON value) as plain Python data, for comparison and the state file."""
    if isinstance(value, (items.Item, tomlkit.TOMLDocument)):
        return value.unwrap()
    return value


def _json_object_pairs(text: str) -> Any:
    return json.loads(text, object_pairs_hook=dict)


class JsonFormat:
    """docker's daemon.json: key order and indentation kept, unknown keys untouched."""

    name = "json"

    def parse(self, text: str, path: str) -> Document:
        """Parse daemon.json; an empty file counts as ``{}``."""
        if not text.strip():
            return {}
        try:
            value = fileio.parse_bounded(_json_object_pairs, text, path)
        except fileio.NestingError as exc:
            raise EngineConfigError(f"cannot edit {path}: {exc}; it was left untouched") from exc
        except json.JSONDecodeError as exc:
            raise EngineConfigError(
                f"cannot edit {path}: it is not valid JSON (line {exc.lineno}, column "
                f"{exc.colno}: {exc.msg}); fix or move it first, it was left untouched"
            ) from exc
        if not isinstance(value, dict):
            raise EngineConfigError(
                f"cannot edit {path}: its top level is a {type(value).__name__}, "
                "docker expects a JSON object; it was left untouched"
            )
        return value

    def render(self, document: Document, original: str) -> str:
        """JSON with the original's indentation (4 spaces for a new file)."""
        indent: str | None = "    "
        match = re.search(r"^\{[ \t]*\r?\n([ \t]+)\S", original)
        if match:
            indent = match.group(1)
        elif original.strip() and "\n" not in original.strip():
            indent = None  # a one-line file stays one line
        text = json.dumps(document, indent=indent, ensure_ascii=False)
        if not original.strip() or original.endswith("\n"):
            text += "\n"
        return text

    def new_table(self) -> Document:
        """A new JSON object."""
        return {}

    def finish_table(self, table: Document) -> None:
        """Nothing to tidy in JSON."""

    def after_set(self, parent: Document, key: str) -> None:
        """json.dumps lays out every key alike."""


class TomlFormat:
    """containerd and CRI-O TOML, edited with tomlkit so comments and layout survive."""

    name = "toml"

    def parse(self, text: str, path: str) -> Document:
        """Parse TOML; errors name the file, line and column."""
        try:
            document: Document = fileio.parse_bounded(tomlkit.parse, text, path)
        except fileio.NestingError as exc:
            raise EngineConfigError(f"cannot edit {path}: {exc}; it was left untouched") from exc
        except tomlkit.exceptions.ParseError as exc:
            raise EngineConfigError(
                f"cannot edit {path}: it is not valid TOML (line {exc.line}, column {exc.col}: "
                f"{exc}); fix or move it first, it was left untouched"
            ) from exc
        return document

    def render(self, document: Document, original: str) -> str:
        """tomlkit's rendering: untouched parts come back byte for byte."""
        return tomlkit.dumps(document)

    def new_table(self) -> Document:
        """A table that renders as a super table (no ``[header]``) while it holds only tables."""
        return tomlkit.table()

    def finish_table(self, table: Document) -> None:
        """End a created leaf table with a blank line so the next header is not glued on."""
        if not isinstance(table, items.Table):
            return
        if any(isinstance(v, items.Table) for v in table.value.values()):
            return
        if len(table) and not table.is_super_table():
            table.add(tomlkit.nl())

    def after_set(self, parent: Document, key: str) -> None:
        """Indent a new key like the keys already in its table (tomlkit uses the header's)."""
        if not isinstance(parent, (items.Table, tomlkit.TOMLDocument)):
            return
        container = parent.value if isinstance(parent, items.Table) else parent
        new = container.item(key)
        if not isinstance(new, items.Item) or isinstance(new, (items.Table, items.AoT)):
            return
        for other_key, other in container.body:
            if (
                other_key is not None
                and other_key.key != key
                and not isinstance(other, (items.Table, items.AoT))
            ):
                new.trivia.indent = other.trivia.indent
                return


FORMATS: dict[str, DocumentFormat] = {"json": JsonFormat(), "toml": TomlFormat()}
