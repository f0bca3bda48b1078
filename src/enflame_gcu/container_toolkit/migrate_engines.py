"""topscloud's runtime entries in docker's, containerd's and CRI-O's configs, adopted as ours.

The vendor's installer (or an operator following its manual) wrote an ``enflame`` runtime, often
as the default, with no record of ours. :func:`find` names every such entry that our state
does not already cover; :func:`adopt` records them as one configure step (:data:`STEP`) whose
``before`` is the file without them, so ``runtime unconfigure`` (or an install whose mode wants
no wrapper) removes them exactly, by the engines' own transaction (no second editor). Adopting
writes a backup and the state file; it changes no engine config.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import os
from collections.abc import Mapping
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.engines import (
    base,
    changes,
    containerd,
    crio,
    formats,
    hosts,
    storage,
)
from enflame_gcu.errors import EngineConfigError

STEP = "topscloud"
RUNTIME_BINARY = "enflame-container-runtime"


@dataclasses.dataclass(frozen=True, slots=True)
class Foreign:
    """The Enflame runtime entries of one config file that no state of ours records."""

    engine: str
    config: str  # the engine's main config (where its state lives), as seen from here
    file: str  # the file holding the entries (the main config or a drop-in)
    format: base.Format
    text: str
    records: tuple[changes.Record, ...]  # as a configure that had added them would record

    def describe(self) -> tuple[str, ...]:
        """One line per entry."""
        return tuple(
            f"{changes.dotted(r['path'])} = {changes.literal(r['new'], self.format)}"
            for r in self.records
            if "new" in r
        )


def _ours(binary: Any) -> bool:
    return isinstance(binary, str) and os.path.basename(binary) == RUNTIME_BINARY


def _runtime_records(
    document: Mapping[str, Any],
    table: tuple[str, ...],
    binary_of: Any,
    default_key: tuple[str, ...] | None,
    default_was: str | None,
) -> list[changes.Record]:
    runtimes = formats.plain(base.lookup(document, table))
    if not isinstance(runtimes, dict):
        return []
    names = [n for n, e in runtimes.items() if isinstance(e, dict) and _ours(binary_of(e))]
    if not names:
        return []
    records: list[changes.Record] = []
    if len(names) == len(runtimes):  # the table holds nothing else: it goes with them
        records.append({"op": "create", "path": list(table)})
    records += [{"op": "add", "path": [*table, n], "new": runtimes[n]} for n in names]
    default = formats.plain(base.lookup(document, default_key)) if default_key else None
    if default_key is not None and default in names:
        if default_was is None:
            records.append({"op": "add", "path": list(default_key), "new": default})
        else:
            records.append(
                {"op": "replace", "path": list(default_key), "old": default_was, "new": default}
            )
    return records


def _docker(document: Mapping[str, Any]) -> list[changes.Record]:
    return _runtime_records(
        document, ("runtimes",), lambda e: e.get("path"), ("default-runtime",), None
    )


def _containerd(document: Mapping[str, Any], where: str) -> list[changes.Record]:
    cri = (*containerd.CRI_TABLE[containerd.config_version(document, where)], "containerd")
    runtimes = formats.plain(base.lookup(document, (*cri, "runtimes"))) or {}
    # containerd's own default when the key is back to runc (its stock config names it).
    was = "runc" if isinstance(runtimes, dict) and "runc" in runtimes else None
    return _runtime_records(
        document,
        (*cri, "runtimes"),
        lambda e: (e.get("options") or {}).get("BinaryName"),
        (*cri, "default_runtime_name"),
        was,
    )


def _crio(document: Mapping[str, Any]) -> list[changes.Record]:
    return _runtime_records(
        document,
        ("crio", "runtime", "runtimes"),
        lambda e: e.get("runtime_path"),
        ("crio", "runtime", "default_runtime"),
        None,
    )


def _recorded(state: Mapping[str, Any] | None, rel: str) -> list[list[str]]:
    """Key paths our state already records for the file ``rel`` (relative to the state)."""
    if not state:
        return []
    return [
        list(record["path"])
        for entry in state.get("files", ())
        if entry.get("path") == rel
        for step in entry.get("steps", ())
        for record in step.get("changes", ())
    ]


def _covered(path: list[str], recorded: list[list[str]]) -> bool:
    return any(r[: len(path)] == path or path[: len(r)] == r for r in recorded)


def _files(engine: str, config: str, root: str) -> list[str]:
    if engine != "crio":
        return [config]
    drop_ins = storage.target(crio.drop_in_dir(config), root)
    return [config, *sorted(glob.glob(os.path.join(drop_ins, "*.toml")))]


def find(root: str, site: hosts.ContainerdSite | None = None) -> list[Foreign]:
    """Every file under ``root`` with Enflame runtime entries our state does not record."""
    found = []
    for engine in hosts.detect(root, site):
        config = config_of(root, engine, site)
        state = storage.load_state(config)
        for file in _files(engine, config, root):
            text = storage.read_text(storage.target(file, root))
            if text is None:
                continue
            fmt: base.Format = "json" if engine == "docker" else "toml"
            document = formats.FORMATS[fmt].parse(text, file)
            if engine == "docker":
                records = _docker(document)
            elif engine == "containerd":
                records = _containerd(document, file)
            else:
                records = _crio(document)
            rel = os.path.relpath(file, os.path.dirname(config))
            recorded = _recorded(state, rel)
            records = [r for r in records if not _covered(r["path"], recorded)]
            if any(r["op"] != "create" for r in records):
                found.append(Foreign(engine, config, file, fmt, text, tuple(records)))
    return found


def config_of(root: str, engine: str, site: hosts.ContainerdSite | None = None) -> str:
    """``engine``'s main config under ``root`` (containerd's: the site's, k3s/RKE2 included)."""
    path = hosts.DEFAULT_CONFIGS[engine]
    if engine == "containerd" and site is not None:
        path = site.config
    return fileio.resolve(root, path, follow=False)


