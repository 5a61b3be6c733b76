"""The worker's gRPC endpoints: local lookups and scans of the tables it materializes.

The servicer is given the local tables it serves (constructor injection) and knows nothing
of the worker's wiring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Protocol

import grpc

from millpond.common.v1 import rows_pb2, status_pb2
from millpond.services.router.pull import LookupAnswer
from millpond.services.worker.converters import row_to_proto
from millpond.services.worker.serving import LocalCopy, scan
from millpond.shared.errors import MillpondError, StatementError
from millpond.shared.kafka.serde import add_values, as_sent
from millpond.shared.rpc.status import code_number, grpc_errors, grpc_stream_errors, status_code
from millpond.shared.sql.planner import SelectPlan
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)
ANSWERS_BYTES = 1 << 20
"""A LookupStream message holds answers up to about this size; more go on in the next."""
STAGE_WAIT_S = 30.0
"""The longest a StagePositions call waits for its tasks (less when its deadline is sooner)."""
TAKE_OVER_WAIT_S = 10.0
"""The longest a PrepareTakeOver call waits for the queries it asks for (less when its deadline
is sooner)."""
STAGE_ANSWER_S = 0.1
"""What a StagePositions call, or a lookup or scan waiting for its token, keeps of its
deadline to answer why it could not wait longer."""
_INTERNAL = code_number(grpc.StatusCode.INTERNAL)


def _token_wait_s(wait_ms: int, context: grpc.aio.ServicerContext | None) -> float:
    """How long a call that may wait ``wait_ms`` for its token waits: until a little before the
    call's deadline (``context``'s) at most, so its caller gets the reason."""
    remaining_s = context.time_remaining() if context is not None else None
    return wait_ms / 1000 if remaining_s is None else min(wait_ms / 1000, remaining_s - STAGE_ANSWER_S)


class Tables(Protocol):
    """The local table copies that answer pull queries (the worker's ``LocalTables``)."""

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        """The copy of a table partition here that may answer, or UnavailableError."""

    async def reached_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int,
                            wait_s: float) -> LocalCopy:
        """``local_table``, waiting up to ``wait_s`` for a copy behind ``min_input_offset``."""

    async def select(self, table: str, statement: str, query_id: str = "", columns: tuple[str, ...] = ()) -> SelectPlan:
        """The plan of a pull query of ``table`` shipped with a scan (StatementError when it is not one)."""

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""

    async def stage_positions(self, query_id: str, stage: str, input_offsets: Mapping[int, int],
                              timeout_s: float) -> tuple[str, dict[int, int]]:
        """The topic a stage writes and how far its tasks here had written to it once they
        committed ``input_offsets`` (UnavailableError when they are not here or not in time)."""

    async def prepare_take_over(self, keys: Sequence[tuple[str, int]], worker_id: str,
                                wait_s: float) -> list[tuple[str, int]]:
        """Have the Spark queries of these (query id, partition), which ``worker_id`` hands over
        as it leaves, standing by; those that do, within ``wait_s``."""


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """Implements ``millpond.worker.v1.WorkerService``."""

    def __init__(self, tables: Tables, max_scan_rows: int):
        self.tables = tables
        self.max_scan_rows = max_scan_rows
        """The most rows one Scan reads (WorkerSettings.max_scan_rows)."""
        self._stopping = asyncio.Event()

    def end_lookup_streams(self) -> None:
        """End every LookupStream (and refuse new ones) before the server stops, which would
        otherwise wait its whole grace for these calls that never end by themselves."""
        self._stopping.set()

    @grpc_errors
    async def Lookup(self, request: worker_pb2.LookupRequest, context: grpc.aio.ServicerContext) -> worker_pb2.LookupResponse:
        return self.lookup_now(request, await self._reached(request, context))

    @grpc_stream_errors
    async def LookupStream(self, requests: AsyncIterator[worker_pb2.LookupStreamRequest],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[worker_pb2.LookupStreamResponse]:
        # Headers at once: a router learns the stream is served before it writes (a worker
        # without LookupStream answers UNIMPLEMENTED there instead).
        await context.send_initial_metadata(())
        batches = aiter(requests)
        stopping = asyncio.ensure_future(self._stopping.wait())
        following: asyncio.Future[worker_pb2.LookupStreamRequest] | None = None
        try:
            while not stopping.done():
                following = asyncio.ensure_future(anext(batches))
                await asyncio.wait((following, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    return  # the router's next lookup finds this worker stopping and asks another copy
                try:
                    batch = following.result()
                except StopAsyncIteration:
                    return
                for answers in self.answers(batch):
                    yield answers
        finally:
            stopping.cancel()
            if following is not None:
                following.cancel()

    def answers(self, batch: worker_pb2.LookupStreamRequest) -> Iterator[worker_pb2.LookupStreamResponse]:
        """Each lookup of ``batch`` answered as the unary Lookup would, in order, in messages
        of at most ``ANSWERS_BYTES`` (or one answer, when it alone is larger); a failed
        lookup is its status, the others still answer."""
        out, size = worker_pb2.LookupStreamResponse(), 0
        for lookup_id, request in zip(batch.ids, batch.lookups, strict=True):
            answer = worker_pb2.LookupAnswer()
            try:
                answer.response.CopyFrom(self.lookup_now(request))
            except MillpondError as err:
                answer.code, answer.message = code_number(status_code(err.kind)), err.message
            except Exception:
                log.exception("lookup failed", extra={"table": request.table, "partition": request.partition})
                answer.code, answer.message = _INTERNAL, "internal error; see the service log"
            answer_size = answer.ByteSize() + 16  # with its id and the field tags
            if out.answers and size + answer_size > ANSWERS_BYTES:
                yield out
                out, size = worker_pb2.LookupStreamResponse(), 0
            out.ids.append(lookup_id)
            out.answers.append(answer)
            size += answer_size
        yield out

    @grpc_stream_errors
    async def ScanPages(self, request: worker_pb2.ScanPagesRequest,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[worker_pb2.ScanPagesResponse]:
        async for page in self.scan(request, context):
            yield page

    @grpc_errors
    async def Scan(self, request: worker_pb2.ScanRequest, context: grpc.aio.ServicerContext) -> worker_pb2.ScanResponse:
        """Every page of ``scan`` in one message, the rows decoded: what routers of earlier
        versions ask (with no statement: every row as it is)."""
        rows: list[rows_pb2.Row] = []
        positions: dict[int, int] = {}
        whole = worker_pb2.ScanPagesRequest(table=request.table, partitions=request.partitions, limit=request.limit,
                                            allow_standby=request.allow_standby,
                                            min_input_offsets=request.min_input_offsets)
        async for page in self.scan(whole):
            rows += rows_pb2.StatementResult.FromString(page.rows).rows
            positions.update(page.input_offsets)
        return worker_pb2.ScanResponse(rows=rows, input_offsets=positions)

    async def lookup(self, request: worker_pb2.LookupRequest) -> LookupAnswer:
        """One key of a local copy, in-process (the values as ``Lookup`` sends them, without
        building its message, and waiting as it does); UnavailableError when no copy here may answer."""
        row, input_offset = self._row(request, await self._reached(request))
        return LookupAnswer(None if row is None else [as_sent(v) for v in row], input_offset)

    def lookup_now(self, request: worker_pb2.LookupRequest, copy: LocalCopy | None = None) -> worker_pb2.LookupResponse:
        """``Lookup``'s answer from ``copy`` (or the copy here now: no wait)."""
        row, input_offset = self._row(request, copy)
        if row is None:
            return worker_pb2.LookupResponse(found=False, input_offset=input_offset)
        return worker_pb2.LookupResponse(found=True, row=row_to_proto(row), input_offset=input_offset)

    async def _reached(self, request: worker_pb2.LookupRequest,
                       context: grpc.aio.ServicerContext | None = None) -> LocalCopy | None:
        """The copy a lookup that may wait (``wait_ms``) waited for; None for one that may not."""
        if request.wait_ms <= 0:
            return None
        return await self.tables.reached_table(request.table, request.partition, request.allow_standby,
                                               request.min_input_offset, _token_wait_s(request.wait_ms, context))

    async def _scan_reached(self, request: worker_pb2.ScanPagesRequest,
                            context: grpc.aio.ServicerContext | None = None) -> None:
        """Wait, as a lookup does, for each copy a scan that may wait (``wait_ms``) reads to
        reach its partition's token position, all within the one wait."""
        deadline = time.monotonic() + _token_wait_s(request.wait_ms, context)
        for partition in request.partitions:
            if (offset := request.min_input_offsets.get(partition, 0)) > 0:
                await self.tables.reached_table(request.table, partition, request.allow_standby, offset,
                                                deadline - time.monotonic())

    def _row(self, request: worker_pb2.LookupRequest, copy: LocalCopy | None = None) -> tuple[list[Any] | None, int]:
        """The requested key's row in a local copy (``copy``, or the one ``local_table`` finds;
        None: no state, or a row the table's HAVING drops) and the copy's input position;
        UnavailableError as ``lookup``."""
        if copy is None:
            copy = self.tables.local_table(request.table, request.partition, request.allow_standby,
                                           request.min_input_offset)
        state = copy.store.get(request.key)
        return None if state is None else copy.row(request.key, state), copy.input_offset

    async def scan(self, request: worker_pb2.ScanPagesRequest, context: grpc.aio.ServicerContext | None = None
                   ) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
        """The result rows of local copies of the requested partitions under the request's
        statement, a page per message, once their copies reached the token (waiting as
        ``lookup`` does); UnavailableError as ``lookup``. A page is read when the
        caller asks for the next message: in-process at once, over gRPC as soon as its
        transport takes the last (HTTP/2 flow control bounds what is in flight), so a caller
        that stops reading stops the scan once its window is full."""
        plan = (await self.tables.select(request.table, request.statement, request.query_id, tuple(request.columns))
                if request.statement else None)
        if request.wait_ms > 0:
            await self._scan_reached(request, context)

        def copy_of(partition: int) -> LocalCopy:
            return self.tables.local_table(request.table, partition, request.allow_standby,
                                           request.min_input_offsets.get(partition, 0))

        # Page by page, so the loop that serves (and beats the coordinators) is never held up for long.
        async for page in scan(request.table, copy_of, request.partitions, request.limit, self.max_scan_rows, plan):
            rows = rows_pb2.StatementResult()
            add_row = rows.rows.add
            for values in page.rows:
                add_values(add_row().values, values)
            yield worker_pb2.ScanPagesResponse(rows=rows.SerializeToString(), row_count=len(page.rows),
                                      input_offsets={page.partition: page.input_offset})

    @grpc_errors
    async def SetStandbyReplay(self, request: worker_pb2.SetStandbyReplayRequest,
                               context: grpc.aio.ServicerContext) -> worker_pb2.SetStandbyReplayResponse:
        position = self.tables.set_standby_replay(request.query_id, request.partition, request.paused)
        return worker_pb2.SetStandbyReplayResponse(changelog_offset=position)

    @grpc_errors
    async def PrepareTakeOver(self, request: worker_pb2.PrepareTakeOverRequest,
                              context: grpc.aio.ServicerContext) -> worker_pb2.PrepareTakeOverResponse:
        if not request.tasks or any(not t.query_id for t in request.tasks) or not request.from_worker_id:
            raise StatementError("PrepareTakeOver needs the tasks (query_id and partition) about to move here and "
                                 "the from_worker_id of the worker that hands them over")
        remaining = context.time_remaining()
        wait = TAKE_OVER_WAIT_S if remaining is None else min(max(remaining - STAGE_ANSWER_S, 0.0), TAKE_OVER_WAIT_S)
        keys = [(t.query_id, t.partition) for t in request.tasks]
        began = time.monotonic()
        standing = await self.tables.prepare_take_over(keys, request.from_worker_id, wait)
        log.info("take-over prepared", extra={"from_worker": request.from_worker_id, "tasks": sorted(keys),
                                              "standing_by": sorted(standing),
                                              "seconds": round(time.monotonic() - began, 3)})
        return worker_pb2.PrepareTakeOverResponse(
            standing_by=[status_pb2.TaskId(query_id=q, partition=p) for q, p in standing])

    @grpc_errors
    async def StagePositions(self, request: worker_pb2.StagePositionsRequest,
                             context: grpc.aio.ServicerContext) -> worker_pb2.StagePositionsResponse:
        if not request.query_id or not request.stage or not request.input_offsets:
            raise StatementError("StagePositions needs a query_id, a stage and the input_offsets to reach")
        # Done waiting a little before the caller's deadline, so it gets this answer's reason.
        remaining = context.time_remaining()
        wait = STAGE_WAIT_S if remaining is None else min(max(remaining - STAGE_ANSWER_S, 0.0), STAGE_WAIT_S)
        topic, ends = await self.tables.stage_positions(request.query_id, request.stage, request.input_offsets, wait)
        return worker_pb2.StagePositionsResponse(output_topic=topic, output_offsets=ends)
