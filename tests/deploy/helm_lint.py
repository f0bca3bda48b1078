"""Run real ``helm lint`` (Helm's Go library via helm-sdkpy) on a chart directory; print JSON.

Executed by the side interpreter ``.venv-helm/bin/python`` (helm-sdkpy needs Python >= 3.12),
not imported by the test suite. Exit 0 with the lint result on stdout.
"""

import asyncio
import json
import sys

from helm_sdkpy import Configuration
from helm_sdkpy.chart import Lint


async def main(chart: str) -> None:
    result = await Lint(Configuration()).run(chart)
    messages = [
        {"severity": m.get("Severity"), "path": m.get("Path"), "error": json.dumps(m.get("Err"))}
        for m in result.get("Messages") or []
    ]
    print(json.dumps({"messages": messages, "errors": result.get("Errors")}))


asyncio.run(main(sys.argv[1]))
