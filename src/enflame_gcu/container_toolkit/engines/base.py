"""Values and the Protocol shared by the docker, containerd and CRI-O config editors."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol

DEFAULT_RUNTIME_NAME = "enflame"
DEFAULT_RUNTIME_PATH = "/usr/bin/enflame-container-runtime"

Format = Literal["json", "toml"]


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """What ``runtime configure`` should set up in an engine's config."""

    runtime_name: str = DEFAULT_RUNTIME_NAME
    runtime_path: str = DEFAULT_RUNTIME_PATH
    set_as_default: bool = False
    cdi: bool = False
    drop_in: bool = False
    # The device plugin answers with CDI annotations (its cdi-annotations strategy): containerd
    # 1.x must pass the container's cdi.k8s.io/* annotations on to the runtime.
    cdi_annotations: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SetValue:
    """Set the value at ``path``; with ``only_if_missing`` an existing value wins."""

    path: tuple[str, ...]
    value: Any
    only_if_missing: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class AppendItem:
    """Make sure the list at ``path`` contains ``item`` (creating the list if needed)."""

    path: tuple[str, ...]
    item: Any


Operation = SetValue | AppendItem


@dataclasses.dataclass(frozen=True, slots=True)
class FilePlan:
    """The operations one config file needs; ``backup_dir`` overrides where backups go."""

    path: str
    format: Format
    operations: tuple[Operation, ...]
    # Drop-in directories are read file by file by the engines, so backups must live elsewhere.
    backup_dir: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """Everything one ``configure`` wants to do, plus notes for the operator."""

    files: tuple[FilePlan, ...]
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class FileChange:
    """What happened (or, in a dry run, would happen) to one file."""

    path: str
    action: Literal["created", "modified", "restored", "deleted", "unchanged"]
    keys: tuple[str, ...] = ()
    backup: str | None = None
    # Dotted names of the keys touched, e.g. ``runtimes.enflame.path``.
    paths: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """The outcome of a configure or unconfigure run."""

    engine: str
    operation: Literal["configure", "unconfigure"]
    files: tuple[FileChange, ...]
    diff: str
    dry_run: bool
    notes: tuple[str, ...] = ()
    # The recorded step this configure wrote (None when nothing was written); unconfigure
    # with it undoes only that step.
    step: str | None = None

    @property
    def changed(self) -> bool:
        """True when at least one file was (or would be) written or removed."""
        return any(f.action != "unchanged" for f in self.files)

    @property
    def paths(self) -> tuple[str, ...]:
        """Dotted names of every key added, replaced or removed, over all files."""
        return tuple(path for f in self.files for path in f.paths)

    def describe(self) -> str:
        """Human-readable summary: one line per file and key, then the notes."""
        verb = "would be" if self.dry_run else "was"
        lines = []
        for f in self.files:
            if f.action == "unchanged":
                lines.append(f"{f.path}: already up to date, nothing written")
                continue
            backup = f" (backup: {f.backup})" if f.backup else ""
            lines.append(f"{f.path} {verb} {f.action}{backup}")
            lines.extend(f"  {key}" for key in f.keys)
        if not self.files:
            lines.append(f"{self.engine}: nothing to do")
        lines.extend(self.notes)
        return "\n".join(lines)


class RuntimeConfigEditor(Protocol):
    """One container engine: where its config lives and what configure must change there."""

    engine: str
    default_config: str

    def plan(self, config_path: str, options: RuntimeOptions, host_root: str) -> Plan:
        """Read the engine's config(s) under ``config_path`` and return the edits to make."""
        ...


def leaf_operations(prefix: tuple[str, ...], values: Mapping[str, Any]) -> Iterator[SetValue]:
    """Flatten a table into per-key SetValue operations, scalars before sub-tables.

    Setting leaves rather than whole tables keeps keys an operator added to our entry, and
    lets unconfigure remove exactly the keys we added.
    """
    tables = []
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            tables.append((key, value))
        else:
            yield SetValue((*prefix, key), value)
    for key, value in tables:
        yield from leaf_operations((*prefix, key), value)


def lookup(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path`` in nested mappings, or None when any part is missing."""
    node: Any = document
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def host_view_text(text: str, host_root: str) -> str:
    """``text`` (a report, a diff) with paths under ``host_root`` shown as the host sees them."""
    if host_root in ("", "/"):
        return text
    for prefix in dict.fromkeys((os.path.realpath(host_root), os.path.abspath(host_root))):
        text = text.replace(prefix.rstrip("/") + "/", "/")
    return text


def host_view(path: str, host_root: str) -> str:
    """``path`` as the host sees it, when this process sees the host under ``host_root``."""
    if host_root in ("", "/"):
        return path
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(host_root))
    if rel.startswith(".."):
        return path
    return "/" + rel
