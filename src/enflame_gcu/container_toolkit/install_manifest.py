"""The record of what an install changed on a host, and undoing exactly that.

``<toolkit-dir>/install-manifest.json`` lists every change *before* it is made, so a crash at
any point leaves a record :func:`uninstall` can undo, and a second install adds only what is
missing. Undo never removes what someone else changed since: an edited config, a re-pointed
link or a non-empty directory is kept and reported.

One run (an :class:`InstallRun`) also knows what it found: the manifest as it was, and what
each path it replaced held before. :func:`undo_run` takes back only that run's changes (a
failed re-install, the DaemonSet's SIGTERM), so an install that was there before it survives.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.container_toolkit import cdi_service, engines
from enflame_gcu.container_toolkit.engines import reload as engine_reload
from enflame_gcu.errors import EnflameError, InstallError

MANIFEST_NAME = "install-manifest.json"
MANIFEST_VERSION = 1
# One layout (docs/packaging.md, "Where things go"): every install that is not a .deb or .rpm
# (install.sh, the bundle, the toolkit DaemonSet) under /opt/enflame-gcu; the packages own
# /usr/lib/enflame-gcu. Until 0.1 the DaemonSet used LEGACY_TOOLKIT_DIR.
DEFAULT_TOOLKIT_DIR = "/opt/enflame-gcu"
LEGACY_TOOLKIT_DIR = "/usr/local/enflame"

Action = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an install or uninstall did (or, in a dry run, would do), one line per change."""

    lines: tuple[str, ...]
    engines: tuple[str, ...] = ()
    mode: str | None = None  # the node mode installed (None: an install without --mode)


