"""Render the chart's templates with Helm's own engine (helm-python-sdk), no helm binary, no
cluster.

Helm's lint renders every template with the chart's values (and checks them against
values.schema.json). A copy of the chart gets the values under test and one extra template
that hands each rendered template back, base64-encoded, through ``fail``; in lint mode
``fail`` only logs its message (Helm's log, on stderr), so every template's text comes back.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
from typing import Any

import jsonschema
import yaml

from tests.conftest import PROJECT_ROOT
from tests.deploy.helpers import CHART_DIR

HELM_SDK = os.path.join(PROJECT_ROOT, ".venv-helm", "bin", "python")
HELM_LINT = os.path.join(os.path.dirname(__file__), "helm_lint.py")
NO_HELM_SDK = (
    ".venv-helm is missing: scripts/bootstrap.sh makes it (helm-python-sdk, Helm's Go library "
    "for Python) and says why when it could not"
)


def helm_missing() -> bool:
    """Whether the chart tests that need Helm skip: never under CI=true, where a missing Helm
    is a failure (render() then says what is missing), not a skip."""
    return not os.path.exists(HELM_SDK) and os.environ.get("CI") != "true"


# .Files cannot see templates/, so the probe is given their names.
PROBE = """{{- range $name := list %s }}
{{- $text := include (print $.Template.BasePath "/" $name) $ }}
{{- fail (printf "RENDERED %%s <%%s>" $name ($text | b64enc)) }}
{{- end }}
"""
_RENDERED = re.compile(r"RENDERED (\S+) <([A-Za-z0-9+/=]*)>")


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` laid over it (maps merged key by key, the rest replaced)."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict) and value:
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def render(
    workdir: str,
    overrides: dict[str, Any] | None = None,
    extra_templates: dict[str, str] | None = None,
) -> dict[str, list[Any]]:
    """``{template file: its YAML documents}`` for the chart with ``overrides`` applied (and
    ``extra_templates``, ``{file name: text}``, added to its templates: a probe of a helper).

    Raises AssertionError with Helm's messages when lint finds an error (a bad value the schema
    rejects, a template that does not render).
    """
    target = os.path.join(workdir, "enflame-gcu")
    shutil.copytree(CHART_DIR, target)
    with open(os.path.join(target, "values.yaml"), encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    with open(os.path.join(target, "values.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(merged(values, overrides or {}), handle, sort_keys=False)
    assert os.path.exists(HELM_SDK), NO_HELM_SDK
    for name, text in (extra_templates or {}).items():
        with open(os.path.join(target, "templates", name), "w", encoding="utf-8") as handle:
            handle.write(text)
    names = sorted(n for n in os.listdir(os.path.join(target, "templates")) if n.endswith(".yaml"))
    with open(os.path.join(target, "templates", "zz-render-probe.yaml"), "w") as handle:
        handle.write(PROBE % " ".join(json.dumps(n) for n in names))
    result = subprocess.run(
        [HELM_SDK, HELM_LINT, target], capture_output=True, text=True, check=True, timeout=180
    )
    lint = json.loads(result.stdout.splitlines()[0])
    problems = [m for m in lint["messages"] if m["severity"] >= 3]
    if lint["errors"] is not None or problems:
        raise AssertionError(
            f"helm lint: {problems or lint['errors']}; values schema: "
            f"{schema_problems(target) or 'none'}; {result.stderr[-2000:]}"
        )
    rendered: dict[str, list[Any]] = {}
    for name, encoded in _RENDERED.findall(result.stdout + result.stderr):
        text = base64.b64decode(encoded).decode()
        rendered[name] = [doc for doc in yaml.safe_load_all(text) if doc]
    assert rendered, f"the probe rendered nothing: {result.stderr[-2000:]}"
    return rendered


def schema_problems(chart_dir: str) -> list[str]:
    """Why the chart's values.yaml breaks its values.schema.json (the text Helm's lint loses)."""
    with open(os.path.join(chart_dir, "values.schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)
    with open(os.path.join(chart_dir, "values.yaml"), encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    checker = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in sorted(checker.iter_errors(values), key=lambda e: list(e.absolute_path))
    ]


def lint_errors(workdir: str, overrides: dict[str, Any]) -> str:
    """Helm's complaint about the chart with ``overrides`` ("" when it has none)."""
    try:
        render(workdir, overrides)
    except AssertionError as exc:
        return str(exc)
    return ""


def objects(rendered: dict[str, list[Any]], kind: str) -> list[dict[str, Any]]:
    """Every rendered object of ``kind``."""
    return [doc for docs in rendered.values() for doc in docs if doc.get("kind") == kind]


def daemonset(rendered: dict[str, list[Any]], template: str) -> dict[str, Any]:
    """The DaemonSet a template renders."""
    [found] = [doc for doc in rendered.get(template, []) if doc.get("kind") == "DaemonSet"]
    return dict(found)
