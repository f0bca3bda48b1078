"""Load, check and atomically save an OCI bundle's ``config.json``."""

from __future__ import annotations

import json
import os

from enflame_gcu import fileio
from enflame_gcu.errors import SpecError

# typing and dataclasses stay off the runtime's create path (milliseconds each to import).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_NAME = "config.json"


class Spec:
    """A bundle's spec as read: its path, the exact bytes, and the decoded object to edit."""

    __slots__ = ("data", "path", "raw")

    def __init__(self, path: str, raw: bytes, data: dict[str, Any]) -> None:
        self.path = path
        self.raw = raw
        self.data = data

    def fresh_data(self) -> dict[str, Any]:
        """The spec decoded again from the bytes read, for a second attempt at editing it."""
        data: dict[str, Any] = json.loads(self.raw)
        return data

    def __repr__(self) -> str:
        return f"Spec(path={self.path!r}, raw=<{len(self.raw)} bytes>)"


def spec_path(bundle: str) -> str:
    """Path of the spec inside a bundle directory."""
    return os.path.join(bundle, CONFIG_NAME)


def load(bundle: str) -> Spec:
    """Read and decode ``<bundle>/config.json`` and check the parts the runtime edits."""
    path = spec_path(bundle)
    try:
        raw = fileio.read_regular(path)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = fileio.parse_json(raw, path)
    except fileio.NestingError as exc:
        raise SpecError(str(exc)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path} is not valid JSON: {exc}") from exc
    if b"\\u" in raw:  # only \uXXXX escapes can make a lone surrogate: check just then
        _check_unicode(data, path)
    check_shape(data, path)
    return Spec(path, raw, data)


def _check_unicode(data: Any, path: str) -> None:
    """Raise SpecError when a string holds a lone UTF-16 surrogate (``"\\ud800"``).

    JSON allows the escape, but it is no character: the spec could not be written back as
    UTF-8, and runc would read something else than the runtime checked.
    """
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        surrogate = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace")
        raise SpecError(
            f"{path} contains a lone UTF-16 surrogate escape "
            f"({surrogate.decode('ascii')}), which is not a character"
        ) from None


def check_shape(data: Any, where: str) -> None:
    """Raise SpecError when a part the runtime reads or edits has the wrong JSON type."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: the spec must be a JSON object, got {type(data).__name__}")
    expect = {
        "process": dict,
        "linux": dict,
        "mounts": list,
        "annotations": dict,
    }
    for key, kind in expect.items():
        if key in data and not isinstance(data[key], kind):
            raise SpecError(f"{where}: {key!r} must be a JSON {_json_name(kind)}")
    process = data.get("process", {})
    env = process.get("env", [])
    if not isinstance(env, list) or not all(isinstance(item, str) for item in env):
        raise SpecError(f"{where}: 'process.env' must be a list of strings")
    linux = data.get("linux", {})
    if "devices" in linux and not isinstance(linux["devices"], list):
        raise SpecError(f"{where}: 'linux.devices' must be a JSON array")
    resources = linux.get("resources", {})
    if not isinstance(resources, dict) or not isinstance(resources.get("devices", []), list):
        raise SpecError(f"{where}: 'linux.resources.devices' must be a JSON array")
    for mount in data.get("mounts", []):
        if not isinstance(mount, dict):
            raise SpecError(f"{where}: every entry of 'mounts' must be a JSON object")
    for key, value in data.get("annotations", {}).items():
        if not isinstance(value, str):
            raise SpecError(f"{where}: annotation {key!r} must be a string")


def _json_name(kind: type) -> str:
    return "object" if kind is dict else "array"


def dumps(data: dict[str, Any]) -> bytes:
    """Serialise a spec the way engines do (compact JSON, UTF-8 kept as is)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def save(spec: Spec, data: dict[str, Any]) -> None:
    """Replace the spec file atomically (temp file + rename), keeping its mode.

    No fsync: the bundle is ephemeral (the engine wrote it without one and runc reads it
    milliseconds later), so only atomicity matters, and two fsyncs cost ~1 ms per create.
    """
    try:
        fileio.atomic_write(spec.path, dumps(data), durable=False)
    except OSError as exc:
        raise SpecError(f"cannot write {spec.path}: {exc.strerror or exc}") from exc
