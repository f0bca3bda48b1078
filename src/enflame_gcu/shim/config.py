"""The runtime's config file: its keys, defaults and checks (parsed by :mod:`toml_subset`).

Standard library only, like everything on the pass-through path: the file is parsed by the
small flat-TOML reader in :mod:`enflame_gcu.shim.toml_subset` rather than ``tomllib`` (about
20 ms to import), and ``dataclasses`` is avoided for the same reason (~15 ms to import).
"""

from __future__ import annotations

import os
import stat

from enflame_gcu.errors import ConfigError
from enflame_gcu.shim import toml_subset

DEFAULT_PATH = "/etc/enflame-container-runtime/config.toml"
MAX_BYTES = 1 << 20  # the runtime's config is a few hundred bytes
NULL_DEVICE = os.makedev(1, 3)  # /dev/null: an empty config, as usual
PATH_ENV = "ENFLAME_CONTAINER_RUNTIME_CONFIG"
DEFAULT_LOG_FILE = "/var/log/enflame/enflame-container-runtime.log"
# Written by `enflame-ctk cdi generate --prepared-edits` (and the installer); see the template.
DEFAULT_PREPARED_EDITS = "/var/run/enflame/prepared-edits.json"
LOG_LEVELS = ("debug", "info", "warning", "error")


class RuntimeConfig:
    """Effective runtime settings (immutable by convention; see the module docstring)."""

    __slots__ = (
        "accept_envvar_when_unprivileged",
        "cdi_spec_dirs",
        "env",
        "log_file",
        "log_level",
        "mounts",
        "path",
        "prepared_edits",
        "root",
        "runtimes",
    )

    def __init__(
        self,
        *,
        path: str | None = None,
        runtimes: tuple[str, ...] = ("runc", "crun"),
        root: str = "/",
        accept_envvar_when_unprivileged: bool = True,
        log_file: str = DEFAULT_LOG_FILE,
        log_level: str = "info",
        mounts: tuple[tuple[str, str], ...] = (),
        env: tuple[tuple[str, str], ...] = (),
        cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi"),
        prepared_edits: str = DEFAULT_PREPARED_EDITS,
    ) -> None:
        self.path = path
        self.runtimes = runtimes
        self.root = root
        self.accept_envvar_when_unprivileged = accept_envvar_when_unprivileged
        self.log_file = log_file
        self.log_level = log_level
        self.mounts = mounts
        self.env = env
        self.cdi_spec_dirs = cdi_spec_dirs
        self.prepared_edits = prepared_edits

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in sorted(self.__slots__))
        return f"RuntimeConfig({fields})"


def config_path() -> tuple[str, bool]:
    """The config file to read and whether it was named explicitly (by the env var)."""
    explicit = os.environ.get(PATH_ENV)
    return (explicit, True) if explicit else (DEFAULT_PATH, False)


def _read_regular(path: str) -> bytes:
    """The bytes of a regular file (the null device reads as empty); ConfigError for a FIFO,
    device, socket or directory, which could block the runtime or never end.

    fileio.read_regular does the same for the toolkit; importing it would cost every
    pass-through call a module (tests/shim/test_passthrough.py keeps that list short).
    """
    info = os.stat(path)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE:
        return b""
    fd = -1
    if stat.S_ISREG(info.st_mode):  # never open anything else: opening acts on some devices
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):  # again, on what was opened
            raise ConfigError(f"config file {path} is not a regular file (a FIFO or a device?)")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_BYTES} bytes")
    return raw


def _read_text(path: str, explicit: bool) -> str | None:
    """The file's text; None for a missing default file; ConfigError naming the problem."""
    try:
        raw = _read_regular(path)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {path} does not exist") from None
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path} line {line}: the file is not UTF-8 (byte 0x{raw[exc.start]:02x})"
        ) from None


def load(path: str | None = None) -> RuntimeConfig:
    """Read the config; a missing default file means defaults, a missing named file is an error.

    Every error names the file and, where it is about the text, the line.
    """
    explicit = path is not None
    if path is None:
        path, explicit = config_path()
    text = _read_text(path, explicit)
    if text is None:
        return RuntimeConfig()
    lines: dict[str, int] = {}
    return from_values(toml_subset.parse(text, path, lines), path, lines)


