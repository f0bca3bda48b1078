"""The extender's heap keeping (issue 49): what the cache holds is frozen out of the cyclic
collector's walks once the watches have listed, again every interval, and a full sweep
reclaims a cycle frozen while it was alive. Real ``gc``, on this process's own heap."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from enflame_gcu.scheduler_extender import heap


class Node:
    """A weak-referenceable object that can sit in a cycle."""

    other: Node | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Every test starts and ends with nothing frozen (the rest of the suite's heap as usual)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def cycle() -> tuple[Node, weakref.ref[Node]]:
    first, second = Node(), Node()
    first.other, second.other = second, first
    return first, weakref.ref(first)


def test_a_settle_freezes_what_lives_and_collects_the_garbage_first() -> None:
    alive = {"state": [1, 2, 3]}
    garbage, garbage_ref = cycle()
    del garbage  # unreachable, held only by its own cycle
    keeper = heap.HeapKeeper()
    done = keeper.settle()
    assert garbage_ref() is None  # collected, not frozen
    assert done.kind == "settle" and done.frozen == gc.get_freeze_count() > 0
    assert keeper.last == done
    # Frozen: no generation the collector walks holds it any more.
    assert not any(found is alive for found in gc.get_objects())


def test_objects_made_after_a_settle_are_walked_until_the_next() -> None:
    keeper = heap.HeapKeeper()
    keeper.settle()
    later = Node()  # a state read again after a renewal
    assert any(found is later for found in gc.get_objects())
    keeper.settle()
    assert not any(found is later for found in gc.get_objects())


def test_a_cycle_frozen_alive_is_reclaimed_only_by_the_sweep() -> None:
    clock = Clock()
    keeper = heap.HeapKeeper(interval=5, sweep=3600, clock=clock)
    kept, kept_ref = cycle()
    keeper.settle()
    del kept  # now garbage, but frozen: the collector does not walk it
    gc.collect()
    assert kept_ref() is not None
    clock.now += 3599
    assert keeper.step().kind == "settle"
    assert kept_ref() is not None
    clock.now += 1
    swept = keeper.step()
    assert swept.kind == "sweep" and kept_ref() is None
    assert gc.get_freeze_count() > 0  # what lives is frozen again after the sweep
    clock.now += 5
    assert keeper.step().kind == "settle"  # the next sweep is an hour after this one


@pytest.mark.parametrize("interval, sweep", [(0, 3600), (-1, 3600), (10, 5)])
def test_a_bad_period_is_refused_with_its_value(interval: float, sweep: float) -> None:
    with pytest.raises(ValueError, match=f"heap interval {interval:g} s"):
        heap.HeapKeeper(interval, sweep)


def test_run_waits_for_the_listing_then_settles_every_interval() -> None:
    listed = {"done": False}
    keeper = heap.HeapKeeper(interval=0.05, sweep=3600)

    def ready() -> tuple[bool, str]:
        return (listed["done"], "ok" if listed["done"] else "not listed yet: pods")

    async def scenario() -> None:
        task = asyncio.ensure_future(keeper.run(ready))
        await asyncio.sleep(0.3)
        assert keeper.last is None  # nothing frozen before the cache is filled
        assert gc.get_freeze_count() == 0
        listed["done"] = True
        await asyncio.sleep(0.6)
        first = keeper.last
        assert first is not None and first.kind == "settle"
        made = Node()
        await asyncio.sleep(0.2)  # several intervals: a later settle froze it
        assert keeper.last is not first
        assert not any(found is made for found in gc.get_objects())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
