"""configure and unconfigure as transactions: plan, diff, back up, record, write, undo."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
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
) -> base.Change:
    """Make the edits ``editor`` plans for ``config_path``; a no-op when already configured."""
    if dry_run:
        return _configure(editor, config_path, options, host_root, dry_run=True)
    with storage.locked(config_path):
        return _configure(editor, config_path, options, host_root, dry_run=False)


def _configure(
    editor: base.RuntimeConfigEditor,
    config_path: str,
    options: base.RuntimeOptions,
    host_root: str,
    dry_run: bool,
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
    state: dict[str, Any] = old_state or {
        "version": storage.STATE_VERSION,
        "engine": editor.engine,
        "files": [],
    }
    entries = {entry["path"]: entry for entry in state["files"]}
    now = datetime.datetime.now()
    backups: dict[str, str] = {}
    for p in to_write:
        rel = _relative(state_dir, p.plan.path)
        entry = entries.get(rel)
        if entry is None:
            entry = {
                "path": rel,
                "format": p.plan.format,
                "created": p.before is None,
                "original": p.before,
                "exact": True,
                "changes": [],
                "backups": [],
            }
            state["files"].append(entry)
            entries[rel] = entry
        elif p.before is None or storage.sha256(p.before) != entry.get("written_sha256"):
            # Someone changed the file since we wrote it: the saved original no longer is
            # "this file minus our edits", so only a key-by-key revert stays correct.
            entry["exact"] = False
        if p.before is not None:
            backups[rel] = storage.backup_name(p.plan.path, p.plan.backup_dir, now)
            entry["backups"].append(_relative(state_dir, backups[rel]))
        entry["changes"].extend(p.records)
        entry["written_sha256"] = storage.sha256(p.after or "")

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
    log.info("configured %s in %s", editor.engine, config_path)
    return base.Change(editor.engine, "configure", files, diff, False, plan.notes)


def _file_change(p: _Pending, backup: str | None) -> base.FileChange:
    if not p.records:
        return base.FileChange(p.plan.path, "unchanged")
    action: Literal["created", "modified"] = "created" if p.before is None else "modified"
    paths = tuple(changes.dotted(r["path"]) for r in p.records)
    return base.FileChange(p.plan.path, action, changes.describe(p.records), backup, paths)


def _most_private(identities: list[os.stat_result | None]) -> os.stat_result | None:
    known = [i for i in identities if i is not None]
    return min(known, key=lambda i: bin(i.st_mode & 0o777).count("1"), default=None)


def unconfigure(
    engine: str, config_path: str, dry_run: bool = False, host_root: str = "/"
) -> base.Change:
    """Undo what configure recorded for ``config_path``: exactly when nobody else edited."""
    if dry_run:
        return _unconfigure(engine, config_path, dry_run=True, host_root=host_root)
    with storage.locked(config_path):
        return _unconfigure(engine, config_path, dry_run=False, host_root=host_root)


def _unconfigure(engine: str, config_path: str, dry_run: bool, host_root: str) -> base.Change:
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
    results: list[tuple[str, str | None, str | None, base.FileChange]] = []
    all_exact = True
    for entry in reversed(state["files"]):
        shown = os.path.join(state_dir, entry["path"])
        path = storage.target(shown, host_root)
        before = storage.read_text(path)
        if before is None:
            results.append((path, None, None, base.FileChange(shown, "unchanged")))
            continue
        fmt = formats.FORMATS[entry["format"]]
        paths = tuple(dict.fromkeys(changes.dotted(r["path"]) for r in entry["changes"]))
        keys = tuple(f"undid {path}" for path in paths)
        action: Literal["restored", "deleted", "modified", "unchanged"]
        if entry["exact"] and storage.sha256(before) == entry.get("written_sha256"):
            after = None if entry["created"] else entry["original"]
            action = "deleted" if after is None else "restored"
        else:
            all_exact = False
            document = fmt.parse(before, path)
            paths = tuple(changes.revert(document, entry["changes"]))
            keys = tuple(f"undid {path}" for path in paths)
            after = fmt.render(document, before)
            if entry["created"] and not formats.plain(document):
                after, action = None, "deleted"
            else:
                action = "modified" if after != before else "unchanged"
        results.append((path, before, after, base.FileChange(shown, action, keys, None, paths)))
    diff = "".join(storage.unified_diff(p, b, a) for p, b, a, _ in results)
    notes: list[str] = []
    if not all_exact:
        notes.append(
            "others edited these files since configure: removed only our keys, kept theirs"
        )
    if not dry_run:
        for path, before, after, change in results:
            if change.action != "unchanged" and before != after:
                storage.write(path, after)
                fileio.fault_point("unconfigure-wrote-file")
        backups = [os.path.join(state_dir, b) for e in state["files"] for b in e["backups"]]
        if all_exact:
            for backup in backups:  # identical to what is now live again
                storage.remove_quietly(backup)
        elif backups:
            notes.append("backups kept: " + ", ".join(backups))
        storage.save_state(config_path, None)
    files = tuple(change for _, _, _, change in reversed(results))
    return base.Change(engine, "unconfigure", files, diff, dry_run, tuple(notes))
