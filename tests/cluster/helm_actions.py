"""Helm's own install/upgrade/uninstall (Go, through helm-python-sdk) against a cluster; prints
JSON.

Run by the side interpreter ``.venv-helm/bin/python`` (scripts/bootstrap.sh builds it from the
system's python3 with helm-python-sdk), not imported by the suite::

    helm_actions.py KUBECONFIG install|upgrade RELEASE CHART NAMESPACE VALUES_JSON [OPTIONS_JSON]
    helm_actions.py KUBECONFIG push CHART_TGZ oci://HOST/PATH [plain-http]
    helm_actions.py KUBECONFIG uninstall RELEASE NAMESPACE
    helm_actions.py KUBECONFIG status RELEASE NAMESPACE

Exit 0 with ``{"ok": true, "result": ...}``, 1 with ``{"ok": false, "error": ...}``.
"""

import json
import sys
from typing import Any

import helm_python


def main(argv: list[str]) -> Any:
    kubeconfig, action, release = argv[0], argv[1], argv[2]
    if action == "push":  # `helm push CHART_TGZ REMOTE [--plain-http]`: no cluster involved
        plain_http = argv[4:] == ["plain-http"]
        return helm_python.push(argv[2], argv[3], plain_http=plain_http)
    namespace = argv[3] if action in ("uninstall", "status") else argv[4]
    config = helm_python.Config(kubeconfig_path=kubeconfig, namespace=namespace)
    try:
        if action in ("install", "upgrade"):
            chart, values = argv[3], json.loads(argv[5])
            # {"chart_version": ..., "plain_http": true}: a chart from an oci:// registry
            options = json.loads(argv[6]) if len(argv) > 6 else {}
            if action == "install":
                return config.install(chart, release, values, namespace=namespace, **options)
            return config.upgrade(chart, release, values, namespace=namespace, **options)
        if action == "uninstall":
            return config.uninstall(release, wait="watcher", timeout=180)
        if action == "status":
            return config.status(release)
        raise SystemExit(f"unknown action {action}")
    finally:
        config.close()


try:
    outcome = main(sys.argv[1:])
    print(json.dumps({"ok": True, "result": outcome}, default=str))
except Exception as exc:  # reported to the caller as JSON
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(1)
