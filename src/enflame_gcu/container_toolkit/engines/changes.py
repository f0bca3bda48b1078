"""Apply plan operations to a parsed config, recording each change so it can be undone."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from enflame_gcu.container_toolkit.engines import base, formats
from enflame_gcu.errors import EngineConfigError

# A record is plain JSON so it can live in the state file:
#   {"op": "create", "path": [...]}                  an intermediate table we created
#   {"op": "add", "path": [...], "new": v}           a key that did not exist
#   {"op": "replace", "path": [...], "old": v, "new": v}
#   {"op": "append", "path": [...], "item": v}       an item added to an existing list
Record = dict[str, Any]


def dotted(path: Sequence[str]) -> str:
    """``a.b."c.d"`` style name of a key path, for messages."""
    return ".".join(f'"{key}"' if "." in key else key for key in path)


def _parent(
    document: formats.Document,
    *,
    path: tuple[str, ...],
    fmt: formats.DocumentFormat,
    records: list[Record],
    created: list[formats.Document],
    where: str,
) -> formats.Document:
    node: formats.Document = document
    for depth, key in enumerate(path):
        if key not in node:
            node[key] = fmt.new_table()
            records.append({"op": "create", "path": list(path[: depth + 1])})
            created.append(node[key])
        child = node[key]
        if not isinstance(child, MutableMapping):
            raise EngineConfigError(
                f"cannot edit {where}: {dotted(path[: depth + 1])} is a "
                f"{type(formats.plain(child)).__name__}, expected a table; it was left untouched"
            )
        node = child
    return node


def apply(
    document: formats.Document,
    operations: Sequence[base.Operation],
    fmt: formats.DocumentFormat,
    where: str,
) -> list[Record]:
    """Apply ``operations`` in place; return records of what actually changed (maybe none)."""
    records: list[Record] = []
    created: list[formats.Document] = []
    for operation in operations:
        parent = _parent(
            document,
            path=operation.path[:-1],
            fmt=fmt,
            records=records,
            created=created,
            where=where,
        )
        key = operation.path[-1]
        path = list(operation.path)
        if isinstance(operation, base.SetValue):
            if key in parent:
                current = formats.plain(parent[key])
                if current == operation.value or operation.only_if_missing:
                    continue
                records.append(
                    {"op": "replace", "path": path, "old": current, "new": operation.value}
                )
            else:
                records.append({"op": "add", "path": path, "new": operation.value})
            parent[key] = copy.deepcopy(operation.value)
            fmt.after_set(parent, key)
        elif key not in parent:
            parent[key] = [operation.item]
            fmt.after_set(parent, key)
            records.append({"op": "add", "path": path, "new": [operation.item]})
        else:
            current = formats.plain(parent[key])
            if not isinstance(current, list):
                raise EngineConfigError(
                    f"cannot edit {where}: {dotted(operation.path)} is a "
                    f"{type(current).__name__}, expected a list; it was left untouched"
                )
            if operation.item in current:
                continue
            parent[key].append(operation.item)
            records.append({"op": "append", "path": path, "item": operation.item})
    for table in reversed(created):
        fmt.finish_table(table)
    return records


def _get_parent(document: formats.Document, path: Sequence[str]) -> MutableMapping[str, Any] | None:
    node: Any = document
    for key in path[:-1]:
        if not isinstance(node, MutableMapping) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, MutableMapping) else None


def revert(document: formats.Document, records: Sequence[Record]) -> list[str]:
    """Undo ``records`` (newest first) in place, keeping edits others made; return changed keys.

    Keys we added are removed while they still hold what we wrote; a value we replaced is put
    back only if it still holds what we wrote; a table we created is removed only once it is
    empty; a list item we appended is removed from the list.
    """
    undone: list[str] = []
    for record in reversed(records):
        path = record["path"]
        parent = _get_parent(document, path)
        key = path[-1]
        if parent is None or key not in parent:
            continue
        current = formats.plain(parent[key])
        op = record["op"]
        if op == "add":
            if current != record["new"]:
                continue  # changed after us (by someone, or a later configure): keep it
            del parent[key]
        elif op == "create":
            if isinstance(current, Mapping) and not current:
                del parent[key]
            else:
                continue
        elif op == "replace":
            if current != record["new"]:
                continue  # someone changed it after us: theirs wins
            parent[key] = copy.deepcopy(record["old"])
        elif op == "append":
            if not isinstance(current, list) or record["item"] not in current:
                continue
            del parent[key][current.index(record["item"])]
        undone.append(dotted(path))
    return undone


def literal(value: Any, syntax: str = "toml") -> str:
    """``value`` as the file's own syntax writes it (``toml`` or ``json``): the report shows
    ``true`` and ``""``, as the user will read them in the file, not Python's ``True``, ``''``."""
    if syntax == "json":
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes
    if isinstance(value, Mapping):
        items = ", ".join(f"{_toml_key(k)} = {literal(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return json.dumps(str(value))


def _toml_key(key: object) -> str:
    text = str(key)
    bare = bool(text) and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)
    return text if bare else json.dumps(text, ensure_ascii=False)


def describe(records: Sequence[Record], syntax: str = "toml") -> tuple[str, ...]:
    """One line per recorded change, for the CLI's report, values in the file's syntax."""
    lines = []
    for record in records:
        name = dotted(record["path"])
        if record["op"] == "add":
            lines.append(f"added {name} = {literal(record['new'], syntax)}")
        elif record["op"] == "replace":
            new, old = literal(record["new"], syntax), literal(record["old"], syntax)
            lines.append(f"set {name} = {new} (was {old})")
        elif record["op"] == "append":
            lines.append(f"appended {literal(record['item'], syntax)} to {name}")
    return tuple(lines)


def rebase(undone: Sequence[Record], newer: Sequence[list[Record]]) -> None:
    """After ``undone`` was reverted out of order, make the ``newer`` steps' records true again.

    A newer step that replaced a value the undone step had added now owns a key that did not
    exist before it (an add); one that replaced a value the undone step had replaced takes over
    the older value. Tables the undone step created pass to the next step, which removes them
    once they are empty.
    """
    if not newer:
        return
    # In their order, ahead of the step's own records: reverted last, outermost last.
    newer[0][:0] = [copy.deepcopy(r) for r in undone if r["op"] == "create"]
    for record in undone:
        path = record["path"]
        if record["op"] == "create":
            continue
        for changes_ in newer:
            match = next((n for n in changes_ if n["path"] == path), None)
            if match is None:
                continue
            if match["op"] == "replace" and record["op"] == "add":
                new = match["new"]
                match.clear()
                match.update({"op": "add", "path": path, "new": new})
            elif match["op"] == "replace" and record["op"] == "replace":
                match["old"] = copy.deepcopy(record["old"])
            break
