"""Key lookups to the workers over one long-lived stream per worker, many to a message.

A unary call per lookup costs the router more than the rest of the pull together (gRPC's
call set-up is most of its CPU under load). Here each worker has one ``LookupStream``: the
lookups that wait for a worker while the router's loop is busy leave as one ``LookupStreamRequest``
when its sender next runs, and the worker answers them in order. Under load many lookups
share a message; alone, a lookup costs one message each way.

Each lookup has an id (growing along the stream) so its answer finds it, however the worker
splits the answers; one whose caller stopped waiting before it was sent is not sent. A
lookup that is not answered within its timeout, or whose stream fails (whatever the status),
is an ``UnavailableError`` (the next copy is asked, as after a failed unary call); its answer,
if it comes later, is dropped. A stream whose oldest message has waited longer than the
router's host timeout is given up and the next lookup opens another (a lookup whose client
has less time left fails alone). A worker of an earlier
version (no ``LookupStream``: UNIMPLEMENTED before any message) is asked with the unary
``Lookup``, as is a lookup that may wait for its consistency token (``wait_ms``): the stream
answers its lookups at once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

import grpc

from millpond.shared import metrics
from millpond.shared.errors import MillpondError, UnavailableError
from millpond.shared.rpc.status import code_of_number, error_of_status
from millpond.shared.rpc.tls import ChannelFactory
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

MAX_BATCH = 512
"""The most lookups one message carries."""
BATCH_BYTES = 1 << 20
"""A message carries lookups up to about this size (or one, when it alone is larger)."""
RETRY_STREAM_AFTER_S = 60.0
"""A worker that answered UNIMPLEMENTED is asked with unary calls this long, then the
stream is tried again (it may have been upgraded in place)."""
MAX_UNANSWERED = 1
"""Messages sent to a worker and not yet answered in full, at most: the lookups that come
meanwhile wait and leave together once the answers are in (a lone lookup leaves at once).
Without it each lookup left alone as soon as it came, one message per lookup under any load."""
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED})
"""Statuses that mean "ask another copy"."""

LookupCall: TypeAlias = "grpc.aio.StreamStreamCall[worker_pb2.LookupStreamRequest, worker_pb2.LookupStreamResponse]"


class _Unimplemented(Exception):
    """The worker has no LookupStream: ask it with the unary call."""


def failover_error(code: grpc.StatusCode, message: str) -> MillpondError:
    """UnavailableError for a status that means "ask another copy"; the status's error otherwise."""
    if code in FAILOVER_CODES:
        return UnavailableError(message or code.name)
    return error_of_status(code, message)


class _Session:
    """One stream's state: the lookups it carries and the task that runs it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, worker_pb2.LookupRequest]] = []
        """Lookups not yet sent, with their ids."""
        self.pending: dict[int, asyncio.Future[worker_pb2.LookupResponse]] = {}
        """Lookups sent or waiting to be, by id, until answered, timed out or failed."""
        self.unanswered: deque[tuple[int, float]] = deque()
        """Each message sent and not yet answered in full: its last id and when it left, oldest first."""
        self.wake = asyncio.Event()
        self.opened_at = time.monotonic()
        self.serving = False
        """The worker has sent the stream's headers (it serves it)."""
        self.runner: asyncio.Task[None] | None = None

    def stuck(self, lookup_id: int, within_s: float, stuck_after_s: float) -> bool:
        """Whether the stream has failed lookup ``lookup_id``, which waited ``within_s`` in
        vain: its oldest unanswered message (or, before the worker sent the stream's headers,
        the stream itself) has waited ``stuck_after_s``, or the lookup had that long and its
        own message is unanswered. A lookup given less time fails alone."""
        now = time.monotonic()
        if self.unanswered:
            return now - self.unanswered[0][1] >= stuck_after_s or (
                within_s >= stuck_after_s and lookup_id <= self.unanswered[0][0])
        return not self.serving and now - self.opened_at >= stuck_after_s


