"""The worker's gRPC endpoints: local lookups and scans of the tables it materializes."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

import grpc

from millpond.common.v1 import rows_pb2
from millpond.shared.kafka.serde import to_proto
from millpond.shared.rpc.status import grpc_errors
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

if TYPE_CHECKING:
    from millpond.services.worker.app import Worker


def _row(values: list[object]) -> rows_pb2.Row:
    return rows_pb2.Row(values=[to_proto(v) for v in values])


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """Implements ``millpond.worker.v1.WorkerService``."""

    def __init__(self, worker: Worker):
        self.worker = worker

    @grpc_errors
    async def Lookup(self, request: worker_pb2.LookupRequest, context: grpc.aio.ServicerContext) -> worker_pb2.LookupResponse:
        copy = self.worker.local_table(request.table, request.partition, request.allow_standby,
                                       request.min_input_offset)
        state = copy.store.get(request.key)
        if state is None:
            return worker_pb2.LookupResponse(found=False, input_offset=copy.input_offset)
        return worker_pb2.LookupResponse(found=True, row=_row(copy.row(request.key, state)),
                                         input_offset=copy.input_offset)

    @grpc_errors
    async def Scan(self, request: worker_pb2.ScanRequest, context: grpc.aio.ServicerContext) -> worker_pb2.ScanResponse:
        rows: list[rows_pb2.Row] = []
        positions: dict[int, int] = {}
        for partition in request.partitions:
            copy = self.worker.local_table(request.table, partition, request.allow_standby,
                                           request.min_input_offsets.get(partition, 0))
            positions[partition] = copy.input_offset
            items = copy.store.items()
            if request.limit:
                items = islice(items, max(request.limit - len(rows), 0))
            rows += [_row(copy.row(k, s)) for k, s in items]
        return worker_pb2.ScanResponse(rows=rows, input_offsets=positions)

    @grpc_errors
    async def SetStandbyReplay(self, request: worker_pb2.SetStandbyReplayRequest,
                               context: grpc.aio.ServicerContext) -> worker_pb2.SetStandbyReplayResponse:
        position = self.worker.set_standby_replay(request.query_id, request.partition, request.paused)
        return worker_pb2.SetStandbyReplayResponse(changelog_offset=position)
