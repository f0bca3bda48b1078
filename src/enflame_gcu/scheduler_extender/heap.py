"""Keeps CPython's cyclic garbage collector from pausing the extender's calls (issue 49).

At 5,000 nodes and 20,000 bound pods the cache holds some 200,000 objects the collector tracks
(node states, pods, memo entries). A generation-2 collection walks every one of them while
holding the GIL: 40-100 ms on a quiet machine, up to 350 ms on a loaded one, and the call
being answered waits for it (docs/benchmarks.md). Freezing them once (``gc.freeze``) is not
enough: every Lease renewal makes the node's state anew, so within one renewal period (60 s)
the cache is made of unfrozen objects again.

So, once the watches have listed everything, and every ``interval`` seconds after, a *settle*
collects what was made since the last one (only unfrozen objects are walked, a few ms) and
freezes the survivors: the collector never walks them again, and reference counting still
frees them when the cache drops them (the cache's objects form no cycles). A cycle frozen while
it was alive would never be reclaimed, so every ``sweep`` seconds everything is unfrozen and
collected once: one full pause an hour instead of one every few seconds of watch traffic.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pass:
    """One settle or sweep: what it did, how long it held the process, objects now frozen."""

    kind: str  # "settle" or "sweep"
    seconds: float
    frozen: int


class HeapKeeper:
    """Settles the heap every ``interval`` seconds and sweeps it every ``sweep`` seconds."""

    def __init__(
        self,
        interval: float = 5.0,
        sweep: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval <= sweep:
            raise ValueError(f"heap interval {interval:g} s must be > 0 and at most {sweep:g} s")
        self.interval, self.sweep = interval, sweep
        self._clock = clock
        self._swept = clock()
        self.last: Pass | None = None

    def settle(self) -> Pass:
        """Collect the objects made since the last settle and freeze what survives."""
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        return self._done("settle", started)

    def full_sweep(self) -> Pass:
        """Unfreeze everything, collect it all once (a frozen cycle is reclaimed), freeze."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._swept = self._clock()
        return self._done("sweep", started)

    def step(self) -> Pass:
        """One pass: a sweep when one is due, else a settle."""
        if self._clock() - self._swept >= self.sweep:
            return self.full_sweep()
        return self.settle()

    def _done(self, kind: str, started: float) -> Pass:
        self.last = Pass(kind, time.perf_counter() - started, gc.get_freeze_count())
        log.debug("heap %s: %.1f ms, %d frozen", kind, self.last.seconds * 1000, self.last.frozen)
        return self.last

    async def run(self, ready: Callable[[], tuple[bool, str]] | None = None) -> None:
        """Wait until ``ready()`` (the watches have listed once), then a pass every
        ``interval`` seconds until cancelled."""
        while ready is not None and not ready()[0]:
            await asyncio.sleep(min(self.interval, 0.5))
        first = self.settle()
        log.info(
            "cache filled: %d objects frozen out of the collector's walks (%.0f ms)",
            first.frozen,
            first.seconds * 1000,
        )
        while True:
            await asyncio.sleep(self.interval)
            self.step()
