"""A pull query over a stream against the real broker: it reads each partition from its beginning
to where it ended when the pull began (read_committed: an open transaction's records and every
record written afterwards left out), an empty partition too, and ends there; a consistency token
ahead of a partition's end is waited for; ROWPARTITION and ROWOFFSET are each record's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.router.push import PushQuery
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import UnavailableError
from millpond.shared.kafka.admin import ensure_topic
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import plan_select

pytestmark = pytest.mark.kafka

TOPIC = "stream-pull-scan"


def scan(meta: Metastore, sql: str, kafka: EmbeddedKafka) -> PushQuery:
    query = parse_statement(sql)
    assert isinstance(query, ast.Query) and not query.emit_changes
    return PushQuery(plan_select(query, meta.source("SCANNED")), KafkaConnection(kafka.bootstrap_servers),
                     from_beginning=True, fetch_records=2)


async def _all(rows: Any, after_first: Any = None) -> list[list[Any]]:
    seen: list[list[Any]] = []
    async for row in rows:
        seen.append(row)
        if len(seen) == 1 and after_first is not None:
            await after_first()
    return seen


async def test_a_pull_over_a_stream_reads_each_partition_to_where_it_ended_when_the_pull_began(kafka: EmbeddedKafka) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    open_transaction = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id="stream-pull-open")
    await producer.start()
    await open_transaction.start()
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE STREAM scanned (k VARCHAR KEY, v INT) "
                               f"WITH (kafka_topic='{TOPIC}', partitions=3, value_format='json')"), 0)
    scans: list[PushQuery] = []
    try:
        await ensure_topic(admin, TOPIC, 3)
        for partition, values in ((0, range(5)), (1, range(10, 13))):  # partition 2 stays empty
            for v in values:
                await producer.send_and_wait(TOPIC, json.dumps({"V": v}).encode(), key=f"k{v}".encode(), partition=partition)
        await producer.send_and_wait(TOPIC, b"not json", key=b"bad", partition=0)  # skipped, as a push skips it
        await open_transaction.begin_transaction()
        await open_transaction.send_and_wait(TOPIC, json.dumps({"V": 99}).encode(), key=b"k99", partition=1)

        async def written_after_the_start() -> None:
            await producer.send_and_wait(TOPIC, json.dumps({"V": 5}).encode(), key=b"k5", partition=0)

        scans.append(everything := scan(meta, "SELECT k, v FROM scanned WHERE v <> 3 AND ROWTIME > 0;", kafka))
        await everything.start()
        rows = await asyncio.wait_for(_all(everything.rows_to_end({}), written_after_the_start), 30)
        assert sorted(rows, key=lambda r: r[1]) == [["k0", 0], ["k1", 1], ["k2", 2], ["k4", 4], ["k10", 10], ["k11", 11],
                                                    ["k12", 12]]
        assert [r[1] for r in rows if r[1] < 10] == [0, 1, 2, 4], "each partition in offset order"
        assert everything.skipped == 1

        scans.append(placed := scan(meta, "SELECT v, ROWPARTITION, ROWOFFSET FROM scanned WHERE ROWOFFSET = 1;", kafka))
        await placed.start()
        assert sorted(await asyncio.wait_for(_all(placed.rows_to_end({})), 30)) == [[1, 0, 1], [11, 1, 1]]

        scans.append(limited := scan(meta, "SELECT v FROM scanned WHERE v >= 1 LIMIT 2;", kafka))
        await limited.start()
        assert len(await asyncio.wait_for(_all(limited.rows_to_end({})), 30)) == 2

        # A consistency token ahead of a partition's end: the pull waits until the record is there.
        scans.append(waiting := scan(meta, "SELECT v FROM scanned WHERE v >= 20;", kafka))
        await waiting.start()
        reading = asyncio.ensure_future(_all(waiting.rows_to_end({2: 1}, wait_s=30)))
        await asyncio.sleep(0.5)
        assert not reading.done(), "the pull read before its partition reached the token's offset"
        await producer.send_and_wait(TOPIC, json.dumps({"V": 20}).encode(), key=b"k20", partition=2)
        assert await asyncio.wait_for(reading, 30) == [[20]]
        # A token the partition never reaches (its topic made anew): UNAVAILABLE once the wait is over.
        scans.append(stale := scan(meta, "SELECT v FROM scanned;", kafka))
        await stale.start()
        with pytest.raises(UnavailableError, match="partition 2 of stream-pull-scan ends at offset 1, before the "
                                                   "consistency token's 100"):
            await asyncio.wait_for(_all(stale.rows_to_end({2: 100}, wait_s=0.3)), 30)

        await open_transaction.commit_transaction()
        # The commit's markers reach the partition just after the commit returns: a pull reads
        # the transaction's record once its partition's last stable offset has passed it.
        values: list[int] = []
        for _ in range(50):
            scans.append(again := scan(meta, "SELECT v FROM scanned;", kafka))
            await again.start()
            values = sorted(r[0] for r in await asyncio.wait_for(_all(again.rows_to_end({})), 30))
            if 99 in values:
                break
            await asyncio.sleep(0.1)
        assert values == [0, 1, 2, 3, 4, 5, 10, 11, 12, 20, 99], "the committed transaction and the later record now"
    finally:
        for each in scans:
            await each.stop()
        await open_transaction.stop()
        await producer.stop()
        await admin.close()
