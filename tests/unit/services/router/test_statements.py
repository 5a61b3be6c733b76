"""The router's statement path over a fake coordinator: statements forwarded to the
coordinator share the request's deadline, so a request of many slow statements ends with the
router's own DEADLINE_EXCEEDED (saying what to do) before the client's deadline passes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.router.statements import Statements
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import ErrorKind, MillpondError


class SlowCoordinator:
    """Answers every statement after ``delay_s``, honouring the caller's timeout as gRPC would."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.timeouts: list[float] = []

    async def ExecuteStatement(self, request: coordinator_pb2.ExecuteStatementRequest,
                               timeout: float) -> coordinator_pb2.ExecuteStatementResponse:  # noqa: ASYNC109 (a stub)
        self.timeouts.append(timeout)
        await asyncio.sleep(min(self.delay_s, timeout))
        if self.delay_s > timeout:
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "Deadline Exceeded")
        return coordinator_pb2.ExecuteStatementResponse()


class FakeCoordinators:
    def __init__(self, stub: SlowCoordinator):
        self.leader = 0
        self.stubs = [stub]


def statements(stub: SlowCoordinator) -> Statements:
    return Statements(RouterSettings(), Metastore(), None, FakeCoordinators(stub), None)  # type: ignore[arg-type]


async def test_a_forwarded_statement_gets_the_time_left_not_the_routers_whole_timeout() -> None:
    stub = SlowCoordinator(0.0)
    await statements(stub).execute("SHOW STREAMS; SHOW TABLES;", {}, time_remaining=1.0)
    assert len(stub.timeouts) == 2 and all(t <= 1.0 for t in stub.timeouts)


async def test_a_request_that_outlasts_its_deadline_ends_with_deadline_exceeded() -> None:
    started = time.monotonic()
    with pytest.raises(MillpondError) as raised:
        await statements(SlowCoordinator(5.0)).execute("SHOW STREAMS; SHOW TABLES;", {}, time_remaining=0.5)
    error: Any = raised.value
    assert error.kind is ErrorKind.DEADLINE, error.message
    assert "did not answer within the request's time left" in error.message and "before you retry" in error.message
    assert time.monotonic() - started < 0.5


async def test_a_statement_is_not_sent_once_the_request_is_out_of_time() -> None:
    stub = SlowCoordinator(0.0)
    with pytest.raises(MillpondError) as raised:
        await statements(stub).execute("SHOW STREAMS;", {}, time_remaining=0.01)
    assert raised.value.kind is ErrorKind.DEADLINE and "send fewer statements" in raised.value.message
    assert stub.timeouts == []
