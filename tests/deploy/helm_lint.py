"""Run real ``helm lint`` (Helm's Go library via helm-sdkpy) on a chart directory; print JSON.

Executed by the side interpreter ``.venv-helm/bin/python`` (helm-sdkpy needs Python >= 3.12),
not imported by the test suite. Exit 0 with the lint result on stdout.

helm-sdkpy hands each lint message's Go ``error`` over as JSON, and a Go error has no exported
fields: its text arrives as ``{}``. Such an error is reported as ``null`` with
``"errorText": "lost"`` beside it, so nobody mistakes ``{}`` for Helm's words; the caller
(tests/deploy/helm_render.py) then finds the reason itself where it can (the values schema).
"""

import asyncio
import json
import sys

from helm_sdkpy import Configuration
from helm_sdkpy.chart import Lint


def _text(err: object) -> str | None:
    """Helm's message when helm-sdkpy kept it, else None."""
    if isinstance(err, str) and err:
        return err
    if isinstance(err, dict) and err:
        return json.dumps(err, sort_keys=True)
    return None


async def main(chart: str) -> None:
    result = await Lint(Configuration()).run(chart)
    messages = []
    for m in result.get("Messages") or []:
        text = _text(m.get("Err"))
        entry = {"severity": m.get("Severity"), "path": m.get("Path"), "error": text}
        if text is None:
            entry["errorText"] = "lost"
        messages.append(entry)
    errors = result.get("Errors")
    if errors is not None:
        errors = [_text(e) or "(text lost by helm-sdkpy)" for e in errors]
    print(json.dumps({"messages": messages, "errors": errors}))


asyncio.run(main(sys.argv[1]))
