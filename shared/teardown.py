"""Closing things under asyncio so that a cancel never skips a step and no step stalls the rest.

- ``run_to_end`` runs a teardown to its end although its caller is cancelled meanwhile, and
  re-raises the cancel after: the caller still learns it was cancelled, and nothing it opened
  stays open.
- ``bounded`` gives one step a time limit; a step that overruns is logged by name and
  cancelled, and the steps after it run anyway. What it was closing may stay open (there is
  no safe way to force it), but one stuck step costs only its limit.
- ``gather_or_cancel`` starts several things at once; when one fails or the caller is
  cancelled, the others are cancelled and awaited, so a teardown never runs under a start.
- ``cancel_and_wait`` stops a background job within a limit, leaving it to finish on its own
  (and logged) when it overruns.
- ``opened_in_thread`` opens something in a thread, so the loop goes on meanwhile; a caller
  cancelled meanwhile closes what the thread opened before the cancel is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_lingering: set[asyncio.Future[Any]] = set()
"""Jobs left to finish in the background: the loop holds tasks weakly, so they are kept here."""


def keep(job: asyncio.Future[Any]) -> None:
    """Hold a job until it is done (a pending task nobody references can be collected mid-await)."""
    if not job.done():
        _lingering.add(job)
        job.add_done_callback(_lingering.discard)


async def _outlast(job: asyncio.Future[Any]) -> bool:
    """Wait for ``job`` to end, whatever cancels come meanwhile; whether one came."""
    cancelled = False
    while not job.done():
        try:
            await asyncio.wait({job})  # unlike shield, never raises the job's error while we wait
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


async def outlast_for(job: asyncio.Future[Any], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``job`` to end, whatever cancels come meanwhile (the caller
    is being cancelled already), then cancel it if it has not; its outcome is not raised."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not job.done() and (left := deadline - asyncio.get_running_loop().time()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({job}, timeout=left)
    if not job.done():
        job.cancel()
        await _outlast(job)
    if not job.cancelled():
        job.exception()  # retrieved: a start that failed after its caller went is nobody's to report


async def run_to_end(aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end, even if the caller is cancelled meanwhile; the cancel is raised after."""
    job = asyncio.ensure_future(aw)
    if await _outlast(job):
        if not job.cancelled() and job.exception() is not None:
            log.warning("work run to its end after its caller was cancelled failed", exc_info=job.exception())
        raise asyncio.CancelledError
    return job.result()


async def bounded(aw: Awaitable[object], timeout_s: float, step: str, context: Mapping[str, object]) -> bool:
    """Run one teardown step for at most ``timeout_s``; whether it finished without error. An
    error is logged, and an overrun is logged with ``step`` and cancelled; neither is raised."""
    job = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({job}, timeout=timeout_s)
    except asyncio.CancelledError:
        keep(job)  # the caller gives up waiting; the step itself goes on
        raise
    if not job.done():
        log.error("teardown step overran its time limit; cancelled, moving on",
                  extra={**context, "step": step, "timeout_s": timeout_s})
        job.cancel()
        keep(job)
        return False
    if job.cancelled():
        log.error("teardown step was cancelled", extra={**context, "step": step})
        return False
    if (error := job.exception()) is not None:
        log.error("teardown step failed", exc_info=error, extra={**context, "step": step})
        return False
    return True


async def gather_or_cancel(*aws: Awaitable[T]) -> list[T]:
    """The results of ``aws``, run concurrently. When one fails (or the caller is cancelled),
    the others are cancelled and awaited before the first failure is raised: none is left
    running."""
    jobs = [asyncio.ensure_future(aw) for aw in aws]
    if not jobs:
        return []
    try:
        await asyncio.wait(jobs, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        unfinished = [job for job in jobs if not job.done()]
        for job in unfinished:
            job.cancel()
        if unfinished:
            await asyncio.wait(unfinished)
        # Read every error (none goes unretrieved); the first in order is raised.
        errors = [error for job in jobs if job.done() and not job.cancelled() and (error := job.exception()) is not None]
    if errors:
        raise errors[0]
    return [job.result() for job in jobs]


async def cancel_and_wait(job: asyncio.Future[Any], timeout_s: float, what: str, context: Mapping[str, object]) -> bool:
    """Cancel a background job and wait up to ``timeout_s`` for it to end; False (logged) when it
    overran: it is then left to finish on its own."""
    job.cancel()
    try:
        await asyncio.wait({job}, timeout=timeout_s)
    except asyncio.CancelledError:
        keep(job)
        raise
    if not job.done():
        log.error("stopping overran its time limit; it goes on in the background",
                  extra={**context, "what": what, "timeout_s": timeout_s})
        keep(job)
        return False
    if not job.cancelled() and (error := job.exception()) is not None:
        log.error("stopped with an error", exc_info=error, extra={**context, "what": what})
    return True


async def opened_in_thread(open_: Callable[[], T], close: Callable[[T], object]) -> T:
    """What ``open_()`` opens, run in a thread so that the loop goes on meanwhile (opening a
    RocksDB store takes 10-15 ms on an idle machine and 50-150 ms on a busy worker, where the
    commits of its other tasks waited behind it). A caller cancelled meanwhile waits for the
    open to end and closes what it opened, then is cancelled: once the cancel is seen, nothing
    opened stays open, and the next opener of the same store finds it free."""
    job = asyncio.ensure_future(asyncio.to_thread(open_))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await _outlast(job)
        if not job.cancelled() and job.exception() is None:
            close(job.result())
        raise
