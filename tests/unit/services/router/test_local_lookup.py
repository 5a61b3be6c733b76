"""Co-located routing's key lookups: a pull whose first qualified copy is the router's own
worker's is answered in-process, one ask and nothing else; when that copy cannot answer,
the general path asks the next copies; a copy elsewhere is asked over the lookup streams.
With a consistency token no copy is reported to have reached, the active is asked to wait
for it, by a key lookup and by a scan alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
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
from millpond.shared.task_status import StoreLag
from millpond.worker.v1 import worker_pb2

HERE, ELSEWHERE = "here:1", "elsewhere:1"


class Local:
    """The router's own worker: its copy answers, or is not there (``down``)."""

    endpoint = HERE

    def __init__(self, down: bool = False):
        self.down = down
        self.asked: list[worker_pb2.LookupRequest] = []
        self.scanned: list[worker_pb2.ScanPagesRequest] = []

    async def lookup(self, request: worker_pb2.LookupRequest) -> LookupAnswer:
        self.asked.append(request)
        if self.down:
            raise UnavailableError("partition 0 of COUNTS is not active on worker here")
        return LookupAnswer(["s1", 2], 41)

    async def scan(self, request: worker_pb2.ScanPagesRequest) -> AsyncIterator[worker_pb2.ScanPagesResponse]:
        """No row, each partition at its token's position (or 7)."""
        self.scanned.append(request)
        for p in request.partitions:
            yield worker_pb2.ScanPagesResponse(input_offsets={p: max(7, request.min_input_offsets.get(p, 0))})


