"""The runtime's config file: a flat TOML subset read with a tiny stdlib-only parser.

Why not ``tomllib``: the runtime runs in front of *every* runc call, and importing ``tomllib``
costs about 20 ms (it pulls in ``re``, ``typing`` and ``datetime``), more than the whole
pass-through budget. The file only needs top-level ``key = value`` lines whose values are
strings, booleans, integers or arrays of those, so this module parses exactly that subset the
same way on every Python version, and rejects anything else (tables, dates, inline tables) with
the line number. ``dataclasses`` is avoided for the same reason (~15 ms to import).
"""

from __future__ import annotations

import os

from enflame_gcu.errors import ConfigError

DEFAULT_PATH = "/etc/enflame-container-runtime/config.toml"
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


def _read_text(path: str, explicit: bool) -> str | None:
    """The file's text; None for a missing default file; ConfigError naming the problem."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
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
    return from_values(parse(text, path, lines), path, lines)


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
        values = parse(text or "", path)
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


# --- the flat TOML subset -------------------------------------------------------------------

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class _Scanner:
    """Character cursor over the whole file that knows the current line for messages."""

    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.pos = 0
        self.where = where

    def error(self, message: str) -> ConfigError:
        line = self.text.count("\n", 0, self.pos) + 1
        return ConfigError(f"{self.where} line {line}: {message}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_blank(self, newlines: bool) -> None:
        """Skip spaces, tabs and comments (and newlines when inside an array)."""
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            elif char == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return


def parse(
    text: str, where: str = "config", lines: dict[str, int] | None = None
) -> dict[str, object]:
    """Parse the flat TOML subset described in the module docstring.

    ``lines``, when given, receives the line number of each key (for later messages).
    """
    scan = _Scanner(text, where)
    values: dict[str, object] = {}
    while True:
        scan.skip_blank(newlines=True)
        if scan.pos >= len(text):
            return values
        if scan.peek() == "[":
            raise scan.error("tables are not supported here; use top-level keys only")
        if lines is not None:
            line = text.count("\n", 0, scan.pos) + 1
        key = _key(scan)
        if lines is not None:
            lines.setdefault(key, line)
        scan.skip_blank(newlines=False)
        if scan.peek() != "=":
            raise scan.error(f"expected '=' after key {key!r}")
        scan.pos += 1
        scan.skip_blank(newlines=False)
        if key in values:
            raise scan.error(f"key {key!r} is defined twice")
        values[key] = _value(scan, in_array=False)
        scan.skip_blank(newlines=False)
        if scan.peek() not in ("", "\n", "\r"):
            raise scan.error(f"unexpected text after the value of {key!r}")


def _key(scan: _Scanner) -> str:
    if scan.peek() in ('"', "'"):
        return _string_literal(scan)
    start = scan.pos
    while scan.peek() and scan.peek() in _BARE_KEY:
        scan.pos += 1
    if scan.pos == start:
        raise scan.error(f"expected a key, found {scan.peek()!r}")
    if scan.peek() == ".":
        raise scan.error("dotted keys are not supported here; use top-level keys only")
    return scan.text[start : scan.pos]


def _value(scan: _Scanner, in_array: bool) -> object:
    char = scan.peek()
    if char in ('"', "'"):
        return _string_literal(scan)
    if char == "[":
        return _array(scan)
    start = scan.pos
    while scan.peek() and scan.peek() not in " \t\r\n#,]":
        scan.pos += 1
    word = scan.text[start : scan.pos]
    if word in ("true", "false"):
        return word == "true"
    digits = word[1:] if word[:1] in "+-" else word
    plain = digits.replace("_", "")
    # ASCII digits only: int() would take "²" or "٣" (and raise on the first).
    if plain and plain.isascii() and plain.isdigit() and not digits.startswith("_"):
        return int(word.replace("_", ""))
    what = "an array element" if in_array else "a value"
    raise scan.error(f"expected {what} (string, true/false, integer or array), found {word!r}")


def _array(scan: _Scanner) -> list[object]:
    scan.pos += 1  # the opening bracket
    items: list[object] = []
    while True:
        scan.skip_blank(newlines=True)
        if scan.peek() == "]":
            scan.pos += 1
            return items
        if not scan.peek():
            raise scan.error("array is not closed with ']'")
        items.append(_value(scan, in_array=True))
        scan.skip_blank(newlines=True)
        if scan.peek() == ",":
            scan.pos += 1
        elif not scan.peek():
            raise scan.error("array is not closed with ']'")
        elif scan.peek() != "]":
            raise scan.error("expected ',' or ']' in array")


def _string_literal(scan: _Scanner) -> str:
    quote = scan.peek()
    if scan.text.startswith(quote * 3, scan.pos):
        raise scan.error("multi-line strings are not supported here")
    scan.pos += 1
    out: list[str] = []
    while True:
        char = scan.peek()
        if char in ("", "\n", "\r"):
            raise scan.error("string is not closed on its line")
        scan.pos += 1
        if char == quote:
            return "".join(out)
        if char == "\\" and quote == '"':
            code = scan.peek()
            scan.pos += 1
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
            elif code in ("u", "U"):
                width = 4 if code == "u" else 8
                digits = scan.text[scan.pos : scan.pos + width]
                try:
                    out.append(chr(int(digits, 16)))
                except ValueError:
                    raise scan.error(f"bad unicode escape \\{code}{digits}") from None
                scan.pos += width
            else:
                raise scan.error(f"unknown escape \\{code}")
        else:
            out.append(char)