class LookupStream:
    """One worker's lookup stream: opened by the first lookup, opened again by the first
    after it failed or was given up."""

    def __init__(self, endpoint: str, open_call: Callable[[], LookupCall]):
        self.endpoint = endpoint
        self._open_call = open_call
        self._next_id = 0
        """The next lookup's id (never reused, across the streams one after another)."""
        self._session: _Session | None = None
        self.unimplemented_until = 0.0
        """Until when the worker is asked with unary calls (it answered UNIMPLEMENTED)."""
        self.closed = False

    async def lookup(self, request: worker_pb2.LookupRequest, within_s: float,
                     stuck_after_s: float | None = None) -> worker_pb2.LookupResponse:
        """The worker's answer to ``request`` within ``within_s`` seconds; UnavailableError
        when it does not come (or the worker cannot answer), the worker's error otherwise. The
        stream is given up when it is stuck ``stuck_after_s`` (default ``within_s``), not when
        one caller's time is short: a client whose deadline leaves 5 ms failed every other
        client's lookups on the stream."""
        if self.closed:
            raise UnavailableError(f"the lookup stream to {self.endpoint} is closed: the router is stopping")
        session = self._session
        if session is None:
            session = self._session = _Session()
            session.runner = asyncio.create_task(self._run(session))
        lookup_id = self._next_id
        self._next_id += 1
        answer = session.pending[lookup_id] = asyncio.get_running_loop().create_future()
        session.waiting.append((lookup_id, request))
        session.wake.set()
        try:
            async with asyncio.timeout(within_s):
                response: worker_pb2.LookupResponse = await answer
                return response
        except TimeoutError:
            if session.stuck(lookup_id, within_s, within_s if stuck_after_s is None else stuck_after_s):
                self._give_up(session)  # the next lookup opens another stream
            raise UnavailableError(f"no answer from {self.endpoint} within {round(within_s * 1000)} ms") from None
        finally:
            session.pending.pop(lookup_id, None)
            if answer.done() and not answer.cancelled():
                answer.exception()  # retrieved, when it failed as the caller stopped waiting

    def _give_up(self, session: _Session) -> None:
        """End ``session``'s stream; lookups from now on go to a new one."""
        if self._session is session:
            self._session = None
        if session.runner is not None:
            session.runner.cancel()

    async def close(self) -> None:
        """End the stream for good; lookups still waiting fail as UnavailableError."""
        self.closed = True
        session = self._session
        if session is not None and session.runner is not None:
            self._give_up(session)
            with contextlib.suppress(asyncio.CancelledError):
                await session.runner

    async def _run(self, session: _Session) -> None:
        """Send the waiting lookups as one batch each time there are some and no message is
        unanswered, while reading the answers; when the stream ends, fail what is pending and
        leave the next lookup to open another."""
        reason = f"the lookup stream to {self.endpoint} ended"
        call: LookupCall | None = None
        reader: asyncio.Task[None] | None = None
        try:
            call = self._open_call()
            await call.initial_metadata()  # the worker serves the stream, or the call has ended
            if call.done():
                if await call.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.unimplemented_until = time.monotonic() + RETRY_STREAM_AFTER_S
                    reason = ""
                else:
                    reason = f"{self.endpoint}: {await call.details() or (await call.code()).name}"
                return
            session.serving = True
            reader = asyncio.create_task(self._read(call, session))
            reader.add_done_callback(lambda _: session.wake.set())
            while True:
                await session.wake.wait()
                session.wake.clear()
                if reader.done():
                    break
                if len(session.unanswered) < MAX_UNANSWERED:
                    await self._send(call, session)
            if not reader.cancelled() and (failure := reader.exception()) is not None:
                reason = _reason(self.endpoint, failure)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            reason = _reason(self.endpoint, err)
        except asyncio.CancelledError:
            reason = f"the lookup stream to {self.endpoint} was given up"
            raise
        finally:
            if call is not None:
                call.cancel()
            if reader is not None:
                reader.cancel()
            if self._session is session:
                self._session = None
            _fail(session, reason)

    @staticmethod
    async def _send(call: LookupCall, session: _Session) -> None:
        """The waiting lookups whose callers still wait, as one message (bounded by
        ``MAX_BATCH`` and ``BATCH_BYTES``)."""
        pending = session.pending
        batch = worker_pb2.LookupStreamRequest()
        size, taken = 0, 0
        for lookup_id, request in session.waiting:
            if lookup_id not in pending:
                taken += 1
                continue  # timed out or cancelled before it left
            request_size = request.ByteSize() + 16
            if batch.ids and (len(batch.ids) >= MAX_BATCH or size + request_size > BATCH_BYTES):
                break
            batch.ids.append(lookup_id)
            batch.lookups.append(request)
            size += request_size
            taken += 1
        del session.waiting[:taken]
        if not batch.ids:
            return
        session.unanswered.append((batch.ids[-1], time.monotonic()))
        metrics.LOOKUP_BATCH.observe(len(batch.ids))
        await call.write(batch)

    @staticmethod
    async def _read(call: LookupCall, session: _Session) -> None:
        """Hand each answer to its lookup, while the stream lasts."""
        pending, unanswered = session.pending, session.unanswered
        async for message in call:
            for lookup_id, answer in zip(message.ids, message.answers, strict=True):
                future = pending.get(lookup_id)
                if future is None or future.done():
                    continue  # timed out meanwhile
                if answer.code:
                    future.set_exception(failover_error(code_of_number(answer.code), answer.message))
                else:
                    future.set_result(answer.response)
            if message.ids and unanswered and unanswered[0][0] <= message.ids[-1]:
                while unanswered and unanswered[0][0] <= message.ids[-1]:
                    unanswered.popleft()
                session.wake.set()  # the lookups that waited meanwhile may go