def pull(local: Local, copies: list[Replica], properties: dict[str, str] | None = None,
         general: bool = True, token: int = 0, reported: dict[str, int] | None = None,
         requests: list[worker_pb2.LookupRequest] | None = None, host_timeout_ms: int = 1000,
         dead: tuple[str, ...] = (), times: int = 1,
         sql: str = "SELECT * FROM counts WHERE sensor = 's1'") -> tuple[Any, list[str]]:
    """``sql`` (a key lookup unless told) through a router whose worker is ``local``; the
    outcome with its positions, and the remote endpoints asked (their requests appended to
    ``requests``). Every partition read has the ``copies``. With a ``token`` (the position it
    needs of each partition read) the workers ``reported`` have processed their input up to the
    offsets given; those ``dead`` last beat long ago. The pull is made ``times`` in a row, by
    one router (the last one's outcome)."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, reading INT) "
                               "WITH (kafka_topic='readings', partitions=2, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor"), 1)
    stmt = parse_statement(sql)
    assert isinstance(stmt, ast.Query)
    plan = plan_pull(stmt, meta, "svc")
    assert plan.table.query_id is not None
    partitions = range(plan.table.partitions) if plan.partition is None else [plan.partition]
    remote: list[str] = []
    deadline_s = 5.0 if host_timeout_ms < 1000 else 0.5

    async def run() -> Any:
        settings = RouterSettings(coordinator="127.0.0.1:1", pull_host_timeout_ms=host_timeout_ms)
        channels = ChannelFactory(None)
        router = PullRouter(settings, meta, None, channels, Coordinators(settings, channels),  # type: ignore[arg-type]
                            HostTable(1.0), local)
        router.replicas = {plan.table.query_id: {p: copies for p in partitions}}
        for endpoint, offset in (reported or {}).items():
            router.hosts.beat(endpoint, endpoint, [StoreLag(plan.table.query_id, p, True, offset, offset,
                                                            input_offset=offset) for p in partitions])
        for endpoint in dead:
            router.hosts.beat(endpoint, endpoint, [])
            router.hosts.hosts[endpoint].last_beat -= 10  # its last beat 10 s ago
        positions = {("readings", p): token for p in partitions} if token else {}

        async def lookup(endpoint: str, request: worker_pb2.LookupRequest, *_: float) -> worker_pb2.LookupResponse:
            remote.append(endpoint)
            if requests is not None:
                requests.append(request)
            return worker_pb2.LookupResponse(found=False, input_offset=max(7, request.min_input_offset))

        router.lookups.lookup = lookup  # type: ignore[method-assign]
        try:
            if general:
                for _ in range(times - 1):
                    await router.pull(stmt, plan, properties or {}, positions, time.monotonic() + deadline_s)
                return await router.pull(stmt, plan, properties or {}, positions, time.monotonic() + deadline_s)
            with mock.patch.object(pull_routing, "execute_pull", side_effect=AssertionError("the general path ran")):
                return await router.pull(stmt, plan, properties or {}, positions, time.monotonic() + deadline_s)
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


def test_a_token_no_report_shows_reached_asks_the_active_to_wait_for_it() -> None:
    """The reports trail the commits: a token newer than every copy's last report is asked of
    the active, which may wait for it (within the worker's time to answer, less what it keeps
    to say why not), instead of no copy until a report shows it; a standby reported past the
    token is asked at once, without a wait; the in-process copy waits as the remote one."""
    requests: list[worker_pb2.LookupRequest] = []
    (_, positions), remote = pull(Local(), [Replica(ELSEWHERE, False), Replica(HERE, True)], token=50,
                                  reported={ELSEWHERE: 40, HERE: 30}, requests=requests)
    assert remote == [ELSEWHERE] and positions == {("readings", requests[0].partition): 50}
    (asked,) = requests
    assert asked.min_input_offset == 50 and 0 < asked.wait_ms <= 500 - 1000 * pull_routing.TOKEN_ANSWER_S

    requests.clear()
    pull(Local(), [Replica(ELSEWHERE, False), Replica("standby:1", True)], {ENABLE_STANDBY_READS: "true"},
         token=50, reported={ELSEWHERE: 40, "standby:1": 55}, requests=requests)
    assert [(r.allow_standby, r.wait_ms) for r in requests] == [(True, 0)]

    local = Local()
    pull(local, [Replica(HERE, False)], general=False, token=50, reported={HERE: 40})
    (asked,) = local.asked
    assert asked.min_input_offset == 50 and asked.wait_ms > 0

    requests.clear()
    pull(Local(), [Replica(ELSEWHERE, False)], token=50, reported={ELSEWHERE: 60}, requests=requests)
    assert [r.wait_ms for r in requests] == [0], "a copy reported past the token answers at once"


def test_a_token_asks_an_active_no_report_shows_yet_to_wait_and_a_standby_first_as_it_is() -> None:
    """Just after a partition moved (or from a worker that reports elsewhere) no report shows
    where the active is: it is asked to wait for the token too, not refused and asked again
    a retry pause later; a standby asked first is asked without a wait, so that its refusal
    leaves the next copy its turn at once."""
    requests: list[worker_pb2.LookupRequest] = []
    pull(Local(), [Replica(ELSEWHERE, False)], token=50, requests=requests)  # never heard from
    (asked,) = requests
    assert asked.min_input_offset == 50 and 0 < asked.wait_ms <= 500 - 1000 * pull_routing.TOKEN_ANSWER_S

    requests.clear()
    pull(Local(), [Replica(ELSEWHERE, False)], token=50, reported={ELSEWHERE: -1}, requests=requests)
    assert [r.wait_ms > 0 for r in requests] == [True]  # a report without a position

    local = Local()
    pull(local, [Replica(HERE, False)], general=False, token=50)
    assert [r.wait_ms > 0 for r in local.asked] == [True]  # in-process too

    requests.clear()
    pull(Local(), [Replica("standby:1", True), Replica(ELSEWHERE, False)], {ENABLE_STANDBY_READS: "true"},
         token=50, dead=(ELSEWHERE,), requests=requests)
    assert [(r.allow_standby, r.wait_ms) for r in requests] == [(True, 0)]


def test_a_token_lookups_wait_stays_within_the_host_timeout_and_a_dead_active_is_not_waited_for() -> None:
    requests: list[worker_pb2.LookupRequest] = []
    pull(Local(), [Replica(ELSEWHERE, False)], token=50, reported={ELSEWHERE: 40}, requests=requests,
         host_timeout_ms=300)  # and a deadline of 5 s
    (asked,) = requests
    assert 0 < asked.wait_ms <= 300 - 1000 * pull_routing.TOKEN_ANSWER_S

    requests.clear()
    with pytest.raises(UnavailableError) as info:
        pull(Local(), [Replica(ELSEWHERE, False)], token=50, requests=requests, dead=(ELSEWHERE,))
    assert requests == [] and "elsewhere:1 (active): dead: no heartbeat" in info.value.message


def test_a_token_scan_asks_the_active_to_wait_for_the_partitions_no_report_shows_reached() -> None:
    """A scan waits as a key lookup does: one call per host, its wait the longest any of its
    partitions' routes allows; a scan of copies reported past the token waits for nothing."""
    local = Local()
    (_, positions), remote = pull(local, [Replica(HERE, False)], token=50, reported={HERE: 40},
                                  sql="SELECT * FROM counts")
    (asked,) = local.scanned
    assert remote == [] and dict(asked.min_input_offsets) == {0: 50, 1: 50}
    assert 0 < asked.wait_ms <= 500 - 1000 * pull_routing.TOKEN_ANSWER_S
    assert positions == {("readings", 0): 50, ("readings", 1): 50}

    local = Local()
    pull(local, [Replica(HERE, False)], token=50, reported={HERE: 60}, sql="SELECT * FROM counts")
    assert [r.wait_ms for r in local.scanned] == [0]

    # The positions a scan was answered at count as a lookup's do, until the copy's next report.
    local = Local()
    pull(local, [Replica(HERE, False)], token=50, reported={HERE: 40}, sql="SELECT * FROM counts", times=2)
    assert [r.wait_ms > 0 for r in local.scanned] == [True, False]


def test_a_pull_whose_token_a_copy_has_answered_at_needs_no_wait() -> None:
    """A session's next pull carries its last answer's position, newer than the copy's last
    report: the router remembers the answer, and asks the copy at once (over the stream)."""
    requests: list[worker_pb2.LookupRequest] = []
    pull(Local(), [Replica(ELSEWHERE, False)], token=50, reported={ELSEWHERE: 40}, requests=requests, times=2)
    assert [(r.min_input_offset, r.wait_ms > 0) for r in requests] == [(50, True), (50, False)]
