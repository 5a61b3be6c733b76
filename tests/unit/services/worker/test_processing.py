"""The worker's processing loop: tasks run on a thread of their own, so a commit that holds
its loop never holds up the loop that serves; crossing between the loops keeps asyncio's
meaning (results, errors, and a cancel that waits for the cancelled work to end)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from millpond.services.worker import assignment
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.processing import ProcessingLoop
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from tests.unit.services.worker.fake_spark import COLD_SPARK


@pytest.fixture
def processing() -> Iterator[ProcessingLoop]:
    loop = ProcessingLoop()
    loop.start()
    yield loop
    loop.stop()


async def test_a_coroutine_runs_on_the_processing_thread_and_returns_or_raises(processing: ProcessingLoop) -> None:
    async def where() -> str:
        return threading.current_thread().name

    async def fails() -> None:
        raise ValueError("bad batch")

    assert await processing.run(where()) == "millpond-processing"
    with pytest.raises(ValueError, match="bad batch"):
        await processing.run(fails())


async def test_a_blocked_processing_loop_does_not_hold_up_the_serving_loop(processing: ProcessingLoop) -> None:
    """A commit that does not yield (a merge, a RocksDB write) blocks only its own loop."""
    async def commit() -> None:
        time.sleep(0.5)  # noqa: ASYNC251 - the point: a commit step that does not yield

    ticks = 0

    async def serve() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    server = asyncio.create_task(serve())
    await processing.run(commit())
    server.cancel()
    assert ticks >= 10  # about 50 when nothing else runs; 0 if the commit ran on this loop


async def test_cancelling_the_caller_cancels_the_work_and_waits_for_its_teardown(processing: ProcessingLoop) -> None:
    started, closed = threading.Event(), threading.Event()

    async def task() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # a teardown that takes a while
            closed.set()

    caller = asyncio.create_task(processing.run(task()))
    await asyncio.to_thread(started.wait, 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert closed.is_set()  # the cancel came back only once the teardown had run


async def test_an_assignment_taken_on_the_serving_loop_wakes_the_reconcile(processing: ProcessingLoop,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``take`` and ``changed`` are called from the serving loop; the reconcile loop waits on
    the processing loop and must wake at once, not at its poll (a minute here)."""
    monkeypatch.setattr(assignment, "RECONCILE_EVERY_S", 60.0)
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), Metastore(), COLD_SPARK)  # type: ignore[arg-type]
    woken = threading.Event()
    reconcile = tasks._reconcile

    async def observed() -> None:
        await reconcile()
        if tasks.generation == 7:
            woken.set()

    tasks._reconcile = observed  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(processing.run(tasks.run(stop)))
    await asyncio.sleep(0.1)  # the reconcile loop is waiting
    tasks.take(7, {}, set())
    assert await asyncio.to_thread(woken.wait, 30)  # well before the poll
    stop.set()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