def _leaves(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_leaves(v) for v in value.values())
    return True


def adopt(foreign: Foreign, root: str, now: datetime.datetime | None = None) -> str:
    """Record ``foreign``'s entries as step :data:`STEP` of the engine's state; back the file
    up first. Returns the backup's path. The config itself is not written. EngineConfigError
    when the file changed since it was read (nothing recorded then)."""
    fmt = formats.FORMATS[foreign.format]
    document = fmt.parse(foreign.text, foreign.file)
    changes.revert(document, list(foreign.records))
    before: str | None = fmt.render(document, foreign.text)
    if foreign.file != foreign.config and not _leaves(formats.plain(document)):
        before = None  # a drop-in that held only the vendor's entries: undone, it goes
    state_dir = os.path.dirname(os.path.abspath(foreign.config))
    backup_dir = state_dir if foreign.file != foreign.config else None
    with storage.locked(foreign.config):
        target = storage.target(foreign.file, root)
        if storage.read_text(target) != foreign.text:
            raise EngineConfigError(
                f"{foreign.file} changed while migrating; nothing was adopted: run migrate again"
            )
        identity = storage.identity(target)
        backup = storage.backup_name(foreign.file, backup_dir, now or datetime.datetime.now())
        storage.write(backup, foreign.text, identity)
        state = storage.load_state(foreign.config) or {
            "version": storage.STATE_VERSION,
            "engine": foreign.engine,
            "files": [],
        }
        if state.get("engine") != foreign.engine:
            storage.remove_quietly(backup)
            raise EngineConfigError(
                f"{storage.state_path(foreign.config)} records a {state.get('engine')} "
                f"configuration, not {foreign.engine}; nothing was adopted"
            )
        rel = os.path.relpath(os.path.abspath(foreign.file), state_dir)
        entry = next((e for e in state["files"] if e["path"] == rel), None)
        if entry is None:
            entry = {"path": rel, "format": foreign.format, "steps": []}
            state["files"].append(entry)
        # First: undone last, after every step of ours written on top of the vendor's file.
        entry["steps"].insert(
            0,
            {
                "id": STEP,
                "before": before,
                "written_sha256": storage.sha256(foreign.text),
                "changes": list(foreign.records),
                # Not the step's: an undo removes a step's backups as identical to what it
                # restores, while this one holds the vendor's entries: it stays, for good.
                "backups": [],
            },
        )
        storage.save_state(foreign.config, state, identity)
    return backup


def adopted(root: str, engine: str, site: hosts.ContainerdSite | None = None) -> str | None:
    """The config whose state holds an adopted step for ``engine``; None when none does."""
    config = config_of(root, engine, site)
    state = storage.load_state(config)
    steps = [s for e in (state or {}).get("files", ()) for s in e.get("steps", ())]
    return config if any(s.get("id") == STEP for s in steps) else None