def load_for_passthrough() -> tuple[RuntimeConfig, str | None]:
    """The config for a call that only execs runc, which a broken config must not stop.

    Returns (config, problem). On a broken file the problem says what is wrong and the config
    has the defaults, except a ``runtimes`` value that still parses and checks, so a
    newer-version config (an unknown key) keeps finding the configured low-level runtime.
    """
    try:
        return load(), None
    except ConfigError as exc:
        problem = str(exc)
    runtimes: tuple[str, ...] = RuntimeConfig().runtimes
    kept = "the default runtimes"
    try:
        path = config_path()[0]
        text = _read_text(path, True)
        values = toml_subset.parse(text or "", path)
        if "runtimes" in values:
            found = tuple(_strings(values, "runtimes", path, [], allow_single=True))
            if found:
                runtimes, kept = found, "the configured runtimes"
    except ConfigError:
        pass
    return RuntimeConfig(runtimes=runtimes), f"{problem}; using {kept} ({', '.join(runtimes)})"


def from_values(
    values: dict[str, object], path: str | None = None, lines: dict[str, int] | None = None
) -> RuntimeConfig:
    """Check parsed keys and build the config; unknown keys and wrong types are errors.

    ``lines`` (key -> line number, filled by :func:`parse`) lets each message name the line.
    """
    file = path or "config"
    lines = lines or {}

    def at(key: str) -> str:
        return f"{file} line {lines[key]}" if key in lines else file

    known = {
        "runtimes",
        "root",
        "accept-envvar-when-unprivileged",
        "log-file",
        "log-level",
        "mounts",
        "env",
        "cdi-spec-dirs",
        "prepared-edits",
    }
    unknown = sorted(set(values) - known, key=lambda key: (lines.get(key, 0), key))
    if unknown:
        raise ConfigError(
            f"{at(unknown[0])}: unknown key(s) {', '.join(unknown)}; "
            f"valid keys: {', '.join(sorted(known))}"
        )
    runtimes = _strings(values, "runtimes", at("runtimes"), ["runc", "crun"], allow_single=True)
    if not runtimes:
        raise ConfigError(f"{at('runtimes')}: runtimes must name at least one low-level runtime")
    root = _string(values, "root", at("root"), "/")
    if not root.startswith("/"):
        raise ConfigError(f"{at('root')}: root must be an absolute path, got {root!r}")
    accept = values.get("accept-envvar-when-unprivileged", True)
    if not isinstance(accept, bool):
        raise ConfigError(
            f"{at('accept-envvar-when-unprivileged')}: "
            "accept-envvar-when-unprivileged must be true or false"
        )
    level = _string(values, "log-level", at("log-level"), "info").lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{at('log-level')}: log-level must be one of {', '.join(LOG_LEVELS)}")
    mounts = []
    for item in _strings(values, "mounts", at("mounts"), []):
        host, _, container = item.partition(":")
        container = container or host
        if not host.startswith("/") or not container.startswith("/"):
            raise ConfigError(
                f"{at('mounts')}: mounts entry {item!r} must be HOST_PATH or "
                "HOST_PATH:CONTAINER_PATH with absolute paths"
            )
        mounts.append((host, container))
    prepared = _string(values, "prepared-edits", at("prepared-edits"), DEFAULT_PREPARED_EDITS)
    if prepared and not prepared.startswith("/"):
        raise ConfigError(
            f'{at("prepared-edits")}: prepared-edits must be an absolute path or "", '
            f"got {prepared!r}"
        )
    env = []
    for item in _strings(values, "env", at("env"), []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{at('env')}: env entry {item!r} must be KEY=VALUE")
        env.append((key, value))
    default_dirs = ["/etc/cdi", "/var/run/cdi"]
    return RuntimeConfig(
        path=path,
        runtimes=tuple(runtimes),
        root=root,
        accept_envvar_when_unprivileged=accept,
        log_file=_string(values, "log-file", at("log-file"), DEFAULT_LOG_FILE),
        log_level=level,
        mounts=tuple(mounts),
        env=tuple(env),
        cdi_spec_dirs=tuple(_strings(values, "cdi-spec-dirs", at("cdi-spec-dirs"), default_dirs)),
        prepared_edits=prepared,
    )


def _string(values: dict[str, object], key: str, where: str, default: str) -> str:
    value = values.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _strings(
    values: dict[str, object], key: str, where: str, default: list[str], allow_single: bool = False
) -> list[str]:
    value = values.get(key, default)
    if allow_single and isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: {key} must be an array of strings, got {value!r}")
    return list(value)
