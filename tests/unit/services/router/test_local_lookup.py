"""Co-located routing's key lookups: a pull whose first qualified copy is the router's own
worker's is answered in-process, one ask and nothing else; when that copy cannot answer,
the general path asks the next copies; a copy elsewhere is asked over the lookup streams."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from unittest import mock

import pytest

from millpond.services.router import pull_routing
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull import LookupAnswer, Replica, plan_pull
from millpond.services.router.pull_routing import LOCAL_HOPS, PullRouter
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import UnavailableError
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.session import ENABLE_STANDBY_READS
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_statement
from millpond.worker.v1 import worker_pb2

HERE, ELSEWHERE = "here:1", "elsewhere:1"


class Local:
    """The router's own worker: its copy answers, or is not there (``down``)."""

    endpoint = HERE

    def __init__(self, down: bool = False):
        self.down = down
        self.asked: list[worker_pb2.LookupRequest] = []

    async def lookup(self, request: worker_pb2.LookupRequest) -> LookupAnswer:
        self.asked.append(request)
        if self.down:
            raise UnavailableError("partition 0 of COUNTS is not active on worker here")
        return LookupAnswer(["s1", 2], 41)

    def scan(self, request: Any) -> Any:
        raise AssertionError("a key lookup scans nothing")


def pull(local: Local, copies: list[Replica], properties: dict[str, str] | None = None,
         general: bool = True) -> tuple[Any, list[str]]:
    """``SELECT * FROM counts WHERE sensor = 's1'`` through a router whose worker is ``local``;
    the outcome with its positions, and the remote endpoints asked."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, reading INT) "
                               "WITH (kafka_topic='readings', partitions=2, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor"), 1)
    stmt = parse_statement("SELECT * FROM counts WHERE sensor = 's1'")
    assert isinstance(stmt, ast.Query)
    plan = plan_pull(stmt, meta, "svc")
    assert plan.partition is not None and plan.table.query_id is not None and plan.row_as_is
    remote: list[str] = []

    async def run() -> Any:
        settings = RouterSettings(coordinator="127.0.0.1:1")
        channels = ChannelFactory(None)
        router = PullRouter(settings, meta, None, channels, Coordinators(settings, channels),  # type: ignore[arg-type]
                            HostTable(1.0), local)
        router.replicas = {plan.table.query_id: {plan.partition: copies}}

        async def lookup(endpoint: str, request: worker_pb2.LookupRequest, _: float) -> worker_pb2.LookupResponse:
            remote.append(endpoint)
            return worker_pb2.LookupResponse(found=False, input_offset=7)

        router.lookups.lookup = lookup  # type: ignore[method-assign]
        try:
            if general:
                return await router.pull(stmt, plan, properties or {}, {}, time.monotonic() + 0.5)
            with mock.patch.object(pull_routing, "execute_pull", side_effect=AssertionError("the general path ran")):
                return await router.pull(stmt, plan, properties or {}, {}, time.monotonic() + 0.5)
        finally:
            await channels.close()

    return asyncio.run(run()), remote


def test_the_own_workers_copy_answers_in_process() -> None:
    local, hops = Local(), LOCAL_HOPS._value.get()
    (outcome, positions), remote = pull(local, [Replica(HERE, False), Replica(ELSEWHERE, True)], general=False)
    assert outcome.rows == [["s1", 2]] and outcome.columns == [("SENSOR", "VARCHAR"), ("N", "BIGINT")]
    assert positions == {("readings", local.asked[0].partition): 41}
    assert len(local.asked) == 1 and remote == [] and LOCAL_HOPS._value.get() == hops + 1
    assert local.asked[0].key == b"s1" and not local.asked[0].allow_standby


@pytest.mark.parametrize("standby_reads, answered_by", [("true", [ELSEWHERE]), ("false", None)])
def test_when_the_own_copy_cannot_answer_the_next_copies_are_asked(standby_reads: str, answered_by: Any) -> None:
    """The own copy is asked once (not again by the general path at once), the others in turn;
    when none can answer, the error says why for each."""
    local, hops = Local(down=True), LOCAL_HOPS._value.get()
    try:
        (outcome, positions), remote = pull(local, [Replica(HERE, False), Replica(ELSEWHERE, True)],
                                            {ENABLE_STANDBY_READS: standby_reads})
    except UnavailableError as err:
        assert answered_by is None
        assert "here:1 (active): partition 0 of COUNTS is not active on worker here" in err.message
        assert "standby reads are off" in err.message
        return
    assert remote == answered_by and outcome.rows == [] and positions == {("readings", local.asked[0].partition): 7}
    assert len(local.asked) == 1 and LOCAL_HOPS._value.get() == hops + 1


def test_a_copy_elsewhere_is_asked_over_the_lookup_streams() -> None:
    local = Local()
    (outcome, _), remote = pull(local, [Replica(ELSEWHERE, False), Replica(HERE, True)])
    assert remote == [ELSEWHERE] and local.asked == [] and outcome.rows == []
