"""The verdict the Python wrapper leaves for the ``sh`` front: which runtimes a clean config names.

The front (:mod:`launcher`) cannot afford to read ``config.toml`` on every runc call, so the
wrapper, each time the front hands it a call, writes what it concluded from the config: the
config's path, whether it exists, its ``runtimes``, and the identity of the file it read
(device, inode, size, mtime and ctime, in nanoseconds). Python trusts its own verdict only
while all of that is unchanged. The front, which can fork nothing, compares what ``test`` can
see: the config's mtime must equal the recorded one to the nanosecond (against a stamp file
whose mtime Python set to it: neither ``-nt`` nor ``-ot``), and the verdict must be newer than
the config and than its directory (a file renamed into place -- dpkg, rpm, ``rsync -t``, tar
-- or any name created there changes the directory). So ``cp -p``, ``touch -d`` and a replaced
file with an older mtime all hand every call to Python until Python has read the config again.
What only the ctime and size would tell (the file rewritten in place and its mtime put back
to the very nanosecond, ``touch -r`` of a copy) the front cannot see; the packages remove the
verdict when they install a config. A config that does not load cleanly, a symlinked or
relative config path, or a runtime name on several lines leaves no verdict, so the front
always asks Python. Best effort: a verdict that cannot be written only costs speed. Standard
library only (it runs on the wrapper's pass-through path).

The verdict is a few ``sh`` variable assignments (every value single-quoted) that the front
reads with ``.``: ``dash`` reads a sourced file in one block, where its ``read`` builtin takes
one system call per byte (about 100 for the verdict, on every runc call). The front only
sources a regular file of its own user that is not a link, as it trusted the verdict before;
the file's name is new with format 2, so a format-1 verdict left by an older wrapper (plain
lines, not shell) is never sourced; a format-2 one (no identity) is sourced and not trusted.
"""

from __future__ import annotations

import os
import shlex
import stat

from enflame_gcu.errors import ConfigError
from enflame_gcu.shim import config as runtime_config

FORMAT = "enflame-container-runtime front verdict 3"
# Format 1 (plain lines) was kept in /var/run/enflame/runtime-front.verdict: never read now,
# removed with the package (packaging/deb/prerm, the rpm's %preun).
DEFAULT_VERDICT = "/var/run/enflame/runtime-front-verdict.sh"
STAMP_INFIX = ".m"  # <verdict>.m<mtime in ns>: a stamp whose own mtime is the config's
_MAX_BYTES = 1 << 16


def _identity(path: str) -> tuple[int, ...] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_BYTES)
    finally:
        os.close(fd)


def stamp_path(verdict: str, mtime_ns: int) -> str:
    """The stamp beside ``verdict`` whose mtime is ``mtime_ns`` (the config's, as read)."""
    return f"{verdict}{STAMP_INFIX}{mtime_ns}"


def render(
    config_path: str,
    state: str,
    runtimes: tuple[str, ...],
    identity: tuple[int, ...] | None = None,
    stamp: str = "",
) -> str | None:
    """The verdict's text, or None when the front could not use one for this config."""
    if (
        not os.path.isabs(config_path)
        or "\n" in config_path
        or os.path.realpath(config_path) != os.path.normpath(config_path)
        or not runtimes
        or any(not name or "\n" in name for name in runtimes)
        or (state == "present" and (identity is None or not stamp))
    ):
        return None
    names = "".join(f"{name}\n" for name in runtimes)
    shown = " ".join(str(field) for field in identity or ())
    return (
        f"# {FORMAT}: written by the Python wrapper, read by the sh front (shim.front)\n"
        f"_efr_format={shlex.quote(FORMAT)}\n"
        f"_efr_path={shlex.quote(config_path)}\n"
        f"_efr_state={shlex.quote(state)}\n"
        f"_efr_names={shlex.quote(names)}\n"
        f"_efr_identity={shlex.quote(shown)}\n"
        f"_efr_stamp={shlex.quote(stamp)}\n"
    )


def discard(verdict: str) -> None:
    """Remove the verdict (the config no longer loads cleanly): the front asks Python again."""
    # contextlib.suppress would cost an import on the wrapper's pass-through path.
    try:  # noqa: SIM105
        os.unlink(verdict)
    except OSError:
        pass


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _current(verdict: str, text: str, config_path: str, state: str, stamp: str) -> bool:
    """Whether the front would trust ``text`` at ``verdict`` now, as Python would."""
    if _read(verdict) != text.encode("utf-8", "surrogateescape"):
        return False
    if state == "absent":
        return True
    written, config = _mtime_ns(verdict), _mtime_ns(config_path)
    directory = _mtime_ns(os.path.dirname(config_path) + "/")
    try:
        info = os.lstat(stamp)
    except OSError:
        return False
    return (
        written is not None
        and config is not None
        and directory is not None
        and written > config
        and written > directory
        and stat.S_ISREG(info.st_mode)
        and info.st_mtime_ns == config
    )


def _write_stamp(verdict: str, mtime_ns: int) -> str:
    """The stamp for ``mtime_ns`` beside ``verdict`` (made once; others removed); OSError."""
    stamp = stamp_path(verdict, mtime_ns)
    try:
        info: os.stat_result | None = os.lstat(stamp)
    except FileNotFoundError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_mtime_ns != mtime_ns:
        temp = f"{stamp}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644)
        try:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
        os.replace(temp, stamp)
    directory, prefix = os.path.split(verdict)
    prefix += STAMP_INFIX
    mine = os.path.basename(stamp)
    for name in os.listdir(directory):
        if name.startswith(prefix) and name != mine and name[len(prefix) :].isdigit():
            discard(os.path.join(directory, name))  # an older config's stamp
    return stamp


def update(verdict: str, config: runtime_config.RuntimeConfig) -> None:
    """Leave the verdict for ``config`` (just loaded cleanly) unless it is already there."""
    path, explicit = runtime_config.config_path()
    state = "absent" if config.path is None and not explicit else "present"
    before = _identity(path) if state == "present" else None
    stamp = stamp_path(verdict, before[3]) if before is not None else ""
    text = render(path, state, config.runtimes, before, stamp)
    if text is None:
        discard(verdict)
        return
    if _current(verdict, text, path, state, stamp):
        return
    if state == "present":
        try:  # the front only ever trusts a regular file (not /dev/null, not a FIFO)
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            regular = False
        if not regular:
            discard(verdict)
            return
        # Read again after taking the file's identity: if the identity is the same after the
        # verdict is written, the verdict describes exactly this file.
        try:
            again = runtime_config.load(path)
        except ConfigError:
            discard(verdict)
            return
        text = render(path, state, again.runtimes, before, stamp)
        if text is None:
            discard(verdict)
            return
    directory = os.path.dirname(verdict)
    temp = f"{verdict}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        info = os.stat(directory)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return  # a directory others can write to: the front could be handed a forged file
        if before is not None:
            _write_stamp(verdict, before[3])
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            os.write(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        os.replace(temp, verdict)
    except OSError:
        discard(temp)
        return
    if _identity(path) != before or not _current(verdict, text, path, state, stamp):
        discard(verdict)  # the config changed meanwhile (or is newer than now): ask again
