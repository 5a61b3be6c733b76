"""The teardown helpers: a cancel never cuts a teardown short, a failed start leaves no sibling running, and an
open in a thread leaves the loop free and nothing open when its caller is cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest

from millpond.shared.teardown import bounded, gather_or_cancel, opened_in_thread, run_to_end


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


async def test_an_open_in_a_thread_leaves_the_loop_running_meanwhile() -> None:
    loop_ran = threading.Event()

    def open_() -> str:
        assert loop_ran.wait(5), "the loop did not run while the open did"
        return "store"
    asyncio.get_running_loop().call_soon(loop_ran.set)
    assert await opened_in_thread(open_, lambda _: pytest.fail("closed although its caller got it")) == "store"


async def test_a_caller_cancelled_during_the_open_closes_what_it_opened_before_the_cancel() -> None:
    started, go, closed = threading.Event(), threading.Event(), []

    def open_() -> str:
        started.set()
        assert go.wait(5)
        return "store"
    job = asyncio.create_task(opened_in_thread(open_, closed.append))
    assert await asyncio.to_thread(started.wait, 5)
    job.cancel()
    await asyncio.sleep(0.02)
    assert not job.done() and closed == []  # the cancel waits for the open to end
    job.cancel()  # and a second cancel too
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert closed == ["store"]


async def test_a_failed_open_cancelled_meanwhile_closes_nothing_and_is_cancelled() -> None:
    started, go = threading.Event(), threading.Event()

    def open_() -> str:
        started.set()
        assert go.wait(5)
        raise OSError("lock held")
    job = asyncio.create_task(opened_in_thread(open_, lambda _: pytest.fail("nothing was opened")))
    assert await asyncio.to_thread(started.wait, 5)
    job.cancel()
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await job
