"""Stateless persistent queries on the real cluster: CSAS with a filter, functions (ksqlDB's
INITCAP, CONCAT_WS, POWER, SPLIT, MASK, MASK_LEFT, ARRAY_JOIN, ARRAY_UNION, REGEXP,
EXTRACTJSONFIELD, ENTRIES, AS_MAP, GENERATE_SERIES, time functions, LIKE and lambdas among them) and arithmetic, and a CSAS that
re-keys through PARTITION BY into a topic of another size. Results are read back from the
sink topics (read_committed) and compared record by record with values computed here; a
malformed input record goes to the processing log, and so do one whose processing overflows
Spark's stack and one over which a REGEXP call backtracks past its time (the batch's other
records, and the worker's other queries, go on)."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.catalog.names import processing_log_topic
from millpond.shared.kafka.partitioner import partition_for

MILLPOND = [sys.executable, "-m", "millpond.cli.main"]
ROWS = [(f"u{i % 10}", ["home", "about", "cart"][i % 3], i % 13) for i in range(60)]
ROWTIMES = [1700000000123 + i * 25_200_017 for i in range(60)]
"""Each row's ROWTIME: seven hours apart and a bit, so the dates, hours and milliseconds vary."""
_EPOCH = datetime.datetime(1970, 1, 1)
_KOLKATA = datetime.timedelta(hours=5, minutes=30)  # Asia/Kolkata's offset since 1945


async def read_topic(bootstrap: str, topic: str, expect: int, wait_s: float = 240) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of every committed record, once ``expect`` arrived (or the time is up)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, isolation_level="read_committed",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records: list[tuple[int, bytes, bytes]] = []
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and len(records) < expect:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records += [(r.partition, r.key or b"", r.value or b"") for r in batch]
        # Anything beyond the expected count would be a duplicate: give it a moment to show.
        for batch in (await consumer.getmany(timeout_ms=1000)).values():
            records += [(r.partition, r.key or b"", r.value or b"") for r in batch]
    finally:
        await consumer.stop()
    return records


