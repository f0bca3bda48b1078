"""The node-state Lease a test's cache is fed, as the device plugin writes it."""

from __future__ import annotations

import json
from typing import Any

from enflame_gcu import node_state

NAMESPACE = "gcu-system"


def lease(name: str, text: str, renewed: float | None = None) -> dict[str, Any]:
    """Node ``name``'s Lease carrying ``text``, renewed at ``renewed`` (default: the state's
    own ``observed``, or 0 when the text is not a state)."""
    if renewed is None:
        try:
            document = json.loads(text)
            renewed = float(document["observed"])
        except (ValueError, KeyError, TypeError):
            renewed = 0.0
    return node_state.lease(name, NAMESPACE, text, renewed)
