"""A flat TOML subset, parsed with the standard library alone (the runtime config's format).

Why not ``tomllib``: the runtime runs in front of *every* runc call, and importing ``tomllib``
costs about 20 ms (it pulls in ``re``, ``typing`` and ``datetime``), more than the whole
pass-through budget. The config only needs top-level ``key = value`` lines whose values are
strings, booleans, integers or arrays of those, so this module parses exactly that subset the
same way on every Python version, and rejects anything else (tables, dates, inline tables,
dotted keys, multi-line strings) with the line number.
"""

from __future__ import annotations

from enflame_gcu.errors import ConfigError

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# fileio.MAX_DEPTH's value (fileio stays off the pass-through path): no real config nests arrays.
MAX_DEPTH = 64
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


def _value(scan: _Scanner, in_array: bool, depth: int = 0) -> object:
    char = scan.peek()
    if char in ('"', "'"):
        return _string_literal(scan)
    if char == "[":
        if depth >= MAX_DEPTH:
            # Recursing on would end in RecursionError on every runc call, pass-through too.
            raise scan.error(f"arrays nested deeper than {MAX_DEPTH} levels")
        return _array(scan, depth + 1)
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


def _array(scan: _Scanner, depth: int) -> list[object]:
    scan.pos += 1  # the opening bracket
    items: list[object] = []
    while True:
        scan.skip_blank(newlines=True)
        if scan.peek() == "]":
            scan.pos += 1
            return items
        if not scan.peek():
            raise scan.error("array is not closed with ']'")
        items.append(_value(scan, in_array=True, depth=depth))
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
