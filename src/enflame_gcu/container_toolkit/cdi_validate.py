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


def default_schema_dir() -> str | None:
    """``<project>/../shared/schemas/cdi`` for a source checkout, when it exists."""
    here = os.path.dirname(os.path.abspath(__file__))
    project = os.path.normpath(os.path.join(here, "..", "..", ".."))
    candidate = os.path.join(os.path.dirname(project), "shared", "schemas", "cdi")
    return candidate if os.path.isfile(os.path.join(candidate, "schema.json")) else None


def schema_problems(spec: dict[str, Any], schema_dir: str) -> list[str]:
    """Problems found by the CDI JSON schema in ``schema_dir`` (needs jsonschema + referencing)."""
    # jsonschema and referencing are dev/test dependencies: imported only when a schema is used.
    jsonschema = importlib.import_module("jsonschema")
    referencing = importlib.import_module("referencing")
    drafts = importlib.import_module("referencing.jsonschema")
    resources = []
    for name in sorted(os.listdir(schema_dir)):
        if name.endswith(".json"):
            with open(os.path.join(schema_dir, name), encoding="utf-8") as handle:
                contents = json.load(handle)
            resource = referencing.Resource.from_contents(
                contents, default_specification=drafts.DRAFT7
            )
            resources.append((name, resource))
    registry = referencing.Registry().with_resources(resources)
    with open(os.path.join(schema_dir, "schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)
    validator = jsonschema.Draft7Validator(schema, registry=registry)
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
    problems = []
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


def schema_available() -> bool:
    """True when jsonschema and referencing can be imported (they are dev dependencies)."""
    return all(importlib.util.find_spec(name) for name in ("jsonschema", "referencing"))


def validate(spec: dict[str, Any], schema_dir: str | None) -> list[str]:
    """Every problem found: schema problems (when a schema dir is given) then semantic ones."""
    problems = schema_problems(spec, schema_dir) if schema_dir else []
    return problems + semantic_problems(spec)