class InstallRun:
    """One install or uninstall: the host root, the manifest and the report lines."""

    def __init__(self, host_root: str, toolkit_dir: str, dry_run: bool) -> None:
        self.root, self.toolkit_dir, self.dry_run = host_root, toolkit_dir, dry_run
        self.manifest_path = self.local(os.path.join(toolkit_dir, MANIFEST_NAME))
        self.actions: list[Action] = []
        self.lines: list[str] = []
        self.verb = "would be " if dry_run else ""
        # What this run replaced, newest last: (path, how to put back what was there).
        self.journal: list[tuple[str, Callable[[], None]]] = []
        # Cleanups once the run is kept for good (e.g. the previous package tree).
        self.on_commit: list[Callable[[], None]] = []
        self._remembered: set[str] = set()
        # A dry run changes nothing, so it keeps what it would have made and removed, to plan
        # each later step as the real run meets it (a directory once, emptied dirs removed).
        self.planned_dirs: set[str] = set()
        self.planned_removals: set[str] = set()
        self.existed = False
        try:
            manifest = fileio.read_json(self.manifest_path)
            self.actions = list(manifest["actions"])
            self.existed = True
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InstallError(
                f"cannot read {self.manifest_path} (the record of a previous install): {exc}; "
                "fix or remove it by hand after checking what it lists"
            ) from exc
        self.baseline: list[Action] = copy.deepcopy(self.actions)

    def remember(self, host_path: str) -> None:
        """Before replacing ``host_path``: note what is there so :func:`undo_run` restores it."""
        if self.dry_run or host_path in self._remembered:
            return
        self._remembered.add(host_path)
        local = self.local(host_path)
        restore: Callable[[], None]
        if os.path.islink(local):
            target = os.readlink(local)

            def restore() -> None:
                fileio.replace_symlink(target, local)

        elif os.path.isfile(local):
            data = fileio.read_regular(local, _BACKUP_LIMIT)
            info = os.stat(local)

            def restore() -> None:
                fileio.atomic_write(local, data, info.st_mode & 0o7777, owner=_owner(info))

        elif not os.path.lexists(local):

            def restore() -> None:
                if os.path.islink(local) or os.path.isfile(local):
                    os.unlink(local)

        else:
            return
        self.journal.append((host_path, restore))

    def new_actions(self) -> list[Action]:
        """The actions this run recorded (not in the manifest it started from)."""
        return [a for a in self.actions if a not in self.baseline]

    def commit(self) -> None:
        """This run is kept: drop what only its undo needed."""
        for cleanup in self.on_commit:
            cleanup()
        self.on_commit.clear()
        self.journal.clear()

    def local(self, host_path: str, follow: bool = False) -> str:
        """``host_path`` as seen from here, resolved inside the host root (a jail).

        By default the last component is not followed: the installer creates, replaces and
        removes that entry itself (a link it made stays a link). ``follow=True`` to read it.
        """
        return fileio.resolve(self.root, host_path, follow=follow)

    def record(self, action: Action) -> None:
        """Add ``action`` to the manifest and save it before the change is made."""
        if action not in self.actions:
            self.actions.append(action)
        self.save()
        fileio.fault_point("install-recorded")

    def save(self) -> None:
        """Write the manifest (once its directory exists; until then it is kept in memory)."""
        if self.dry_run or not os.path.isdir(os.path.dirname(self.manifest_path)):
            return
        manifest = {"version": MANIFEST_VERSION, "toolkit_dir": self.toolkit_dir}
        manifest["actions"] = self.actions
        fileio.atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2) + "\n", 0o644)

    def make_dirs(self, host_path: str) -> None:
        """Create ``host_path`` and missing parents, recording each one we create."""
        missing = []
        path = host_path
        while (
            path != "/"
            and path not in self.planned_dirs
            and not os.path.isdir(self.local(path, follow=True))
        ):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            self.record({"kind": "dir", "path": path})
            if self.dry_run:
                self.planned_dirs.add(path)
            else:
                os.mkdir(self.local(path), 0o755)
            self.lines.append(f"{path}/ {self.verb}created")

    def host_view(self, text: str) -> str:
        """``text`` with paths as seen from here shown as the host sees them."""
        if self.root in ("", "/"):
            return text
        for base in dict.fromkeys((os.path.realpath(self.root), os.path.abspath(self.root))):
            text = text.replace(base.rstrip("/") + "/", "/")
        return text

    def make_toolkit_dir(self) -> None:
        """Create the toolkit dir (and missing parents) together with the manifest, atomically.

        Built under a temporary name next to the topmost missing directory, with the manifest
        that records it inside, then renamed into place: a crash leaves either nothing of it
        or a recorded tree (a leftover temporary tree is removed by the next run).
        """
        missing = []
        path = self.toolkit_dir
        while path != "/" and not os.path.isdir(self.local(path, follow=True)):
            missing.append(path)
            path = os.path.dirname(path)
        if self.dry_run or not missing:
            self.make_dirs(self.toolkit_dir)
            return
        missing.reverse()
        top = self.local(missing[0])
        staging = os.path.join(os.path.dirname(top), f".{os.path.basename(top)}.enflame-install")
        shutil.rmtree(staging, ignore_errors=True)
        for path in missing:
            inner = os.path.relpath(path, missing[0])
            os.mkdir(os.path.normpath(os.path.join(staging, inner)), 0o755)
            if {"kind": "dir", "path": path} not in self.actions:
                self.actions.append({"kind": "dir", "path": path})
            self.lines.append(f"{path}/ created")
        final = self.manifest_path
        self.manifest_path = os.path.join(
            staging, os.path.relpath(self.toolkit_dir, missing[0]), MANIFEST_NAME
        )
        try:
            self.save()
        finally:
            self.manifest_path = final
        fileio.fault_point("install-recorded")
        os.rename(staging, top)

    def find(self, kind: str, path: str) -> Action | None:
        """The recorded action of ``kind`` for ``path``, if this tool made it."""
        return next((a for a in self.actions if a["kind"] == kind and a["path"] == path), None)

    def refuse_foreign(self, kind: str, path: str, hint: str) -> None:
        """Never replace a file this tool did not make: say what is there instead."""
        local = self.local(path)
        if os.path.lexists(local) and self.find(kind, path) is None:
            what = f"a link to {os.readlink(local)}" if os.path.islink(local) else "a file"
            raise InstallError(
                f"cannot install {path}: {what} is already there and was not installed by "
                f"enflame-ctk install (no entry in {self.manifest_path}); {hint}"
            )


