"""support.aio.first: returns with the first wait done and leaves nothing running behind."""

from __future__ import annotations

import asyncio

from enflame_gcu.support import aio


def test_first_returns_when_one_finishes_and_cancels_the_rest() -> None:
    async def scenario() -> None:
        done = asyncio.Event()
        cancelled: list[str] = []

        async def forever(name: str) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        async def soon() -> None:
            await asyncio.sleep(0.01)
            done.set()

        await asyncio.wait_for(aio.first(forever("a"), soon(), forever("b")), 5)
        assert done.is_set()
        assert sorted(cancelled) == ["a", "b"]  # ended before first() returned
        assert len(asyncio.all_tasks()) == 1  # only this scenario's own task

    asyncio.run(scenario())


def test_an_exception_of_the_first_is_not_raised_and_the_others_still_end() -> None:
    async def scenario() -> None:
        ended: list[str] = []

        async def fails() -> None:
            raise RuntimeError("boom")

        async def slow() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                ended.append("slow")

        await asyncio.wait_for(aio.first(fails(), slow()), 5)
        assert ended == ["slow"]

    asyncio.run(scenario())
