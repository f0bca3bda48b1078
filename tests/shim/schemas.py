"""Validate written OCI and CDI specs against the JSON schemas in ``../shared/schemas``."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import jsonschema
import pytest
import referencing
import referencing.jsonschema

from tests.conftest import SCHEMAS_DIR

OCI_DIR = os.path.join(SCHEMAS_DIR, "oci")
CDI_DIR = os.path.join(SCHEMAS_DIR, "cdi")


@functools.cache
def _validator(directory: str, entry: str, draft: str) -> Any:
    specification = getattr(referencing.jsonschema, draft)
    resources = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                contents = json.load(handle)
            resources.append((name, referencing.Resource.from_contents(contents, specification)))
    registry = referencing.Registry().with_resources(resources)
    schema = dict(resources)[entry].contents
    cls = jsonschema.Draft4Validator if draft == "DRAFT4" else jsonschema.Draft7Validator
    return cls(schema, registry=registry)


def _require(directory: str) -> None:
    if not os.path.isdir(directory):
        pytest.skip(f"schema folder {directory} is absent (checkout outside the workspace)")


def _errors(validator: Any, document: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def assert_valid_oci(spec: dict[str, Any]) -> None:
    """Fail with every schema error when ``spec`` is not a valid OCI runtime config."""
    _require(OCI_DIR)
    errors = _errors(_validator(OCI_DIR, "config-schema.json", "DRAFT4"), spec)
    assert not errors, "OCI schema errors:\n" + "\n".join(errors)


def assert_valid_cdi(spec: dict[str, Any]) -> None:
    """Fail with every schema error when ``spec`` is not a valid CDI spec."""
    _require(CDI_DIR)
    errors = _errors(_validator(CDI_DIR, "schema.json", "DRAFT7"), spec)
    assert not errors, "CDI schema errors:\n" + "\n".join(errors)
