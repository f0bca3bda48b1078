"""Run real ``helm lint`` (Helm's Go library via helm-python-sdk) on a chart directory; print
JSON.

Executed by the side interpreter ``.venv-helm/bin/python`` (scripts/bootstrap.sh builds it from
the system's python3 with helm-python-sdk, which bundles Helm's Go library and needs Python >=
3.10), not imported by the test suite. Prints one JSON line, the lint result: ``messages`` (each
with severity, path and Helm's error text) and ``errors`` (null when none). Helm's own log
(for instance a template's ``fail`` in lint mode) goes to stderr. Exit 0.
"""

import json
import sys

import helm_python


def main(chart_dir: str) -> None:
    report = helm_python.lint(chart_dir)
    messages = [
        {"severity": m.get("severity"), "path": m.get("path"), "error": m.get("error")}
        for m in report.get("messages") or []
    ]
    print(json.dumps({"messages": messages, "errors": report.get("errors") or None}))


main(sys.argv[1])
