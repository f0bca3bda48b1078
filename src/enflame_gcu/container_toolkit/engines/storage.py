"""File plumbing for config edits: lock, read, backup, state file, diff and atomic writes."""

from __future__ import annotations

import contextlib
import datetime
import difflib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.errors import EngineConfigError

log = logging.getLogger(__name__)

STATE_SUFFIX = ".enflame-state.json"
LOCK_SUFFIX = ".enflame.lock"
BACKUP_INFIX = ".enflame-backup-"
# 2: every configure is a step of its own (undone alone); 1 kept one list of changes per file.
STATE_VERSION = 2


def sha256(text: str) -> str:
    """Hex digest of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def state_path(config_path: str) -> str:
    """Where configure records what it did to ``config_path`` (and its drop-ins)."""
    return config_path + STATE_SUFFIX


def _os_error(doing: str, path: str, exc: OSError) -> EngineConfigError:
    reason = exc.strerror or str(exc)
    return EngineConfigError(f"cannot {doing} {path}: {reason}; nothing was changed")


def target(path: str, host_root: str = "/") -> str:
    """The file to read and write for ``path``: symlinks followed, inside ``host_root``.

    Writing the target keeps an engine config that is a symlink a symlink; following the
    link inside the host root keeps ``/host/etc/docker -> /etc/docker`` on the host.
    """
    return fileio.confine(host_root, path)


def identity(path: str) -> os.stat_result | None:
    """The stat of ``path`` (mode and owner to give its backups), None when it is missing."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error("read", path, exc) from exc


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist; a FIFO, device or huge file is refused."""
    try:
        return fileio.read_regular(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise EngineConfigError(f"cannot edit {path}: it is not UTF-8 text ({exc})") from exc
    except OSError as exc:
        raise _os_error("read", path, exc) from exc


@contextlib.contextmanager
def locked(config_path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``<config>.enflame.lock`` so concurrent runs go one by one.

    The lock file is removed on release; a waiter that then finds its inode unlinked simply
    takes the lock again on the new file, so removing it is safe.
    """
    lock_path = config_path + LOCK_SUFFIX
    directory = os.path.dirname(os.path.abspath(lock_path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise _os_error("create the directory for", config_path, exc) from exc
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _os_error("create the lock file", lock_path, exc) from exc
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


def load_state(config_path: str) -> dict[str, Any] | None:
    """The recorded state for ``config_path``, or None when configure never ran on it."""
    path = state_path(config_path)
    text = read_text(path)
    if text is None:
        return None
    try:
        state = fileio.parse_json(text, path)
    except ValueError as exc:
        raise EngineConfigError(
            f"cannot read {path} (the record of what configure changed): {exc}; "
            "remove it only if you have undone the changes by hand"
        ) from exc
    if isinstance(state, dict) and state.get("version") == 1:
        return _from_version_1(state)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise EngineConfigError(
            f"{path} is not a state file (version 1 or {STATE_VERSION}) this tool can read"
        )
    return state


def _from_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """A version 1 record as one step per file: exact only if it was exact then."""
    files = []
    for entry in state["files"]:
        step = {
            "id": "v1",
            "before": entry["original"],
            "written_sha256": entry.get("written_sha256") if entry.get("exact") else None,
            "changes": entry["changes"],
            "backups": entry["backups"],
        }
        files.append({"path": entry["path"], "format": entry["format"], "steps": [step]})
    return {"version": STATE_VERSION, "engine": state.get("engine"), "files": files}


def save_state(
    config_path: str, state: dict[str, Any] | None, like: os.stat_result | None = None
) -> None:
    """Write (or, for None, remove) the state file atomically.

    It holds the original text of the config, so it gets the config's mode and owner
    (``like``); without one (a config we create) it is root's alone, 0600.
    """
    path = state_path(config_path)
    try:
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        else:
            data = (json.dumps(state, indent=2) + "\n").encode("utf-8")
            mode, owner = _mode_owner(like, 0o600)
            fileio.atomic_write(path, data, mode, owner=owner)
    except OSError as exc:
        raise _os_error("write", path, exc) from exc


def _mode_owner(
    like: os.stat_result | None, default_mode: int
) -> tuple[int, tuple[int, int] | None]:
    if like is None:
        return default_mode, (os.geteuid(), os.getegid())
    return like.st_mode & 0o7777, (like.st_uid, like.st_gid)


def backup_name(path: str, backup_dir: str | None, now: datetime.datetime) -> str:
    """A not-yet-existing timestamped backup path for ``path``."""
    directory = backup_dir or os.path.dirname(os.path.abspath(path))
    stem = os.path.join(
        directory, os.path.basename(path) + BACKUP_INFIX + now.strftime("%Y%m%dT%H%M%S")
    )
    candidate, counter = stem, 1
    while os.path.lexists(candidate):
        counter += 1
        candidate = f"{stem}.{counter}"
    return candidate


def write(path: str, text: str | None, like: os.stat_result | None = None) -> None:
    """Atomically write ``text`` to ``path``, or remove ``path`` for None.

    ``like`` gives the mode and owner (a backup gets its original's); without it an existing
    file keeps its own and a new one is 0644.
    """
    try:
        if text is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if like is None:
            fileio.atomic_write_text(path, text)
        else:
            mode, owner = _mode_owner(like, 0o600)
            fileio.atomic_write(path, text.encode("utf-8"), mode, owner=owner)
    except OSError as exc:
        raise _os_error("write", path, exc) from exc


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    """A unified diff of one file (``/dev/null`` for a missing side)."""
    return "".join(
        difflib.unified_diff(
            (before or "").splitlines(keepends=True),
            (after or "").splitlines(keepends=True),
            fromfile=path if before is not None else "/dev/null",
            tofile=path if after is not None else "/dev/null",
        )
    )


def remove_quietly(path: str) -> None:
    """Remove a file we own; failure is only logged (it is a leftover, not a corruption)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
