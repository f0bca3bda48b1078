"""Shared helpers for the deployment tests: repository paths, YAML loading, tool lookup."""

from __future__ import annotations

import os
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
YAML_DIR = os.path.join(DEPLOY, "yaml")
CHART_DIR = os.path.join(DEPLOY, "helm", "enflame-gcu")
VENV_BIN = os.path.join(REPO, ".venv", "bin")

PLUGIN_IMAGE = "ghcr.io/enflame-gcu/enflame-gcu-device-plugin"
TOOLKIT_IMAGE = "ghcr.io/enflame-gcu/enflame-gcu-container-toolkit"


def load_all(path: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file."""
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def load_one(path: str) -> dict[str, Any]:
    """The single YAML document of a file."""
    docs = load_all(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


def manifest_files() -> list[str]:
    """Every manifest under deploy/yaml, relative to it (examples included)."""
    found = []
    for directory, _, files in os.walk(YAML_DIR):
        for name in files:
            if name.endswith((".yaml", ".yml")):
                found.append(os.path.relpath(os.path.join(directory, name), YAML_DIR))
    return sorted(found)


def tool(name: str) -> str:
    """A tool from the project's virtualenv, else from PATH."""
    candidate = os.path.join(VENV_BIN, name)
    return candidate if os.path.exists(candidate) else name
