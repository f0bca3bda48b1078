"""Validate a CDI spec: the JSON schema when available, plus the semantic rules runtimes enforce."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from typing import Any

from enflame_gcu.container_toolkit import cdi

_VENDOR_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_CLASS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _NAME_FIRST | frozenset("_.:-")


# The CDI schema shipped in the package (enflame_gcu/data, Apache-2.0, see cdi-schema.NOTICE):
# `cdi validate` works from every install, not only in a source checkout.
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SCHEMA_FILES = {"schema.json": "cdi-schema.json", "defs.json": "cdi-defs.json"}


def default_schema_dir() -> str:
    """The package's own copy of the CDI schema (``cdi-schema.json`` + ``cdi-defs.json``)."""
    return DATA_DIR


def _schema_file(schema_dir: str, name: str) -> str:
    """``name`` (schema.json, defs.json) in ``schema_dir``: the spec's layout or the package's."""
    plain = os.path.join(schema_dir, name)
    return plain if os.path.isfile(plain) else os.path.join(schema_dir, SCHEMA_FILES[name])


def load_schema(schema_dir: str) -> dict[str, Any]:
    """The CDI schema with ``defs.json``'s definitions inlined (one document, local refs only),
    so any jsonschema release validates it without a reference registry."""
    with open(_schema_file(schema_dir, "schema.json"), encoding="utf-8") as handle:
        schema: dict[str, Any] = json.load(handle)
    with open(_schema_file(schema_dir, "defs.json"), encoding="utf-8") as handle:
        definitions = json.load(handle).get("definitions", {})

    def local(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: item.replace("defs.json#", "#", 1)
                if key == "$ref" and isinstance(item, str)
                else local(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [local(item) for item in value]
        return value

    inlined: dict[str, Any] = local(schema)
    inlined["definitions"] = {**local(definitions), **inlined.get("definitions", {})}
    return inlined


def schema_missing_reason() -> str | None:
    """Why the schema cannot be checked here (jsonschema not installed), or None."""
    if importlib.util.find_spec("jsonschema") is None:
        return "jsonschema is not installed (pip install jsonschema; Debian: python3-jsonschema)"
    return None


def schema_problems(spec: dict[str, Any], schema_dir: str) -> list[str]:
    """Problems found by the CDI JSON schema in ``schema_dir`` (needs the jsonschema library)."""
    # jsonschema is optional on a node: imported only when a schema is checked.
    jsonschema = importlib.import_module("jsonschema")
    validator = jsonschema.Draft7Validator(load_schema(schema_dir))
    return [
        f"schema: {'/'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in validator.iter_errors(spec)
    ]


def _check_kind(kind: Any, version: str) -> list[str]:
    if not isinstance(kind, str) or kind.count("/") != 1:
        return [f"kind {kind!r} must look like vendor.com/class"]
    vendor, device_class = kind.split("/")
    problems = []
    if not vendor or not set(vendor) <= _VENDOR_CHARS or "." not in vendor:
        problems.append(f"kind {kind!r}: vendor {vendor!r} must be a domain name")
    if not device_class or not set(device_class) <= _CLASS_CHARS:
        problems.append(f"kind {kind!r}: class {device_class!r} has invalid characters")
    elif "." in device_class and cdi.version_key(version) < cdi.version_key("0.6.0"):
        problems.append(f"kind {kind!r}: dots in the class need cdiVersion 0.6.0")
    return problems


def _check_edits(container_edits: Any, where: str) -> list[str]:
    if not isinstance(container_edits, dict):
        return [f"{where}: containerEdits must be a mapping"]
    problems: list[str] = []
    for key in ("deviceNodes", "mounts"):
        items = container_edits.get(key) or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return [f"{where}: {key} must be a list of mappings"]
    if not isinstance(container_edits.get("env") or [], list):
        return [f"{where}: env must be a list"]
    for node in container_edits.get("deviceNodes") or []:
        path = node.get("path", "")
        if not str(path).startswith("/"):
            problems.append(f"{where}: device node path {path!r} must be absolute")
        host = node.get("hostPath")
        if host is not None and not str(host).startswith("/"):
            problems.append(f"{where}: device node hostPath {host!r} must be absolute")
        if node.get("type", "c") not in ("c", "b", "u", "p"):
            problems.append(f"{where}: device node {path}: type {node.get('type')!r} is invalid")
        if not set(str(node.get("permissions", ""))) <= set("rwm"):
            problems.append(f"{where}: device node {path}: permissions must be letters of rwm")
    for item in container_edits.get("env") or []:
        if "=" not in str(item) or str(item).startswith("="):
            problems.append(f"{where}: env entry {item!r} must be KEY=VALUE")
    for mount in container_edits.get("mounts") or []:
        for key in ("hostPath", "containerPath"):
            if not str(mount.get(key, "")).startswith("/"):
                problems.append(f"{where}: mount {key} {mount.get(key)!r} must be absolute")
    return problems


def semantic_problems(spec: dict[str, Any]) -> list[str]:
    """Rules beyond the schema: version, kind and device names, paths, the minimum version."""
    version = str(spec.get("cdiVersion", ""))
    if version not in cdi.KNOWN_VERSIONS:
        return [f"cdiVersion {version!r} is unknown; known: {', '.join(cdi.KNOWN_VERSIONS)}"]
    problems = _check_kind(spec.get("kind"), version)
    needed = cdi.required_version(spec)
    if cdi.version_key(version) < cdi.version_key(needed):
        problems.append(f"cdiVersion {version} is too low for the fields used (needs {needed})")
    seen: set[str] = set()
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        problems.append("the spec defines no devices")
        devices = []
    for device in devices:
        name = str(device.get("name", ""))
        if not name or name[0] not in _NAME_FIRST or not set(name) <= _NAME_CHARS:
            problems.append(f"device name {name!r} is invalid")
        if name in seen:
            problems.append(f"device name {name!r} is defined twice")
        seen.add(name)
        device_edits = device.get("containerEdits")
        if not device_edits:
            problems.append(f"device {name!r} has no containerEdits")
        else:
            problems.extend(_check_edits(device_edits, f"device {name!r}"))
    if spec.get("containerEdits"):
        problems.extend(_check_edits(spec["containerEdits"], "spec containerEdits"))
    return problems


def validate(spec: dict[str, Any], schema_dir: str | None) -> list[str]:
    """Every problem found: schema problems (when a schema dir is given) then semantic ones."""
    problems = schema_problems(spec, schema_dir) if schema_dir else []
    try:
        return problems + semantic_problems(spec)
    except (AttributeError, TypeError, ValueError) as exc:
        # A spec of the wrong shape (a string where a mapping belongs) is a problem, not a crash.
        return [*problems, f"the spec's structure is not CDI's ({exc})"]
