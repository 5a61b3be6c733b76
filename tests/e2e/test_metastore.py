"""The metastore through a real cluster: SHOW (FUNCTIONS too) / DESCRIBE / EXPLAIN through ``millpond sql``,
every node's digest equal, and equal again after every service restarts and replays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from millpond.cli.client import metastore_digest
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.net import free_port
from tests.e2e.helpers import pull_until, run, wait_for

MILLPOND = [sys.executable, "-m", "millpond.cli.main"]

SCRIPT = """
SET 'auto.offset.reset'='earliest';
CREATE STREAM pageviews (userid VARCHAR KEY, pageid VARCHAR, seconds INT)
  WITH (kafka_topic='pageviews', partitions=3, value_format='json');
CREATE STREAM clicks (userid BIGINT, pageid VARCHAR) WITH (kafka_topic='clicks', partitions=2, value_format='delimited');
INSERT INTO pageviews (userid, pageid, seconds) VALUES ('alice', 'home', 10);
CREATE TABLE time_on_site AS SELECT userid, SUM(seconds) AS total FROM pageviews GROUP BY userid;
CREATE STREAM long_views AS SELECT userid, UCASE(pageid) AS page, seconds FROM pageviews WHERE seconds > 5;
CREATE STREAM by_page WITH (partitions=2) AS SELECT pageid, userid FROM pageviews PARTITION BY pageid;
CREATE STREAM doomed (a INT) WITH (kafka_topic='doomed', partitions=1, value_format='json');
DROP STREAM doomed DELETE TOPIC;
"""


def sql(router: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MILLPOND, "sql", "--server", router, *args], capture_output=True, text=True,
                          timeout=120, check=check)


def rows(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def digests(cluster: LocalCluster) -> dict[str, tuple[str, int]]:
    answers = {child.name: metastore_digest(child.endpoint) for child in cluster.children}
    return {name: (a.digest, a.command_offset) for name, a in answers.items()}


@pytest.fixture(scope="module")
def small_cluster(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("metastore")), workers=1,
                         kafka=kafka.bootstrap_servers, router_port=free_port(),
                         service_id=f"meta{os.getpid()}", spark_master="local[1]")
    local.start()
    yield local  # type: ignore[misc]
    local.stop()


def test_show_describe_and_explain_through_the_cli(small_cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text(SCRIPT.replace("pageviews'", f"pageviews-{small_cluster.service_id}'")
                      .replace("'clicks'", f"'clicks-{small_cluster.service_id}'")
                      .replace("'doomed'", f"'doomed-{small_cluster.service_id}'"))
    done = rows(sql(small_cluster.router, "-f", str(script), "--output", "json"))
    assert [r["message"] for r in done][-1].startswith("Source DOOMED")  # type: ignore[union-attr]

    streams = rows(sql(small_cluster.router, "-e", "SHOW STREAMS;", "--output", "json"))
    assert [s["NAME"] for s in streams] == ["BY_PAGE", "CLICKS", "LONG_VIEWS", "MILLPOND_PROCESSING_LOG", "PAGEVIEWS"]
    assert {s["NAME"]: s["VALUE_FORMAT"] for s in streams}["CLICKS"] == "DELIMITED"
    assert all(s["STATUS"] == "OK" for s in streams)
    functions = rows(sql(small_cluster.router, "-e", "LIST FUNCTIONS;", "--output", "json"))
    listed = {f["NAME"]: (f["TYPE"], f["SIGNATURE"]) for f in functions}
    assert listed["ROUND"] == ("SCALAR", "ROUND(number[, INT or BIGINT])") and listed["COUNT"][0] == "AGGREGATE"
    assert listed["REDUCE"][0] == "LAMBDA" and {"ENTRIES", "AS_MAP", "GENERATE_SERIES"} <= listed.keys()
    function = {r["PROPERTY"]: r["VALUE"] for r in rows(sql(small_cluster.router, "-e", "DESCRIBE FUNCTION topk;",
                                                             "--output", "json"))}
    assert function["TYPE"] == "AGGREGATE" and str(function["OVERVIEW"]).startswith("The k greatest values")
    queries = rows(sql(small_cluster.router, "-e", "SHOW QUERIES;", "--output", "json"))
    assert [q["QUERY_ID"] for q in queries] == ["CSAS_BY_PAGE_2", "CSAS_LONG_VIEWS_1", "CTAS_TIME_ON_SITE_0"]
    # EXTENDED (ksqlDB's): each source with its columns and queries; each query's tasks, where they
    # run; ALL TOPICS: the internal ones too (a query's changelog).
    by_name = {str(r[0]): r for r in run(small_cluster, "DESCRIBE STREAMS;")}
    assert by_name["PAGEVIEWS"][6] == "USERID VARCHAR KEY, PAGEID VARCHAR, SECONDS INT"
    assert "CSAS_LONG_VIEWS_1" in str(by_name["PAGEVIEWS"][10]) and by_name["LONG_VIEWS"][9] == "CSAS_LONG_VIEWS_1"
    tasks: list[list[object]] = []

    def reported() -> bool:
        tasks[:] = run(small_cluster, "SHOW QUERIES EXTENDED;")
        return sorted(r[1] for r in tasks if r[0] == "CSAS_LONG_VIEWS_1" and r[2]) == [0, 1, 2]  # type: ignore[type-var]

    wait_for("the tasks of CSAS_LONG_VIEWS_1 on a worker", reported, timeout=60)
    assert {r[2] for r in tasks if r[2]} == {c.name for c in small_cluster.children if c.name.startswith("worker-")}
    assert any(str(r[0]).endswith("CTAS_TIME_ON_SITE_0-changelog") for r in run(small_cluster, "LIST ALL TOPICS;"))

    described = rows(sql(small_cluster.router, "-e", "DESCRIBE EXTENDED time_on_site;", "--output", "json"))
    props = {r["PROPERTY"]: r["VALUE"] for r in described}
    assert props["SCHEMA"] == "USERID VARCHAR KEY, TOTAL INT"
    assert props["WRITTEN_BY"] == "CTAS_TIME_ON_SITE_0" and props["STATUS"] == "OK"
    plain = sql(small_cluster.router, "-e", "DESCRIBE pageviews;").stdout
    assert "Status: OK" in plain and "SECONDS" in plain

    explained = rows(sql(small_cluster.router, "-e", "EXPLAIN CSAS_BY_PAGE_2;", "--output", "json"))
    plan = [r["VALUE"] for r in explained if r["PROPERTY"] == "PLAN"]
    assert any("[ REPARTITION ]" in str(line) for line in plan)
    assert {r["PROPERTY"]: r["VALUE"] for r in explained}["START"] == "earliest"

    missing = sql(small_cluster.router, "-e", "EXPLAIN NOPE;", check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr and "query NOPE does not exist" in missing.stderr
    clash = sql(small_cluster.router, "-e", "CREATE STREAM pageviews (a INT) WITH (kafka_topic='x', value_format='json');",
                check=False)
    assert "ALREADY_EXISTS" in clash.stderr
    typed = sql(small_cluster.router, "-e", "SELECT * FROM time_on_site WHERE total = 'x';", check=False)
    assert "INVALID_ARGUMENT" in typed.stderr and "TOTAL is INT" in typed.stderr

    # PRINT (ksqlDB's): a topic's records as they are, each key and value in the formats that read them; a bare name
    # finds the topic in any case; INTERVAL 2 shows every second record.
    sql(small_cluster.router, "-e", "INSERT INTO pageviews (userid, pageid, seconds) VALUES ('bob', 'news', 3);"
                                    "INSERT INTO pageviews (userid, pageid, seconds) VALUES ('carol', 'shop', 4);")
    topic = f"pageviews-{small_cluster.service_id}"
    printed = rows(sql(small_cluster.router, "-e", f"PRINT '{topic}' FROM BEGINNING LIMIT 3;", "--output", "json"))
    assert sorted((r["KEY"], json.loads(str(r["VALUE"]))) for r in printed) == [
        ("alice", {"PAGEID": "home", "SECONDS": 10}), ("bob", {"PAGEID": "news", "SECONDS": 3}),
        ("carol", {"PAGEID": "shop", "SECONDS": 4})]
    assert all(isinstance(r["ROWTIME"], int) and r["ROWTIME"] > 0 and r["PARTITION"] in (0, 1, 2) for r in printed)
    assert {(r["KEY_FORMAT"], r["VALUE_FORMAT"]) for r in printed} == {("KAFKA_STRING", "JSON or KAFKA_STRING")}
    table = sql(small_cluster.router, "-e", f"PRINT '{topic}' FROM BEGINNING LIMIT 1;").stdout.splitlines()
    assert table[:3] == ["ROWTIME | PARTITION | OFFSET | KEY | VALUE", "Key format: KAFKA_STRING",
                         "Value format: JSON or KAFKA_STRING"], table
    sampled = rows(sql(small_cluster.router, "-e", f"PRINT {topic.upper()} FROM BEGINNING INTERVAL 2 LIMIT 2;",
                       "--output", "json"))
    assert len(sampled) == 2 and {r["KEY"] for r in sampled} < {"alice", "bob", "carol"}
    nowhere = sql(small_cluster.router, "-e", "PRINT 'no-such-topic' LIMIT 1;", check=False)
    assert nowhere.returncode == 1 and "NOT_FOUND" in nowhere.stderr and "'no-such-topic' does not exist" in nowhere.stderr


def test_a_custom_type_is_written_out_as_it_is_when_a_statement_names_it(small_cluster: LocalCluster) -> None:
    """ksqlDB's CREATE TYPE: a stream, a persistent query's CAST (computed over its aggregates on
    the worker) and an INSERT keep the type as it was when they were run; a pull and a push
    after the name was made anew read the new one. (The digest test next checks that every node
    replays the types alike.)"""
    topic = f"payments-{small_cluster.service_id}"
    sql(small_cluster.router, "-e", "CREATE TYPE cents AS DECIMAL(12, 2); CREATE TYPE money AS STRUCT<amount cents, currency VARCHAR>;"
        f"CREATE STREAM payments (id VARCHAR KEY, amount CENTS, paid MONEY) WITH (kafka_topic='{topic}', partitions=1, "
        "value_format='json');"
        "INSERT INTO payments (id, amount) VALUES ('p1', CAST(1.005 AS cents));"
        "INSERT INTO payments (id, amount) VALUES ('p1', 2.5);"
        "SET 'auto.offset.reset'='earliest';"
        "CREATE TABLE paid AS SELECT id, CAST(SUM(amount) * 2 AS cents) AS twice, COUNT(*) AS n FROM payments GROUP BY id;"
        "DROP TYPE cents; CREATE TYPE cents AS INT;")
    listed = {r["NAME"]: r["SCHEMA"] for r in rows(sql(small_cluster.router, "-e", "SHOW TYPES;", "--output", "json"))}
    assert listed == {"CENTS": "INT", "MONEY": "STRUCT<AMOUNT DECIMAL(12, 2), CURRENCY VARCHAR>"}
    described = {r["PROPERTY"]: r["VALUE"] for r in rows(sql(small_cluster.router, "-e", "DESCRIBE EXTENDED payments;",
                                                              "--output", "json"))}
    assert described["SCHEMA"] == "ID VARCHAR KEY, AMOUNT DECIMAL(12, 2), PAID STRUCT<AMOUNT DECIMAL(12, 2), CURRENCY VARCHAR>"
    # 1.005 was rounded to 1.01 as a DECIMAL(12, 2) when inserted; SUM * 2 is cast to that type too.
    pulled = pull_until(small_cluster, "SELECT id, twice, n, CAST(n * 10 AS cents) AS c FROM paid WHERE id = 'p1';",
                        {"p1": ["p1", 7.02, 2, 20]})
    assert pulled == {"p1": ["p1", 7.02, 2, 20]}, pulled
    pushed = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                      "SELECT id, CAST(amount AS cents) AS whole FROM payments EMIT CHANGES LIMIT 2;", "--output", "json"))
    assert [r["WHOLE"] for r in pushed if "WHOLE" in r] == [1, 2], pushed
    missing = sql(small_cluster.router, "-e", "SELECT id, CAST(n AS dollars) FROM paid WHERE id = 'p1';", check=False)
    assert "NOT_FOUND" in missing.stderr and "type DOLLARS does not exist" in missing.stderr


def test_constructors_build_values_in_inserts_persistent_queries_pushes_and_pulls(small_cluster: LocalCluster) -> None:
    """ARRAY[...], MAP(k := v) and STRUCT(f := v) in an INSERT (a DECIMAL field rounded to its
    scale), in a persistent query's projection (Spark) and in a pull (Python); EXPLODE's rows."""
    topic = f"shapes-{small_cluster.service_id}"
    sql(small_cluster.router, "-e",
        "CREATE STREAM shapes_in (id VARCHAR KEY, n INT, s STRUCT<a DECIMAL(4, 1), tags ARRAY<VARCHAR>>, m MAP<VARCHAR, INT>) "
        f"WITH (kafka_topic='{topic}', partitions=1, value_format='json');"
        "INSERT INTO shapes_in (id, n, s, m) VALUES ('a', 1, STRUCT(a := 2.25, tags := ARRAY['x', 'y']), MAP('k' := 1, 'j' := 2));"
        "INSERT INTO shapes_in (id, n) VALUES ('b', 2);"
        "SET 'auto.offset.reset'='earliest';"
        "CREATE STREAM shapes_out AS SELECT id, ARRAY[n, 1.5] AS pair, MAP(id := n, 'all' := 0) AS by_id, "
        "STRUCT(first := s->tags[1], k := m['k'], a := s->a) AS picked FROM shapes_in;"
        "CREATE TABLE shapes_last AS SELECT id, LATEST_BY_OFFSET(n) AS n FROM shapes_in GROUP BY id;"
        "CREATE STREAM shapes_tags AS SELECT id, EXPLODE(s->tags) AS tag, EXPLODE(ARRAY[n, n * 10]) AS m FROM shapes_in;"
        "CREATE STREAM shapes_cube AS SELECT id, CUBE_EXPLODE(ARRAY[n, n * 10]) AS combo FROM shapes_in;")
    pushed = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                      "SELECT * FROM shapes_out EMIT CHANGES LIMIT 2;", "--output", "json"))
    assert [[r["ID"], r["PAIR"], r["BY_ID"], r["PICKED"]] for r in pushed if "ID" in r] == [
        ["a", [1.0, 1.5], {"a": 1, "all": 0}, {"FIRST": "x", "K": 1, "A": 2.3}],
        ["b", [2.0, 1.5], {"b": 2, "all": 0}, {"FIRST": None, "K": None, "A": None}]], pushed
    pulled = pull_until(small_cluster, "SELECT id, ARRAY[n, n * 2] AS twice, STRUCT(v := n)->v AS v, "
                                       "MAP('n' := n) AS m FROM shapes_last WHERE id = 'a';",
                        {"a": ["a", [1, 2], 1, {"n": 1}]})
    assert pulled == {"a": ["a", [1, 2], 1, {"n": 1}]}, pulled
    # EXPLODE: a row of each item, two EXPLODEs zipped, the shorter one NULL past its end
    exploded = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                        "SELECT * FROM shapes_tags EMIT CHANGES LIMIT 4;", "--output", "json"))
    assert [[r["ID"], r["TAG"], r["M"]] for r in exploded if "ID" in r] == [
        ["a", "x", 1], ["a", "y", 10], ["b", None, 2], ["b", None, 20]], exploded
    tags = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                    "SELECT id, EXPLODE(s->tags) AS tag FROM shapes_in EMIT CHANGES LIMIT 2;", "--output", "json"))
    assert [[r["ID"], r["TAG"]] for r in tags if "ID" in r] == [["a", "x"], ["a", "y"]], tags
    # CUBE_EXPLODE: a row of each combination, by Spark in a persistent query and by Python in a push
    cubed = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                     "SELECT * FROM shapes_cube EMIT CHANGES LIMIT 8;", "--output", "json"))
    assert [[r["ID"], r["COMBO"]] for r in cubed if "ID" in r] == [
        [i, combo] for i, n in (("a", 1), ("b", 2)) for combo in ([None, None], [None, n * 10], [n, None], [n, n * 10])]
    pushed_cube = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                           "SELECT id, CUBE_EXPLODE(ARRAY[id, s->tags[2]]) AS combo FROM shapes_in EMIT CHANGES LIMIT 6;",
                           "--output", "json"))
    assert [[r["ID"], r["COMBO"]] for r in pushed_cube if "ID" in r] == [
        ["a", [None, None]], ["a", [None, "y"]], ["a", ["a", None]], ["a", ["a", "y"]],
        ["b", [None, None]], ["b", ["b", None]]], pushed_cube  # b's second item is NULL: its combinations once


JSON_AND_TEXT = ("JSON_KEYS(doc) AS keys, JSON_ARRAY_LENGTH(EXTRACTJSONFIELD(doc, '$.x')) AS n, IS_JSON_STRING(q) AS q_json, "
                 "TO_JSON_STRING(STRUCT(keys := JSON_KEYS(doc), at := CONVERT_TZ(FROM_UNIXTIME(ms), 'America/Los_Angeles', "
                 "'UTC'))) AS written, SPLIT_TO_MAP(q, ';', '=') AS parts, URL_ENCODE_PARAM(q) AS encoded, "
                 "URL_DECODE_PARAM(URL_ENCODE_PARAM(q)) AS decoded, CHR(code) AS c, "
                 "JSON_ITEMS(EXTRACTJSONFIELD(doc, '$.x')) AS items, JSON_RECORDS(doc) AS records, "
                 "JSON_ARRAY_CONTAINS(EXTRACTJSONFIELD(doc, '$.x'), code - 128511) AS has, "
                 """JSON_CONCAT(doc, '{"w": 1}') AS joined, """
                 "ROUND(GEO_DISTANCE(code / 10000.0, 0, 51.5257, -0.1122, 'mi'), 1) AS miles")
"""Functions whose Spark and Python forms differ most, computed by Spark in a persistent query and
by Python in a pull."""
JSON_AND_TEXT_ROW = [["y", "x"], 3, False, '{"KEYS":["y","x"],"AT":"2024-03-10T10:30:00.000"}', {"k": "v", "w": "a b"},
                     "k%3Dv%3Bw%3Da+b", "k=v;w=a b", "\U0001f600", ["1", "2.5", '"3"'],
                     {"x": '[1,2.5,"3"]', "y": '{"z":null}'}, True, '{"w":1,"x":[1,2.5,"3"],"y":{"z":null}}', 2672.3]


def test_json_text_and_time_zone_functions_answer_alike_in_a_persistent_query_and_a_pull(small_cluster: LocalCluster) -> None:
    """JSON_KEYS, JSON_ARRAY_LENGTH, IS_JSON_STRING, TO_JSON_STRING, CONVERT_TZ (a wall time Los
    Angeles skips), SPLIT_TO_MAP, URL_ENCODE_PARAM, URL_DECODE_PARAM, CHR, JSON_ITEMS, JSON_RECORDS,
    JSON_ARRAY_CONTAINS, JSON_CONCAT and GEO_DISTANCE: Spark's values in a stream read by a push, Python's in a pull of the
    same record, the same."""
    topic = f"events-{small_cluster.service_id}"
    sql(small_cluster.router, "-e",
        "CREATE STREAM events_in (id VARCHAR KEY, doc VARCHAR, q VARCHAR, ms BIGINT, code INT) "
        f"WITH (kafka_topic='{topic}', partitions=1, value_format='json');"
        """INSERT INTO events_in (id, doc, q, ms, code) VALUES ('a', '{"y": {"z": null}, "x": [1, 2.50, "3"]}', 'k=v;w=a b', """
        "1710037800000, 128512);"
        "SET 'auto.offset.reset'='earliest';"
        f"CREATE STREAM events_out AS SELECT id, {JSON_AND_TEXT} FROM events_in;"
        "CREATE TABLE events_last AS SELECT id, LATEST_BY_OFFSET(doc) AS doc, LATEST_BY_OFFSET(q) AS q, "
        "LATEST_BY_OFFSET(ms) AS ms, LATEST_BY_OFFSET(code) AS code FROM events_in GROUP BY id;")
    pushed = rows(sql(small_cluster.router, "-e", "SET 'auto.offset.reset'='earliest';"
                      "SELECT * FROM events_out EMIT CHANGES LIMIT 1;", "--output", "json"))
    assert [list(r.values()) for r in pushed if "ID" in r] == [["a", *JSON_AND_TEXT_ROW]], pushed
    want = {"a": ["a", *JSON_AND_TEXT_ROW]}
    pulled = pull_until(small_cluster, f"SELECT id, {JSON_AND_TEXT} FROM events_last WHERE id = 'a';", want)
    assert pulled == want, pulled


def test_a_pull_over_a_stream_answers_with_the_records_it_holds_and_ends(small_cluster: LocalCluster) -> None:
    """A pull query over a stream (ksqlDB's): through Execute, the rows of every record the stream
    holds when it starts that pass its WHERE (ROWTIME too), up to its LIMIT, an EXPLODE's rows;
    then it ends, as a pull does."""
    topic = f"visits-{small_cluster.service_id}"
    sql(small_cluster.router, "-e", f"CREATE STREAM visits (id VARCHAR KEY, n INT, tags ARRAY<VARCHAR>) "
                                    f"WITH (kafka_topic='{topic}', partitions=2, value_format='json');"
                                    "INSERT INTO visits (id, n, tags) VALUES ('a', 1, ARRAY['x']);"
                                    "INSERT INTO visits (id, n, tags) VALUES ('b', 2, ARRAY['y', 'z']);"
                                    "INSERT INTO visits (id, n) VALUES ('c', 3);")
    pulled = rows(sql(small_cluster.router, "-e", "SELECT id, n * 10 AS n FROM visits WHERE n > 1 AND ROWTIME > 0;",
                      "--output", "json"))
    assert sorted([r["ID"], r["N"]] for r in pulled if "ID" in r) == [["b", 20], ["c", 30]], pulled
    limited = rows(sql(small_cluster.router, "-e", "SELECT * FROM visits LIMIT 2;", "--output", "json"))
    assert len([r for r in limited if "ID" in r]) == 2, limited
    exploded = rows(sql(small_cluster.router, "-e", "SELECT id, EXPLODE(tags) AS tag FROM visits WHERE id = 'b';",
                        "--output", "json"))
    assert [[r["ID"], r["TAG"]] for r in exploded if "ID" in r] == [["b", "y"], ["b", "z"]], exploded
    refused = sql(small_cluster.router, "-e", "SELECT id, COUNT(*) FROM visits GROUP BY id;", check=False)
    assert "GROUP BY, HAVING, WINDOW and PARTITION BY need a persistent" in refused.stderr, refused.stderr


def test_a_source_table_is_read_only_and_pulled_from_what_its_topic_holds(small_cluster: LocalCluster) -> None:
    """CREATE SOURCE TABLE (ksqlDB's): its topic's records (written here through a stream over the
    same topic) are materialized and pulled; INSERT into it is refused, and so is CREATE OR REPLACE."""
    topic = f"rates-{small_cluster.service_id}"
    sql(small_cluster.router, "-e", f"CREATE SOURCE TABLE rates (currency VARCHAR PRIMARY KEY, rate DOUBLE) "
                                    f"WITH (kafka_topic='{topic}', partitions=1, value_format='json');"
                                    f"CREATE STREAM rate_feed (currency VARCHAR KEY, rate DOUBLE) "
                                    f"WITH (kafka_topic='{topic}', partitions=1, value_format='json');"
                                    "INSERT INTO rate_feed (currency, rate) VALUES ('EUR', 1.1);"
                                    "INSERT INTO rate_feed (currency, rate) VALUES ('EUR', 1.2);")
    want = {"EUR": ["EUR", 1.2]}
    assert pull_until(small_cluster, "SELECT * FROM rates;", want) == want
    refused = sql(small_cluster.router, "-e", "INSERT INTO rates (currency, rate) VALUES ('USD', 1.0);", check=False)
    assert "cannot insert into read-only table RATES" in " ".join(refused.stderr.split()), refused.stderr
    replaced = sql(small_cluster.router, "-e", f"CREATE OR REPLACE TABLE rates (currency VARCHAR PRIMARY KEY, rate DOUBLE) "
                                               f"WITH (kafka_topic='{topic}', partitions=1, value_format='json');", check=False)
    assert "CREATE OR REPLACE is not supported on SOURCE tables" in " ".join(replaced.stderr.split()), replaced.stderr
    described = sql(small_cluster.router, "-e", "DESCRIBE rates;")
    assert "TABLE (SOURCE, read-only)" in described.stdout, described.stdout


def test_alter_table_adds_a_column_its_materialization_stores_and_pulls_read(small_cluster: LocalCluster) -> None:
    """ALTER TABLE ... ADD COLUMN on a table whose materialization runs: the rows before it pull
    with NULL there, a row inserted after it with its value."""
    topic = f"accounts-{small_cluster.service_id}"
    sql(small_cluster.router, "-e", f"CREATE TABLE accounts (id VARCHAR PRIMARY KEY, n INT) WITH (kafka_topic='{topic}', "
                                    "partitions=1, value_format='json');"
                                    "INSERT INTO accounts (id, n) VALUES ('a', 1);")
    assert pull_until(small_cluster, "SELECT * FROM accounts;", {"a": ["a", 1]}) == {"a": ["a", 1]}
    altered = sql(small_cluster.router, "-e", "ALTER TABLE accounts ADD COLUMN note VARCHAR;"
                                              "INSERT INTO accounts (id, n, note) VALUES ('b', 2, 'new');")
    assert "Table ACCOUNTS altered" in altered.stdout, altered.stdout
    want = {"a": ["a", 1, None], "b": ["b", 2, "new"]}
    assert pull_until(small_cluster, "SELECT * FROM accounts;", want) == want
    refused = sql(small_cluster.router, "-e", "ALTER TABLE accounts ADD COLUMN n BIGINT;", check=False)
    assert "already has a column N" in refused.stderr, refused.stderr


def test_every_node_has_the_same_digest_before_and_after_a_full_restart(small_cluster: LocalCluster) -> None:
    before = digests(small_cluster)
    assert len(before) == 3 and len(set(before.values())) == 1, before
    compared = subprocess.run([*MILLPOND, "digest", *(c.endpoint for c in small_cluster.children)],
                              capture_output=True, text=True, timeout=60)
    assert compared.returncode == 0, compared.stderr

    small_cluster.stop()
    small_cluster.start()
    after = digests(small_cluster)
    assert set(after.values()) == set(before.values()), (before, after)


def test_digest_of_a_node_that_is_down_is_a_clear_error(small_cluster: LocalCluster) -> None:
    with pytest.raises(grpc.RpcError) as info:
        metastore_digest(f"127.0.0.1:{free_port()}", timeout=2)
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