async def test_projections_filters_and_partition_by_write_exactly_the_right_records(
        cluster: LocalCluster, tmp_path: Path) -> None:
    name = f"clicks_{cluster.service_id}"
    inserts = "\n".join(f"INSERT INTO {name} (ROWTIME, userid, pageid, seconds) VALUES ({t}, '{u}', '{p}', {s});"
                        for (u, p, s), t in zip(ROWS, ROWTIMES, strict=True))
    # Its records are of 2023 (ROWTIMES), and so are the results' (a result keeps its input's time):
    # with the broker's retention of a week by record time, a retention check between the writes
    # and the reads deleted them (seen of the input, and of a sink's first records). The topics are
    # made here, kept for good, and the statements take them as they are.
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs={"retention.ms": "-1"}) for topic, partitions
                                   in ((name, 4), (f"LONG_{name.upper()}", 4), (f"BY_PAGE_{name.upper()}", 2))])
    finally:
        await admin.close()
    script = tmp_path / "stateless.sql"
    script.write_text(f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {name} (userid VARCHAR KEY, pageid VARCHAR, seconds INT)
          WITH (kafka_topic='{name}', partitions=4, value_format='json');
        {inserts}
    """)
    await asyncio.to_thread(subprocess.run, [*MILLPOND, "sql", "--server", cluster.router, "-f", str(script)],
                            check=True, capture_output=True, timeout=120)
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap)
    await producer.start()
    try:
        bad = await producer.send_and_wait(name, b"{not json", key=b"u1", partition=partition_for(b"u1", 4))
        # java.util.regex overflows a Spark task's stack on it (SQUEEZED): set aside, the batch goes on.
        overflowing_value = json.dumps({"PAGEID": "ab" * 3000, "SECONDS": 9})
        overflowing = await producer.send_and_wait(name, overflowing_value.encode(), key=b"u2", partition=partition_for(b"u2", 4))
        # java.util.regex backtracks without end on it (NESTED): its call stops at its time, the record is set aside.
        backtracking_value = json.dumps({"PAGEID": "a" * 40 + "!", "SECONDS": 9})
        backtracking = await producer.send_and_wait(name, backtracking_value.encode(), key=b"u3", partition=partition_for(b"u3", 4))
    finally:
        await producer.stop()
    queries = f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM long_{name} AS SELECT userid, UCASE(pageid) AS page, seconds * 2 AS doubled,
          INITCAP(CONCAT_WS(' ', pageid, userid)) AS title, POWER(seconds, 2) AS squared, SPLIT(pageid, 'o') AS parts,
          MASK(userid) AS masked, TIMESTAMPTOSTRING(ROWTIME, 'yyyy-MM-dd HH:mm:ss.SSS EEE', 'Asia/Kolkata') AS local_time,
          FROM_UNIXTIME(ROWTIME) AS at,
          STRINGTOTIMESTAMP(TIMESTAMPTOSTRING(ROWTIME, 'dd/MM/yyyy HH:mm'), 'dd/MM/yyyy HH:mm') AS minute,
          FORMAT_DATE(FROM_DAYS(seconds * 400), 'dd MMM yyyy') AS day, ARRAY_JOIN(SPLIT(pageid, 'o'), '+') AS joined,
          MASK_LEFT(userid, 1) AS hidden, REGEXP_EXTRACT('u([0-9]+)', userid, 1) AS num,
          REGEXP_REPLACE(pageid, '(?<first>[a-z])', '${{first}}.') AS dotted, REGEXP_EXTRACT_ALL('[aeiou]', pageid) AS vowels,
          EXTRACTJSONFIELD(CONCAT('{{"p": {{"q": ["', pageid, '", 1.50]}}}}'), '$.p.q') AS extracted,
          ARRAY_UNION(SPLIT(pageid, 'o'), SPLIT(userid, '')) AS united, TIMESTAMPADD(HOURS, seconds, FROM_UNIXTIME(ROWTIME)) AS later,
          pageid LIKE '%o%_e%' AS liked, pageid LIKE CONCAT('%', SUBSTRING(pageid, 3, 1), '%_') AS by_row,
          userid LIKE CONCAT(pageid, '%\\') AS unreadable, TRANSFORM(SPLIT(pageid, 'o'), part => UCASE(part)) AS shouted,
          FILTER(SPLIT(pageid, ''), c => c > 'm') AS late, REDUCE(SPLIT(pageid, ''), 0, (n, c) => n + LEN(c) * seconds) AS weighted,
          REGEXP_REPLACE(pageid, '(a|b)*', '') AS squeezed, REGEXP_EXTRACT('^((a+)+)+b*$', pageid) AS nested,
          ENTRIES(AS_MAP(SPLIT(pageid, ''), GENERATE_SERIES(1, seconds)), true) AS ranked
          FROM {name} WHERE seconds > 5;
        CREATE STREAM by_page_{name} WITH (partitions=2, value_format='delimited') AS
          SELECT pageid, userid, seconds, ROWPARTITION AS from_partition, ROWOFFSET AS from_offset FROM {name}
          PARTITION BY pageid;
    """
    await asyncio.to_thread(subprocess.run, [*MILLPOND, "sql", "--server", cluster.router, "-e", queries],
                            check=True, capture_output=True, timeout=120)

    def at(millis: int) -> datetime.datetime:
        return _EPOCH + datetime.timedelta(milliseconds=millis)

    long_expected = Counter((u.encode(), json.dumps({"PAGE": p.upper(), "DOUBLED": s * 2, "TITLE": f"{p.title()} {u.title()}",
                                                     "SQUARED": float(s * s), "PARTS": p.split("o"),
                                                     "MASKED": "x" + "n" * (len(u) - 1),
                                                     "LOCAL_TIME": (at(t) + _KOLKATA).strftime(f"%Y-%m-%d %H:%M:%S.{t % 1000:03d} %a"),
                                                     "AT": at(t).isoformat(), "MINUTE": t - t % 60_000,
                                                     "DAY": (_EPOCH + datetime.timedelta(days=s * 400)).strftime("%d %b %Y"),
                                                     "JOINED": "+".join(p.split("o")), "HIDDEN": "x" + u[1:], "NUM": u[1:],
                                                     "DOTTED": "".join(c + "." for c in p), "VOWELS": [c for c in p if c in "aeiou"],
                                                     "EXTRACTED": f'["{p}",1.5]',
                                                     "UNITED": list(dict.fromkeys([*p.split("o"), *u])),
                                                     "LATER": (at(t) + datetime.timedelta(hours=s)).isoformat(),
                                                     "LIKED": re.fullmatch(".*o.+e.*", p) is not None, "BY_ROW": True,
                                                     "UNREADABLE": None, "SHOUTED": [part.upper() for part in p.split("o")],
                                                     "LATE": [c for c in p if c > "m"], "WEIGHTED": len(p) * s,
                                                     "SQUEEZED": re.sub("(a|b)*", "", p),
                                                     "NESTED": m.group() if (m := re.search("^((a+)+)+b*$", p)) else None,
                                                     "RANKED": [{"K": c, "V": i + 1} for i, c in sorted(enumerate(p),
                                                                                                          key=lambda ic: ic[1])]},
                                                    separators=(",", ":")).encode())
                            for (u, p, s), t in zip(ROWS, ROWTIMES, strict=True) if s > 5)
    long_records = await read_topic(cluster.bootstrap, f"LONG_{name.upper()}", sum(long_expected.values()))
    assert Counter((k, v) for _, k, v in long_records) == long_expected
    # The key is unchanged, so each result stays in its input's partition.
    assert all(p == partition_for(k, 4) for p, k, _ in long_records)

    # Each input record's partition and offset (ROWPARTITION, ROWOFFSET): the rows were inserted
    # in order, one at a time, then the three records above.
    places: list[tuple[int, int]] = []
    written: Counter[int] = Counter()
    for u, _, _ in ROWS:
        partition = partition_for(u.encode(), 4)
        places.append((partition, written[partition]))
        written[partition] += 1
    set_aside = [("u2", "ab" * 3000, 9), ("u3", "a" * 40 + "!", 9)]
    places += [(overflowing.partition, overflowing.offset), (backtracking.partition, backtracking.offset)]
    by_page_expected = Counter((p.encode(), f"{u},{s},{partition},{offset}".encode())
                               for (u, p, s), (partition, offset) in zip([*ROWS, *set_aside], places, strict=True))
    by_page = await read_topic(cluster.bootstrap, f"BY_PAGE_{name.upper()}", len(ROWS) + 2)
    assert Counter((k, v) for _, k, v in by_page) == by_page_expected
    assert all(p == partition_for(k, 2) for p, k, _ in by_page)

    # The processing log is the whole cluster's: read it until this test's four entries are in (a
    # record set aside comes with the last part of its batch, after the sink's other records).
    deadline = time.monotonic() + 60
    while True:
        logged = await read_topic(cluster.bootstrap, processing_log_topic(cluster.service_id), 1, wait_s=10)
        entries = [json.loads(v) for _, _, v in logged]
        if sum(e["SOURCE_TOPIC"] == name for e in entries) >= 4 or time.monotonic() > deadline:
            break
    def at_record(sent: Any) -> list[dict[str, Any]]:
        return [e for e in entries
                if (e["SOURCE_TOPIC"], e["SOURCE_PARTITION"], e["SOURCE_OFFSET"]) == (name, sent.partition, sent.offset)]
    mine = at_record(bad)
    assert sorted(e["QUERY_ID"].rsplit("_", 1)[0] for e in mine) == [f"CSAS_BY_PAGE_{name.upper()}",
                                                                      f"CSAS_LONG_{name.upper()}"]
    assert all("not JSON" in e["REASON"] and e["RECORD"] == "{not json" for e in mine)
    (overflowed,) = at_record(overflowing)
    assert overflowed["QUERY_ID"].startswith(f"CSAS_LONG_{name.upper()}")
    assert "java.lang.StackOverflowError" in overflowed["REASON"] and overflowed["RECORD"] == overflowing_value
    (stopped,) = at_record(backtracking)
    assert stopped["QUERY_ID"].startswith(f"CSAS_LONG_{name.upper()}") and stopped["RECORD"] == backtracking_value
    assert "the pattern '^((a+)+)+b*$' took over 0.5 s on a text of 41 characters" in stopped["REASON"], stopped
