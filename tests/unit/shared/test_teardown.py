"""The teardown helpers: a cancel never cuts a teardown short, and a failed start leaves no sibling running."""

from __future__ import annotations

import asyncio

import pytest

from millpond.shared.teardown import bounded, gather_or_cancel, run_to_end


async def test_a_cancel_waits_for_the_teardown_and_is_raised_after() -> None:
    closed: list[str] = []

    async def teardown() -> None:
        await asyncio.sleep(0.05)
        closed.append("done")
    job = asyncio.create_task(run_to_end(teardown()))
    await asyncio.sleep(0.01)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert closed == ["done"]


async def test_a_step_that_overruns_is_cancelled_and_reported() -> None:
    assert not await bounded(asyncio.sleep(10), 0.01, "sleep", {})
    assert await bounded(asyncio.sleep(0), 1, "sleep", {})


async def test_one_failed_start_cancels_and_awaits_the_others() -> None:
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append("slow")

    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("no")
    with pytest.raises(ValueError):
        await gather_or_cancel(slow(), failing())
    assert ended == ["slow"]
    assert await gather_or_cancel(asyncio.sleep(0, "a"), asyncio.sleep(0, "b")) == ["a", "b"]
