"""The worker's processing loop: an asyncio event loop on a thread of its own, where the
tasks run (Spark callbacks' merges, Kafka transactions, RocksDB writes, restores, standby
replay), apart from the loop that serves gRPC, beats the coordinators and reports lags.

A commit then never holds up a Lookup or a heartbeat for longer than the interpreter's
thread switch interval, instead of for the whole commit. What crosses between the loops:
coroutines submitted with ``run`` (cancelling the caller cancels them), callbacks with
``call_soon``, and reads of plain attributes (task states, offsets, lags) and of RocksDB,
which is safe from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from millpond.shared.teardown import run_to_end

log = logging.getLogger(__name__)
T = TypeVar("T")
JOIN_TIMEOUT_S = 10.0
"""How long ``stop`` waits for the loop's thread to end."""


class ProcessingLoop:
    """An event loop running on its own thread from ``start`` to ``stop``."""

    def __init__(self, name: str = "millpond-processing"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for job in pending:
                job.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the processing loop and await its result from the caller's
        loop. Cancelling the caller cancels it there and waits until it has ended (as
        cancelling a task and awaiting it would), then raises the cancel."""
        finished: concurrent.futures.Future[T] = concurrent.futures.Future()
        jobs: list[asyncio.Task[T]] = []

        def begin() -> None:
            job = self.loop.create_task(coroutine)
            jobs.append(job)
            job.add_done_callback(lambda done: _settle(done, finished))

        self.loop.call_soon_threadsafe(begin)
        waiting = asyncio.wrap_future(finished)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if waiting.done():
                raise
            self.loop.call_soon_threadsafe(lambda: jobs[0].cancel())  # after begin: callbacks run in order
            await run_to_end(asyncio.wait({waiting}))
            raise

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the processing loop (from any thread)."""
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        """End the loop (cancelling what still runs on it) and wait for its thread. Blocking."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("the processing loop did not end", extra={"timeout_s": JOIN_TIMEOUT_S})


def _settle(job: asyncio.Task[T], finished: concurrent.futures.Future[T]) -> None:
    """Pass a processing-loop task's outcome to the future its caller awaits."""
    if job.cancelled():
        finished.cancel()
    elif (error := job.exception()) is not None:
        finished.set_exception(error)
    else:
        finished.set_result(job.result())
