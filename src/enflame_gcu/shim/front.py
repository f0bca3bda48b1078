"""The verdict the Python wrapper leaves for the ``sh`` front: which runtimes a clean config names.

The front (:mod:`launcher`) cannot afford to read ``config.toml`` on every runc call, so the
wrapper, each time the front hands it a call, writes what it concluded from the config: the
config's path, whether it exists, and its ``runtimes``. The front uses that only while the
verdict file is newer than the config; any edit of the config makes the front hand every call
to Python until Python has read the new config and written a new verdict. A config that does
not load cleanly, a symlinked or relative config path, or a runtime name on several lines
leaves no verdict, so the front always asks Python. Best effort: a verdict that cannot be
written only costs speed. Standard library only (it runs on the wrapper's pass-through path).

The verdict is a few ``sh`` variable assignments (every value single-quoted) that the front
reads with ``.``: ``dash`` reads a sourced file in one block, where its ``read`` builtin takes
one system call per byte (about 100 for the verdict, on every runc call). The front only
sources a regular file of its own user that is not a link, as it trusted the verdict before;
the file's name is new with this format, so a format-1 verdict left by an older wrapper (plain
lines, not shell) is never sourced.
"""

from __future__ import annotations

import os
import shlex
import stat

from enflame_gcu.errors import ConfigError
from enflame_gcu.shim import config as runtime_config

FORMAT = "enflame-container-runtime front verdict 2"
# Format 1 (plain lines) was kept in /var/run/enflame/runtime-front.verdict: never read now,
# removed with the package (packaging/deb/prerm, the rpm's %preun).
DEFAULT_VERDICT = "/var/run/enflame/runtime-front-verdict.sh"
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


def render(config_path: str, state: str, runtimes: tuple[str, ...]) -> str | None:
    """The verdict's text, or None when the front could not use one for this config."""
    if (
        not os.path.isabs(config_path)
        or "\n" in config_path
        or os.path.realpath(config_path) != os.path.normpath(config_path)
        or not runtimes
        or any(not name or "\n" in name for name in runtimes)
    ):
        return None
    names = "".join(f"{name}\n" for name in runtimes)
    return (
        f"# {FORMAT}: written by the Python wrapper, read by the sh front (shim.front)\n"
        f"_efr_format={shlex.quote(FORMAT)}\n"
        f"_efr_path={shlex.quote(config_path)}\n"
        f"_efr_state={shlex.quote(state)}\n"
        f"_efr_names={shlex.quote(names)}\n"
    )


def discard(verdict: str) -> None:
    """Remove the verdict (the config no longer loads cleanly): the front asks Python again."""
    # contextlib.suppress would cost an import on the wrapper's pass-through path.
    try:  # noqa: SIM105
        os.unlink(verdict)
    except OSError:
        pass


def _current(verdict: str, text: str, config_path: str, state: str) -> bool:
    if _read(verdict) != text.encode("utf-8", "surrogateescape"):
        return False
    if state == "absent":
        return True
    try:
        return os.stat(verdict).st_mtime_ns > os.stat(config_path).st_mtime_ns
    except OSError:
        return False


def update(verdict: str, config: runtime_config.RuntimeConfig) -> None:
    """Leave the verdict for ``config`` (just loaded cleanly) unless it is already there."""
    path, explicit = runtime_config.config_path()
    state = "absent" if config.path is None and not explicit else "present"
    text = render(path, state, config.runtimes)
    if text is None:
        discard(verdict)
        return
    if _current(verdict, text, path, state):
        return
    before = _identity(path)
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
        text = render(path, state, again.runtimes)
        if before is None or text is None:
            discard(verdict)
            return
    directory = os.path.dirname(verdict)
    temp = f"{verdict}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        info = os.stat(directory)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return  # a directory others can write to: the front could be handed a forged file
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
    if _identity(path) != before or not _current(verdict, text, path, state):
        discard(verdict)  # the config changed meanwhile (or is newer than now): ask again
