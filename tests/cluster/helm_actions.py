"""Helm's own install/upgrade/uninstall (Go, through helm-sdkpy) against a cluster; prints JSON.

Run by the side interpreter ``.venv-helm/bin/python`` (helm-sdkpy needs Python >= 3.12; made by
``make setup`` when such a Python exists), not imported by the suite::

    helm_actions.py KUBECONFIG install|upgrade RELEASE CHART NAMESPACE VALUES_JSON
    helm_actions.py KUBECONFIG uninstall RELEASE NAMESPACE
    helm_actions.py KUBECONFIG status RELEASE NAMESPACE

Exit 0 with ``{"ok": true, "result": ...}``, 1 with ``{"ok": false, "error": ...}``.
"""

import asyncio
import json
import sys
from typing import Any

from helm_sdkpy import Configuration, actions


async def main(argv: list[str]) -> dict[str, Any]:
    kubeconfig, action, release = argv[0], argv[1], argv[2]
    if action in ("install", "upgrade"):
        chart, namespace, values = argv[3], argv[4], json.loads(argv[5])
        config = Configuration(namespace=namespace, kubeconfig=kubeconfig)
        result: dict[str, Any]
        if action == "install":
            result = await actions.Install(config).run(release, chart, values=values, wait=False)
        else:
            result = await actions.Upgrade(config).run(release, chart, values=values, wait=False)
        return result
    namespace = argv[3]
    config = Configuration(namespace=namespace, kubeconfig=kubeconfig)
    if action == "uninstall":
        done: dict[str, Any] = await actions.Uninstall(config).run(release, wait=True, timeout=180)
        return done
    if action == "status":
        status: dict[str, Any] = await actions.Status(config).run(release)
        return status
    raise SystemExit(f"unknown action {action}")


try:
    outcome = asyncio.run(main(sys.argv[1:]))
    print(json.dumps({"ok": True, "result": outcome}, default=str))
except Exception as exc:  # reported to the caller as JSON
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(1)
