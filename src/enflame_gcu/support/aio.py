"""asyncio helpers the programs share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of ``waits`` finishes; cancel the others and wait for them to end
    (nothing is left running behind the caller). An exception of the first is not raised."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
