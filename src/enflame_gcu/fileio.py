"""Atomic file writes and host-root path resolution shared by every writer in the project."""

from __future__ import annotations

import os


def host_path(root: str, path: str) -> str:
    """Return ``path`` (absolute, as seen on the host) resolved under ``root``."""
    if not path.startswith("/"):
        raise ValueError(f"host path must be absolute, got {path!r}")
    if root in ("", "/"):
        return path
    return os.path.join(root, path.lstrip("/"))


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


def atomic_write(path: str, data: bytes, mode: int | None = None, durable: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync and rename.

    Readers see either the old file or the new one, never a half-written one. The new file
    keeps the old file's permission bits unless ``mode`` is given. ``durable=False`` skips the
    two fsyncs: still atomic for every reader, only not guaranteed to survive a power loss.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = _create_temp(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
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
