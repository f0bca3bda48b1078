"""Atomic file writes and host-root path resolution shared by every writer in the project."""

from __future__ import annotations

import errno
import json
import os
import stat

from enflame_gcu.errors import PathOutsideRootError

# typing stays off the runtime's create path (it imports this module).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# As many links as Linux follows in one lookup (MAXSYMLINKS) before ELOOP.
MAX_SYMLINKS = 40
# A node's config files are kilobytes; a bigger one is refused, not read into memory.
MAX_CONFIG_BYTES = 16 << 20
# The deepest nesting any file of ours needs is under ten levels (a CDI spec's device nodes, a
# containerd runtime's options); a document nested deeper is refused, before anything walks it.
MAX_DEPTH = 64
NULL_DEVICE = os.makedev(1, 3)  # /dev/null on Linux
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _not_regular(path: str, mode: int) -> OSError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return OSError(errno.EINVAL, f"it is {kind}, not a regular file", path)


def read_regular(path: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed), at most ``limit`` of them;
    the null device reads as empty.

    A FIFO would block the reader forever and a device (``/dev/zero``) never ends: anything but
    a regular file is an OSError naming what it is, found before it is opened where possible
    (opening some devices acts on them) and checked again on the descriptor. So is a file over
    ``limit`` bytes (EFBIG). FileNotFoundError passes through as from ``open``.
    """
    info = os.stat(path)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE:
        return b""  # /dev/null names an empty file (its usual meaning); nothing to open
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)  # the path may have been swapped since the stat
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, info.st_mode)
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"it is larger than {limit} bytes", path)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, max(info.st_size - size, 0) + 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"it is larger than {limit} bytes", path)
    return b"".join(chunks)


class NestingError(ValueError):
    """A document nests arrays or objects deeper than :data:`MAX_DEPTH` (or the parser's stack)."""


def check_depth(value: object, source: str, limit: int = MAX_DEPTH) -> None:
    """Raise NestingError when ``value`` (parsed JSON, YAML or TOML) nests deeper than ``limit``.

    Walked with a stack of its own, so a deep document cannot exhaust Python's.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        if depth > limit:
            raise NestingError(f"{source} nests arrays or objects deeper than {limit} levels")
        pending.extend((child, depth + 1) for child in children)


def parse_bounded(parse: Callable[[Any], Any], text: Any, source: str) -> Any:
    """``parse(text)`` (a JSON, YAML or TOML parser) with the nesting capped at :data:`MAX_DEPTH`.

    A recursive parser fed ``[[[[...`` raises RecursionError (an error no caller expects and
    that kills a daemon); here it is a NestingError (a ValueError) naming ``source``.
    """
    try:
        value = parse(text)
    except RecursionError:
        raise NestingError(
            f"{source} nests arrays or objects too deeply to parse (limit {MAX_DEPTH})"
        ) from None
    check_depth(value, source)
    return value


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON text as Python values, nesting capped; ValueError (JSONDecodeError, NestingError)."""
    return parse_bounded(json.loads, text, source)


def read_json(path: str, limit: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON document in the regular file at ``path``: :func:`read_regular` then
    :func:`parse_json`. OSError for what is not a readable file, ValueError for what is not JSON
    (or nests too deeply), UnicodeDecodeError (a ValueError) for what is not UTF-8."""
    return parse_json(read_regular(path, limit), path)


def read_text(path: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the regular file at ``path`` (:func:`read_regular`, then decoded)."""
    return read_regular(path, limit).decode("utf-8")


def host_path(root: str, path: str) -> str:
    """Return ``path`` (absolute, as seen on the host) joined under ``root``, lexically.

    No symlink is looked at: cheap enough for discovery and the runtime, which read kernel
    trees (sysfs, /dev). Anything that reads or writes files an operator manages (engine
    configs, install targets, doctor) uses :func:`resolve`, which keeps links inside ``root``.
    """
    if not path.startswith("/"):
        raise ValueError(f"host path must be absolute, got {path!r}")
    if root in ("", "/"):
        return path
    return os.path.join(root, path.lstrip("/"))


def resolve(root: str, path: str, *, follow: bool = True) -> str:
    """``path`` (absolute, as the host sees it) as seen from here, every symlink kept in ``root``.

    ``root`` is a jail with chroot semantics: an absolute link target starts again at
    ``root`` (``/host/etc/docker -> /etc/docker`` means ``/host/etc/docker``, never this
    process's own ``/etc/docker``), and a ``..`` (in ``path`` or a link target) that would
    climb above ``root`` raises PathOutsideRootError instead of being followed. With
    ``follow=False`` the last component is not followed (to act on a link itself). Missing
    components are kept as written. With ``root`` ``/`` the answer is the host's own.
    """
    if not path.startswith("/"):
        raise ValueError(f"host path must be absolute, got {path!r}")
    if root in ("", "/"):
        if follow:
            return os.path.realpath(path)
        head, tail = os.path.split(os.path.normpath(path))
        return os.path.join(os.path.realpath(head), tail) if tail else head
    base = os.path.realpath(root)
    pending = [part for part in path.split("/") if part not in ("", ".")]
    done: list[str] = []
    links = 0
    missing = False
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not done:
                raise PathOutsideRootError(
                    f"{path} would lead out of the host root {root} (through '..'); refused"
                )
            done.pop()
            continue
        here = os.path.join(base, *done, part)
        if missing or (not pending and not follow) or not os.path.islink(here):
            # A missing component stays as written; so does everything after it.
            missing = missing or not os.path.lexists(here)
            done.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise PathOutsideRootError(
                f"{path} under the host root {root}: more than {MAX_SYMLINKS} symlinks "
                "(a loop?); refused"
            )
        target = os.readlink(here)
        if target.startswith("/"):
            done = []  # chroot semantics: an absolute target starts again at the root
        pending = [p for p in target.split("/") if p not in ("", ".")] + pending
    return os.path.join(base, *done)


def require_confined(root: str, paths: tuple[str, ...]) -> None:
    """Refuse a host root where the OS would follow one of ``paths`` out of it.

    For readers that join paths lexically (discovery reads sysfs and /dev with
    :func:`host_path`): a link such as ``/host/dev -> /dev`` would make them read this
    process's own files, so it is refused up front with a message instead.
    """
    if root in ("", "/"):
        return
    for path in paths:
        joined = host_path(root, path)
        if not os.path.lexists(joined):
            continue
        jailed = resolve(root, path)
        followed = os.path.realpath(joined)
        if followed != jailed:
            raise PathOutsideRootError(
                f"{path} under the host root {root} leads to {followed}, outside the root "
                f"(inside it, it would be {jailed}); refused: check the links in that path"
            )


def confine(root: str, local: str, *, follow: bool = True) -> str:
    """A path as seen from here, re-resolved by :func:`resolve` when it lies under ``root``.

    For paths given on a command line (``--config``): one under the host root is jailed like
    every host path; one outside it is this process's own and resolved as usual.
    """
    absolute = os.path.abspath(local)
    if root in ("", "/"):
        return resolve("/", absolute, follow=follow)
    for base in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))):
        if absolute == base or absolute.startswith(base.rstrip("/") + "/"):
            return resolve(root, "/" + os.path.relpath(absolute, base), follow=follow)
    return resolve("/", absolute, follow=follow)


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    # O_EXCL with a random name is what tempfile does; doing it here keeps tempfile (and the
    # random/shutil imports behind it) off the runtime shim's create path.
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a unique temporary file next to {name} in {directory}")


# A writer's temp file is this old at most while the write is under way; older is a crash's.
STALE_TEMP_SECONDS = 60.0


def remove_stale_temps(
    directory: str, prefixes: tuple[str, ...], older_than: float = STALE_TEMP_SECONDS
) -> list[str]:
    """Remove the temp files :func:`atomic_write` left in ``directory`` for files whose names
    start with one of ``prefixes`` (a writer killed between create and rename leaves one), when
    they are older than ``older_than`` seconds (a write under way keeps its own); the removed
    paths. Nothing else is touched: only regular files with our temp names.
    """
    import time  # noqa: PLC0415 - kept off the runtime's create path

    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        parts = name.split(".")
        if not (name.startswith(".") and name.endswith(".tmp") and len(parts) >= 4):
            continue
        stem, token = ".".join(parts[1:-2]), parts[-2]
        if len(token) != 12 or not set(token) <= set("0123456789abcdef"):
            continue
        if not stem.startswith(prefixes):
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime > older_than:
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def atomic_write(
    path: str,
    data: bytes,
    mode: int | None = None,
    durable: bool = True,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync and rename.

    Readers see either the old file or the new one, never a half-written one. The new file
    keeps the old file's permission bits and owner unless ``mode`` / ``owner`` (uid, gid) are
    given. ``durable=False`` skips the two fsyncs: still atomic for every reader, only not
    guaranteed to survive a power loss. ``path`` itself is replaced: callers that must keep a
    symlink pass its target (see :func:`resolve`). A symlink at ``path`` lends nothing: its
    target may lie anywhere (outside a host root, a file someone else owns), so the new file
    gets the defaults (0644, this process's owner) rather than the target's owner and mode.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if mode is None or owner is None:
        try:
            info: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode):
            info = None  # a link, or something that is not a file: nothing to keep
        if mode is None:
            mode = info.st_mode & 0o7777 if info is not None else 0o644
        if owner is None and info is not None:
            owner = (info.st_uid, info.st_gid)
    fd, tmp = _create_temp(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
            created = os.fstat(handle.fileno())
            # By fd, not by name: a name in the directory could be swapped for a link meanwhile.
            if owner is not None and owner != (created.st_uid, created.st_gid):
                os.fchown(handle.fileno(), owner[0], owner[1])
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:  # noqa: SIM105 - contextlib stays off the runtime's create path
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    # Plain try/except rather than contextlib: this module is on the runtime's create path.
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def replace_symlink(target: str, path: str) -> None:
    """Point the symlink ``path`` at ``target`` atomically: never a moment without the link."""
    temporary = f"{path}.enflame-tmp"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)


def atomic_write_text(path: str, text: str, mode: int | None = None) -> None:
    """Text flavour of :func:`atomic_write` (UTF-8)."""
    atomic_write(path, text.encode("utf-8"), mode)


# Test-only: the crash-safety tests kill the installer and the engine config editors here.
FAULT_ENV = "ENFLAME_TEST_KILL_AT"
_fault_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process at ``name`` when ``$ENFLAME_TEST_KILL_AT`` asks for it (tests only).

    ``ENFLAME_TEST_KILL_AT=NAME`` kills at the first pass through NAME, ``NAME:N`` at the
    N-th. Unset (always, outside the crash-safety tests) it costs one dictionary lookup.
    """
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point != name:
        return
    _fault_hits[name] = _fault_hits.get(name, 0) + 1
    if _fault_hits[name] >= int(count or 1):
        import signal  # noqa: PLC0415 - kept off the runtime's import path (signal pulls in enum)

        os.kill(os.getpid(), signal.SIGKILL)
