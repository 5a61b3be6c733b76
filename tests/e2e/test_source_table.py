"""A table declared over a topic is materialized (latest row per key, tombstones delete) and
can be pulled from; the processing log is a stream that queries can read."""

from __future__ import annotations

import asyncio
import json
import time

from aiokafka import AIOKafkaProducer

from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.kafka.partitioner import partition_for
from tests.e2e.helpers import pull_until, run
from tests.e2e.test_stateless import read_topic


async def test_a_table_over_a_topic_is_materialized_and_pulled(cluster: LocalCluster) -> None:
    name = f"users_{cluster.service_id}"
    run(cluster, f"""
        CREATE TABLE {name} (id VARCHAR PRIMARY KEY, name VARCHAR, age INT)
          WITH (kafka_topic='{name}', partitions=2, value_format='json');
        INSERT INTO {name} (id, name, age) VALUES ('u1', 'ann', 30);
        INSERT INTO {name} (id, name, age) VALUES ('u2', 'bob', 40);
        INSERT INTO {name} (id, name, age) VALUES ('u3', 'cy', 50);
        INSERT INTO {name} (id, name, age) VALUES ('u1', 'ann', 31);
    """)
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(name, None, key=b"u2", partition=partition_for(b"u2", 2))  # tombstone
        bad = await producer.send_and_wait(name, b"{oops", key=b"u3", partition=partition_for(b"u3", 2))
    finally:
        await producer.stop()

    want = {"u1": ["u1", "ann", 31], "u3": ["u3", "cy", 50]}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name};", want) == want
    assert run(cluster, f"SELECT name, age FROM {name} WHERE id = 'u1';") == [["ann", 31]]
    assert run(cluster, f"SELECT * FROM {name} WHERE id = 'u2';") == []

    # RUNNING once each task's query has read what the topic held at its start: the batch
    # that made the rows visible may end before the malformed record after them.
    deadline = time.monotonic() + 30
    while True:
        queries = {q[0]: q for q in run(cluster, "SHOW QUERIES;")}
        (query_id,) = [q for q in queries if q.startswith(f"CST_{name.upper()}_")]
        if queries[query_id][2] == "RUNNING:2" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert queries[query_id][2] == "RUNNING:2"

    # The malformed record is in the processing log, which is itself a stream: a query over
    # it picks out this table's failures.
    failures = f"failures_{cluster.service_id}"
    run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {failures} AS SELECT query_id, source_offset, reason, record FROM MILLPOND_PROCESSING_LOG
          WHERE query_id = '{query_id}';
    """)
    records = await read_topic(cluster.bootstrap, failures.upper(), 1, wait_s=180)
    assert [json.loads(v) for *_, v in records] == [{
        "QUERY_ID": query_id, "SOURCE_OFFSET": bad.offset,
        "REASON": "value is not JSON of the declared columns and types", "RECORD": "{oops"}]
