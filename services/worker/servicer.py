"""The worker's gRPC endpoints: local lookups and scans of the tables it materializes.

The servicer is given the local tables it serves (constructor injection) and knows nothing
of the worker's wiring.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from millpond.common.v1 import rows_pb2
from millpond.services.worker.converters import row_to_proto
from millpond.services.worker.serving import LocalCopy, scan
from millpond.shared.rpc.status import grpc_errors
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc


class Tables(Protocol):
    """The local table copies that answer pull queries (the worker's ``LocalTables``)."""

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        """The copy of a table partition here that may answer, or UnavailableError."""

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """Implements ``millpond.worker.v1.WorkerService``."""

    def __init__(self, tables: Tables, max_scan_rows: int):
        self.tables = tables
        self.max_scan_rows = max_scan_rows
        """The most rows one Scan reads (WorkerSettings.max_scan_rows)."""

    @grpc_errors
    async def Lookup(self, request: worker_pb2.LookupRequest, context: grpc.aio.ServicerContext) -> worker_pb2.LookupResponse:
        return await self.lookup(request)

    @grpc_errors
    async def Scan(self, request: worker_pb2.ScanRequest, context: grpc.aio.ServicerContext) -> worker_pb2.ScanResponse:
        return await self.scan(request)

    async def lookup(self, request: worker_pb2.LookupRequest) -> worker_pb2.LookupResponse:
        """One key of a local copy; UnavailableError when no copy here may answer."""
        copy = self.tables.local_table(request.table, request.partition, request.allow_standby,
                                       request.min_input_offset)
        state = copy.store.get(request.key)
        if state is None:
            return worker_pb2.LookupResponse(found=False, input_offset=copy.input_offset)
        return worker_pb2.LookupResponse(found=True, row=row_to_proto(copy.row(request.key, state)),
                                         input_offset=copy.input_offset)

    async def scan(self, request: worker_pb2.ScanRequest) -> worker_pb2.ScanResponse:
        """Rows of local copies of the requested partitions; UnavailableError as ``lookup``."""
        rows: list[rows_pb2.Row] = []
        positions: dict[int, int] = {}

        def copy_of(partition: int) -> LocalCopy:
            return self.tables.local_table(request.table, partition, request.allow_standby,
                                           request.min_input_offsets.get(partition, 0))

        # Page by page, so the loop that serves (and beats the coordinators) is never held up for long.
        async for page in scan(request.table, copy_of, request.partitions, request.limit, self.max_scan_rows):
            positions[page.partition] = page.input_offset
            rows += [row_to_proto(values) for values in page.rows]
        return worker_pb2.ScanResponse(rows=rows, input_offsets=positions)

    @grpc_errors
    async def SetStandbyReplay(self, request: worker_pb2.SetStandbyReplayRequest,
                               context: grpc.aio.ServicerContext) -> worker_pb2.SetStandbyReplayResponse:
        position = self.tables.set_standby_replay(request.query_id, request.partition, request.paused)
        return worker_pb2.SetStandbyReplayResponse(changelog_offset=position)