def _fail(session: _Session, reason: str) -> None:
    """Every lookup still pending on ``session`` fails (as UnavailableError, so the next copy
    is asked; with no ``reason``, the worker has no stream: the unary call is made instead)."""
    pending, session.pending, session.waiting = session.pending, {}, []
    for future in pending.values():
        if not future.done():
            future.set_exception(UnavailableError(reason) if reason else _Unimplemented())


def _reason(endpoint: str, error: BaseException) -> str:
    """Why a stream ended, for the lookups it fails."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{endpoint}: {error.details() or error.code().name}"
    if not isinstance(error, asyncio.InvalidStateError):
        log.warning("lookup stream failed", extra={"endpoint": endpoint}, exc_info=error)
    return f"the lookup stream to {endpoint} failed: {error!r}"


class LookupStreams:
    """The router's lookup streams, one per worker, over the shared channels."""

    def __init__(self, channels: ChannelFactory):
        self.channels = channels
        self._streams: dict[str, LookupStream] = {}
        self.closed = False

    def _stub(self, endpoint: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self.channels.stub(endpoint, worker_pb2_grpc.WorkerServiceStub)

    async def lookup(self, endpoint: str, request: worker_pb2.LookupRequest, within_s: float,
                     stuck_after_s: float | None = None) -> worker_pb2.LookupResponse:
        """Worker ``endpoint``'s answer to ``request`` within ``within_s`` seconds (see
        ``LookupStream.lookup``)."""
        if self.closed:
            raise UnavailableError("the router is stopping")
        stream = self._streams.get(endpoint)
        if stream is None:
            stream = self._streams[endpoint] = LookupStream(endpoint, lambda: self._stub(endpoint).LookupStream())
        started = time.monotonic()
        # A lookup that may wait goes alone (the stream answers its lookups at once, in order).
        if request.wait_ms <= 0 and time.monotonic() >= stream.unimplemented_until:
            try:
                return await stream.lookup(request, within_s, stuck_after_s)
            except _Unimplemented:
                pass
        try:
            response: worker_pb2.LookupResponse = await self._stub(endpoint).Lookup(
                request, timeout=max(within_s - (time.monotonic() - started), 0.001))
            return response
        except grpc.aio.AioRpcError as err:
            raise failover_error(err.code(), err.details() or "") from None

    async def close(self) -> None:
        """End every stream for good (after the server has stopped: no request waits on one)."""
        self.closed = True
        await asyncio.gather(*(s.close() for s in self._streams.values()))
