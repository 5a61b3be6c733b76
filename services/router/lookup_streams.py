"""Key lookups to the workers over one long-lived stream per worker, many to a message.

A unary call per lookup costs the router more than the rest of the pull together (gRPC's
call set-up is most of its CPU under load). Here each worker has one ``LookupStream``: the
lookups that wait for a worker while the router's loop is busy leave as one ``LookupBatch``
when its sender next runs, and the worker answers them in order. Under load many lookups
share a message; alone, a lookup costs one message each way.

Each lookup has an id (growing along the stream) so its answer finds it, however the worker
splits the answers. A lookup that is not answered within its timeout, or whose stream fails,
is an ``UnavailableError`` (the next copy is asked, as after a failed unary call); its answer,
if it comes later, is dropped. A worker of an earlier version (no ``LookupStream``) is asked
with the unary ``Lookup``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
MAX_UNANSWERED = 1
"""Messages sent to a worker and not yet answered in full, at most: the lookups that come
meanwhile wait and leave together once the answers are in (a lone lookup leaves at once).
Without it each lookup left alone as soon as it came, one message per lookup under any load."""
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED})
"""Statuses that mean "ask another copy"."""

LookupCall: TypeAlias = "grpc.aio.StreamStreamCall[worker_pb2.LookupBatch, worker_pb2.LookupAnswers]"


class _Unimplemented(Exception):
    """The worker has no LookupStream: ask it with the unary call."""


def failover_error(code: grpc.StatusCode, message: str) -> MillpondError:
    """UnavailableError for a status that means "ask another copy"; the status's error otherwise."""
    if code in FAILOVER_CODES:
        return UnavailableError(message or code.name)
    return error_of_status(code, message)


class LookupStream:
    """One worker's lookup stream: opened by the first lookup, opened again by the first
    after it failed."""

    def __init__(self, endpoint: str, open_call: Callable[[], LookupCall]):
        self.endpoint = endpoint
        self._open_call = open_call
        self._next_id = 0
        """The next lookup's id (never reused, across the streams one after another)."""
        self._waiting: list[worker_pb2.LookupRequest] = []
        self._first_waiting = 0
        """The id of ``_waiting[0]``."""
        self._pending: dict[int, asyncio.Future[worker_pb2.LookupResponse]] = {}
        """Lookups sent or waiting to be, by id, until answered, timed out or failed."""
        self._unanswered: deque[int] = deque()
        """The end (last id + 1) of each message sent and not yet answered in full, oldest first."""
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self.unimplemented = False
        """The worker answered UNIMPLEMENTED: it is of an earlier version."""

    async def lookup(self, request: worker_pb2.LookupRequest, within_s: float) -> worker_pb2.LookupResponse:
        """The worker's answer to ``request`` within ``within_s`` seconds; UnavailableError
        when it does not come (or the worker cannot answer), the worker's error otherwise."""
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        lookup_id = self._next_id
        self._next_id += 1
        answer = self._pending[lookup_id] = asyncio.get_running_loop().create_future()
        self._waiting.append(request)
        self._wake.set()
        try:
            async with asyncio.timeout(within_s):
                response: worker_pb2.LookupResponse = await answer
                return response
        except TimeoutError:
            raise UnavailableError(f"no answer from {self.endpoint} within {round(within_s * 1000)} ms") from None
        finally:
            self._pending.pop(lookup_id, None)

    async def close(self) -> None:
        """End the stream; lookups still waiting fail as UnavailableError."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner

    async def _run(self) -> None:
        """Send the waiting lookups as one batch each time there are some, while reading the
        answers; when the stream ends, fail what is pending and leave the next lookup to open
        another."""
        call = self._open_call()
        reader = asyncio.create_task(self._read(call))
        reader.add_done_callback(lambda _: self._wake.set())
        error: BaseException = UnavailableError(f"the lookup stream to {self.endpoint} ended")
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if reader.done():
                    break
                while self._waiting and len(self._unanswered) < MAX_UNANSWERED:
                    lookups, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                    batch = worker_pb2.LookupBatch(first_id=self._first_waiting, lookups=lookups)
                    self._first_waiting += len(lookups)
                    self._unanswered.append(self._first_waiting)
                    metrics.LOOKUP_BATCH.observe(len(lookups))
                    await call.write(batch)
            if not reader.cancelled() and (failure := reader.exception()) is not None:
                error = failure
        except grpc.aio.AioRpcError as err:
            error = err
        except asyncio.InvalidStateError:  # written after the call ended: the reader says why
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            if not reader.cancelled() and (failure := reader.exception()) is not None:
                error = failure
        except asyncio.CancelledError:
            error = UnavailableError(f"the lookup stream to {self.endpoint} was closed")
            raise
        finally:
            call.cancel()
            reader.cancel()
            self._runner = None
            self._fail(error)

    async def _read(self, call: LookupCall) -> None:
        """Hand each answer to its lookup, while the stream lasts."""
        pending, unanswered = self._pending, self._unanswered
        async for message in call:
            first = message.first_id
            end = first + len(message.answers)
            if unanswered and unanswered[0] <= end:
                while unanswered and unanswered[0] <= end:
                    unanswered.popleft()
                self._wake.set()  # the lookups that waited meanwhile may go
            for i, answer in enumerate(message.answers):
                future = pending.get(first + i)
                if future is None or future.done():
                    continue  # timed out meanwhile
                if answer.code:
                    future.set_exception(failover_error(code_of_number(answer.code), answer.message))
                else:
                    future.set_result(answer.response)

    def _fail(self, error: BaseException) -> None:
        """Every lookup still pending fails: the stream they were on has ended."""
        if isinstance(error, grpc.aio.AioRpcError):
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unimplemented = True
                error = _Unimplemented()
            else:
                error = failover_error(error.code(), f"{self.endpoint}: {error.details() or error.code().name}")
        elif not isinstance(error, MillpondError):
            log.warning("lookup stream failed", extra={"endpoint": self.endpoint}, exc_info=error)
            error = UnavailableError(f"the lookup stream to {self.endpoint} failed: {error!r}")
        pending, self._pending, self._waiting, self._first_waiting = self._pending, {}, [], self._next_id
        self._unanswered = deque()
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


class LookupStreams:
    """The router's lookup streams, one per worker, over the shared channels."""

    def __init__(self, channels: ChannelFactory):
        self.channels = channels
        self._streams: dict[str, LookupStream] = {}

    def _stub(self, endpoint: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self.channels.stub(endpoint, worker_pb2_grpc.WorkerServiceStub)

    async def lookup(self, endpoint: str, request: worker_pb2.LookupRequest, within_s: float) -> worker_pb2.LookupResponse:
        """Worker ``endpoint``'s answer to ``request`` within ``within_s`` seconds (see
        ``LookupStream.lookup``)."""
        stream = self._streams.get(endpoint)
        if stream is None:
            stream = self._streams[endpoint] = LookupStream(endpoint, lambda: self._stub(endpoint).LookupStream())
        if not stream.unimplemented:
            try:
                return await stream.lookup(request, within_s)
            except _Unimplemented:
                pass
        try:
            response: worker_pb2.LookupResponse = await self._stub(endpoint).Lookup(request, timeout=within_s)
            return response
        except grpc.aio.AioRpcError as err:
            raise failover_error(err.code(), err.details() or "") from None

    async def close(self) -> None:
        """End every stream."""
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams))
