"""``wait_at_most``: whether the event came within the time, and a cancel never swallowed;
``until_next_tick``: a pause that ends on a grid."""

from __future__ import annotations

import asyncio
import time

import pytest

from millpond.shared.events import until_next_tick, wait_at_most


async def test_an_event_already_set_is_reported_without_waiting() -> None:
    event = asyncio.Event()
    event.set()
    assert await wait_at_most(event, 60)


async def test_an_event_that_never_comes_is_reported_unset_once_the_time_is_up() -> None:
    assert not await wait_at_most(asyncio.Event(), 0.01)
    assert not await wait_at_most(asyncio.Event(), -1)  # a deadline already past: no wait


async def test_an_event_set_meanwhile_ends_the_wait() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await asyncio.wait_for(wait_at_most(event, 60), 10)


async def test_a_cancel_of_the_waiting_caller_is_raised_not_taken_for_the_time_being_up() -> None:
    waiter = asyncio.create_task(wait_at_most(asyncio.Event(), 60))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


def test_loops_that_pause_until_the_next_tick_wake_at_the_same_moments() -> None:
    interval, phase = 0.1, 0.037
    for _ in range(50):
        now = time.monotonic()
        wait = until_next_tick(interval, phase)
        assert 0 < wait <= interval
        # The tick it waits for is on the grid: a whole number of intervals after the phase.
        ticks = (now + wait - phase) / interval
        assert abs(ticks - round(ticks)) < 0.02  # within 2 ms of a tick (the two clock reads differ a little)