# What install replaces are scripts, configs and the runtime's launcher: kilobytes. A bigger
# file is not held in memory for the undo; the install stops and says so instead.
_BACKUP_LIMIT = 256 << 20


def _owner(info: os.stat_result) -> tuple[int, int]:
    return info.st_uid, info.st_gid


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _undo(run: InstallRun, action: Action, restart_engine: bool) -> None:
    """Undo one recorded action; anything changed by others since is kept and reported."""
    kind, path = action["kind"], action["path"]
    local = run.local(path)
    if kind == "engine":
        # Only the step this install wrote (manifests from before steps: everything recorded).
        # The config this install edited (k3s/RKE2: its template), as recorded.
        config = None if path == engines.default_config_path_of(action["engine"]) else local
        change = engines.unconfigure(
            action["engine"],
            config,
            host_root=run.root,
            dry_run=run.dry_run,
            step=action.get("step"),
        )
        run.lines.extend(run.host_view(change.describe()).splitlines())
        if run.dry_run:  # a drop-in it would delete leaves its directory empty
            run.planned_removals.update(
                run.host_view(f.path) for f in change.files if f.action == "deleted"
            )
        if restart_engine and change.changed:
            run.lines.append(
                f"{change.engine}: would be reloaded or restarted"
                if run.dry_run
                else engine_reload.reload_or_warn(change, run.root, _units(action))
            )
    elif kind == "symlink":
        if os.path.islink(local) and os.readlink(local) == action["target"]:
            _remove(run, path, os.unlink)
        elif os.path.lexists(local):
            run.lines.append(f"kept {path}: it no longer links to {action['target']}")
    elif kind == "file":
        if not os.path.lexists(local):
            return
        if action.get("keep_if_edited") and _sha256(run.local(path, True)) != action.get("sha256"):
            run.lines.append(f"kept {path}: edited since it was installed")
        else:
            _remove(run, path, os.unlink)
    elif kind == "unit":
        # A systemd service we installed: stopped and disabled before its file goes.
        if not os.path.lexists(local):
            return
        if not run.dry_run and cdi_service.usable(run.root):
            problem = cdi_service.systemctl(run.root, "disable", "--now", action["unit"])
            if problem:
                run.lines.append(f"could not stop {action['unit']}: {problem}")
        _remove(run, path, os.unlink)
        if not run.dry_run and cdi_service.usable(run.root):
            cdi_service.systemctl(run.root, "daemon-reload")
    elif kind == "moved":
        # A file someone else made, set aside so ours could take its name: put it back once
        # ours is gone (undone before this, being recorded after it).
        saved = run.local(action["saved"])
        if not os.path.lexists(saved):
            return
        if os.path.lexists(local) and path not in run.planned_removals:
            run.lines.append(f"kept {action['saved']}: {path} exists again; compare them by hand")
            return
        if not run.dry_run:
            os.rename(saved, local)
        run.lines.append(f"{path} {run.verb}put back (it was set aside as {action['saved']})")
    elif kind == "tree":
        for leftover in (local + ".new", local + ".old"):
            if not run.dry_run:
                shutil.rmtree(leftover, ignore_errors=True)
        if os.path.islink(local):  # install.sh's PREFIX/venv: a link into PREFIX/venvs/
            _remove(run, path, os.unlink)
        elif os.path.lexists(local):
            _remove(run, path + "/", shutil.rmtree)
    elif kind == "dir":
        if not os.path.isdir(local):
            return
        entries = [e for e in os.listdir(local) if f"{path}/{e}" not in run.planned_removals]
        if entries:
            run.lines.append(f"kept {path}/: not empty ({', '.join(sorted(entries)[:5])})")
        else:
            _remove(run, path + "/", os.rmdir)
    else:
        raise InstallError(f"{run.manifest_path} lists an unknown action kind {kind!r}")


def _units(action: Action) -> tuple[str, ...] | None:
    """The systemd units an engine action restarts (k3s/RKE2 record theirs); None: stock."""
    units = action.get("services")
    if isinstance(units, list) and units and all(isinstance(u, str) for u in units):
        return tuple(units)
    return None


