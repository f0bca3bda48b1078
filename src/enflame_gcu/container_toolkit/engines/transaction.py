"""configure and unconfigure as transactions: plan, diff, back up, record, write, undo."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import logging
import os
import uuid
from typing import Any, Literal

from enflame_gcu import fileio
from enflame_gcu.container_toolkit.engines import base, changes, formats, storage
from enflame_gcu.errors import EngineConfigError

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class _Pending:
    plan: base.FilePlan
    target: str  # the file really read and written: plan.path with its symlinks followed
    identity: os.stat_result | None
    before: str | None
    after: str | None
    records: list[changes.Record]


def _relative(state_dir: str, path: str) -> str:
    return os.path.relpath(os.path.abspath(path), state_dir)


def configure(
    editor: base.RuntimeConfigEditor,
    config_path: str,
    options: base.RuntimeOptions,
    host_root: str = "/",
    dry_run: bool = False,
    *,
    step: str | None = None,
) -> base.Change:
    """Make the edits ``editor`` plans for ``config_path``; a no-op when already configured.

    What is written is recorded as one step (named ``step``, else a random id, returned in
    ``Change.step``) that :func:`unconfigure` can undo on its own.
    """
    if dry_run:
        return _configure(editor, config_path, options, host_root, True, step=step)
    with storage.locked(config_path):
        return _configure(editor, config_path, options, host_root, False, step=step)


def _configure(
    editor: base.RuntimeConfigEditor,
    config_path: str,
    options: base.RuntimeOptions,
    host_root: str,
    dry_run: bool,
    *,
    step: str | None,
) -> base.Change:
    plan = editor.plan(config_path, options, host_root)
    pending: list[_Pending] = []
    for file_plan in plan.files:
        fmt = formats.FORMATS[file_plan.format]
        target = storage.target(file_plan.path, host_root)
        identity = storage.identity(target)
        before = storage.read_text(target)
        document = fmt.parse(before or "", file_plan.path)
        records = changes.apply(document, file_plan.operations, fmt, file_plan.path)
        after = fmt.render(document, before or "") if records else before
        pending.append(_Pending(file_plan, target, identity, before, after, records))
    diff = "".join(storage.unified_diff(p.plan.path, p.before, p.after) for p in pending)
    to_write = [p for p in pending if p.records]
    if dry_run or not to_write:
        files = tuple(_file_change(p, None) for p in pending)
        return base.Change(editor.engine, "configure", files, diff, dry_run, plan.notes)

    state_dir = os.path.dirname(os.path.abspath(config_path))
    old_state = storage.load_state(config_path)
    # A copy: on a failed write the old record is put back as it was.
    state: dict[str, Any] = (
        copy.deepcopy(old_state)
        if old_state
        else {
            "version": storage.STATE_VERSION,
            "engine": editor.engine,
            "files": [],
        }
    )
    entries = {entry["path"]: entry for entry in state["files"]}
    now = datetime.datetime.now()
    step_id = step or uuid.uuid4().hex[:16]
    backups: dict[str, str] = {}
    for p in to_write:
        rel = _relative(state_dir, p.plan.path)
        entry = entries.get(rel)
        if entry is None:
            entry = {"path": rel, "format": p.plan.format, "steps": []}
            state["files"].append(entry)
            entries[rel] = entry
        # Each configure is one step, undone on its own (an installer undoes only its run):
        # exactly (back to ``before``) while the file is still what it wrote, else key by key.
        record: dict[str, Any] = {
            "id": step_id,
            "before": p.before,
            "written_sha256": storage.sha256(p.after or ""),
            "changes": p.records,
            "backups": [],
        }
        if p.before is not None:
            backups[rel] = storage.backup_name(p.plan.path, p.plan.backup_dir, now)
            record["backups"].append(_relative(state_dir, backups[rel]))
        entry["steps"].append(record)

    # The state holds the originals: it gets the mode and owner of the most private one.
    like = _most_private([p.identity for p in pending])
    # The record goes first: a crash after it leaves a state that undoes to a no-op, while a
    # crash before it would leave edits nobody could undo exactly.
    storage.save_state(config_path, state, like)
    fileio.fault_point("configure-recorded")
    written: list[_Pending] = []
    try:
        for p in to_write:
            rel = _relative(state_dir, p.plan.path)
            if rel in backups and p.before is not None:
                storage.write(backups[rel], p.before, p.identity)
                fileio.fault_point("configure-backed-up")
            storage.write(p.target, p.after)
            written.append(p)
            fileio.fault_point("configure-wrote-file")
    except BaseException:
        for p in reversed(written):
            storage.write(p.target, p.before)
        for backup in backups.values():
            storage.remove_quietly(backup)
        storage.save_state(config_path, old_state, like)
        raise
    files = tuple(_file_change(p, backups.get(_relative(state_dir, p.plan.path))) for p in pending)
    log.info("configured %s in %s (step %s)", editor.engine, config_path, step_id)
    return base.Change(editor.engine, "configure", files, diff, False, plan.notes, step_id)


def _file_change(p: _Pending, backup: str | None) -> base.FileChange:
    if not p.records:
        return base.FileChange(p.plan.path, "unchanged")
    action: Literal["created", "modified"] = "created" if p.before is None else "modified"
    paths = tuple(changes.dotted(r["path"]) for r in p.records)
    return base.FileChange(
        p.plan.path, action, changes.describe(p.records, p.plan.format), backup, paths
    )


def _most_private(identities: list[os.stat_result | None]) -> os.stat_result | None:
    known = [i for i in identities if i is not None]
    return min(known, key=lambda i: bin(i.st_mode & 0o777).count("1"), default=None)


def unconfigure(
    engine: str,
    config_path: str,
    dry_run: bool = False,
    host_root: str = "/",
    *,
    step: str | None = None,
) -> base.Change:
    """Undo what configure recorded for ``config_path`` (only ``step`` when given).

    Each step is undone exactly (the file goes back to the bytes it had before that step)
    while the file is still what the step wrote, else key by key, keeping others' edits.
    """
    if dry_run:
        return _unconfigure(engine, config_path, True, host_root, step)
    if not os.path.isdir(os.path.dirname(os.path.abspath(config_path))):
        # No directory, so no state file beside the config: nothing recorded, nothing to lock
        # (the lock file would make the directory: the package's prerm, which unconfigures
        # every engine, left an empty /etc/crio on nodes without CRI-O).
        return _unconfigure(engine, config_path, False, host_root, step)
    with storage.locked(config_path):
        return _unconfigure(engine, config_path, False, host_root, step)


@dataclasses.dataclass(slots=True)
class _Undo:
    shown: str
    target: str
    before: str | None
    after: str | None
    undone: list[str]
    exact: bool
    keep: list[str]  # backups that no longer match anything live


def _undo_steps(entry: dict[str, Any], selected: list[dict[str, Any]], undo: _Undo) -> None:
    fmt = formats.FORMATS[entry["format"]]
    for record in reversed(selected):
        current = undo.after
        if current is None:
            undo.exact = undo.exact and record["before"] is None
            continue
        paths = [changes.dotted(r["path"]) for r in record["changes"]]
        if current == record["before"]:
            continue  # none of it is live (a configure killed before it wrote): nothing to undo
        if storage.sha256(current) == record["written_sha256"]:
            undo.after = record["before"]
            undo.undone.extend(p for p in paths if p not in undo.undone)
            continue
        undo.exact = False
        undo.keep.extend(record["backups"])
        document = fmt.parse(current, undo.shown)
        undo.undone.extend(p for p in changes.revert(document, record["changes"]))
        undo.after = fmt.render(document, current)
        if record["before"] is None and not formats.plain(document):
            undo.after = None  # a file this step created, empty again


def _unconfigure(
    engine: str, config_path: str, dry_run: bool, host_root: str, step: str | None
) -> base.Change:
    state = storage.load_state(config_path)
    if state is None:
        note = (
            f"nothing to undo: {storage.state_path(config_path)} does not exist, so configure "
            "made no change here that is still recorded"
        )
        return base.Change(engine, "unconfigure", (), "", dry_run, (note,))
    if state.get("engine") != engine:
        note = f"{storage.state_path(config_path)} records a {state.get('engine')} configuration"
        raise EngineConfigError(f"cannot unconfigure {engine} here: {note}")
    state_dir = os.path.dirname(os.path.abspath(config_path))
    undos: list[_Undo] = []
    backups: list[str] = []
    for entry in reversed(state["files"]):
        selected = [r for r in entry["steps"] if step is None or r["id"] == step]
        if not selected:
            continue
        shown = os.path.join(state_dir, entry["path"])
        target = storage.target(shown, host_root)
        before = storage.read_text(target)
        undo = _Undo(shown, target, before, before, [], True, [])
        _undo_steps(entry, selected, undo)
        undos.append(undo)
        if step is not None:
            newest = max(entry["steps"].index(r) for r in selected)
            later = [r["changes"] for r in entry["steps"][newest + 1 :]]
            changes.rebase([c for r in selected for c in r["changes"]], later)
        backups.extend(b for r in selected for b in r["backups"] if b not in undo.keep)
        entry["steps"] = [r for r in entry["steps"] if r not in selected]
    state["files"] = [entry for entry in state["files"] if entry["steps"]]
    diff = "".join(storage.unified_diff(u.shown, u.before, u.after) for u in undos)
    notes: list[str] = []
    if any(not u.exact for u in undos):
        notes.append(
            "others edited these files since configure: removed only our keys, kept theirs"
        )
    kept = [os.path.join(state_dir, b) for u in undos for b in u.keep]
    if kept:
        notes.append("backups kept: " + ", ".join(kept))
    if not dry_run:
        like = storage.identity(storage.target(config_path, host_root))
        for undo in undos:
            if undo.after != undo.before:
                storage.write(undo.target, undo.after)
                fileio.fault_point("unconfigure-wrote-file")
        for backup in backups:  # identical to what was live before its step, now undone
            storage.remove_quietly(os.path.join(state_dir, backup))
        storage.save_state(config_path, state if state["files"] else None, like)
    files = tuple(_file_change_undo(u) for u in reversed(undos))
    return base.Change(engine, "unconfigure", files, diff, dry_run, tuple(notes), step)


def _file_change_undo(undo: _Undo) -> base.FileChange:
    action: Literal["restored", "deleted", "modified", "unchanged"]
    if undo.after == undo.before:
        action = "unchanged"
    elif undo.after is None:
        action = "deleted"
    else:
        action = "restored" if undo.exact else "modified"
    keys = tuple(f"undid {path}" for path in undo.undone)
    return base.FileChange(undo.shown, action, keys, None, tuple(undo.undone))