def retire(run: InstallRun, action: Action, restart_engine: bool = False) -> None:
    """Undo one recorded action of an earlier install now, and drop it from the record.

    For a node-mode change: what the earlier mode installed and the new one must not keep.
    Dropped from the run's baseline too, since it is gone for good: a later failure of this
    run puts back this run's own changes, not the retired ones.
    """
    _undo(run, action, restart_engine)
    if run.dry_run:
        run.actions = [a for a in run.actions if a != action]
        return
    run.actions = [a for a in run.actions if a != action]
    run.baseline = [a for a in run.baseline if a != action]
    run.save()


def _remove(run: InstallRun, shown: str, remover: Callable[[str], object]) -> None:
    if run.dry_run:
        run.planned_removals.add(shown.rstrip("/"))
    else:
        remover(run.local(shown.rstrip("/") or "/"))
    run.lines.append(f"{shown} {run.verb}removed")


def uninstall(
    host_root: str = "/",
    toolkit_dir: str = DEFAULT_TOOLKIT_DIR,
    *,
    restart_engine: bool = False,
    dry_run: bool = False,
) -> Outcome:
    """Undo everything the manifest in ``toolkit_dir`` records, newest first; dirs go last."""
    run = InstallRun(host_root, toolkit_dir, dry_run)
    if not os.path.exists(run.manifest_path):
        return Outcome((f"nothing to undo: {run.manifest_path} does not exist",))
    undone_engines = tuple(a["engine"] for a in run.actions if a["kind"] == "engine")
    failed: list[Action] = []
    for action in reversed([a for a in run.actions if a["kind"] != "dir"]):
        try:
            _undo(run, action, restart_engine)
        except (OSError, EnflameError) as exc:
            failed.insert(0, action)
            run.lines.append(f"could not undo {action['kind']} {action['path']}: {exc}")
    dirs = [a for a in run.actions if a["kind"] == "dir"]
    if failed:
        # Keep what is left on record so a second uninstall can finish the job.
        run.actions = dirs + failed
        run.save()
        raise InstallError(
            "uninstall was incomplete:\n  "
            + "\n  ".join(run.lines)
            + f"\nthe rest is still recorded in {run.manifest_path}; fix the cause and re-run"
        )
    if dry_run:
        run.planned_removals.add(os.path.join(toolkit_dir, MANIFEST_NAME))
    else:
        os.unlink(run.manifest_path)
    for action in reversed(dirs):
        try:
            _undo(run, action, restart_engine)
        except OSError as exc:
            run.lines.append(f"kept {action['path']}/: {exc.strerror or exc}")
    return Outcome(tuple(run.lines), undone_engines)


def undo_run(run: InstallRun, restart_engine: bool = False) -> Outcome:
    """Take back only what ``run`` changed, newest first; what was there before it stays.

    Paths it replaced get their earlier content (or link target) back, what it added is
    removed, engine configs lose only the steps it wrote, and the manifest is as it found it.
    """
    if run.dry_run:
        return Outcome(())
    first = len(run.lines)
    for path, restore in reversed(run.journal):
        try:
            restore()
            run.lines.append(f"{path}: put back as it was before this run")
        except OSError as exc:
            run.lines.append(f"could not put back {path}: {exc.strerror or exc}")
    run.journal.clear()
    run.on_commit.clear()
    new = run.new_actions()
    failed: list[Action] = []
    for action in reversed([a for a in new if a["kind"] != "dir"]):
        _undo_quietly(run, action, restart_engine, failed)
    run.actions = copy.deepcopy(run.baseline) + failed
    if run.actions or run.existed:
        run.save()
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(run.manifest_path)
    for action in reversed([a for a in new if a["kind"] == "dir"]):
        _undo_quietly(run, action, restart_engine, failed)
    engines_undone = tuple(a["engine"] for a in new if a["kind"] == "engine")
    return Outcome(tuple(run.lines[first:]), engines_undone)


def _undo_quietly(
    run: InstallRun, action: Action, restart_engine: bool, failed: list[Action]
) -> None:
    try:
        _undo(run, action, restart_engine)
    except (OSError, EnflameError) as exc:
        failed.append(action)
        run.lines.append(f"could not undo {action['kind']} {action['path']}: {exc}")
