"""Each plan kind's needs, said once: which kinds keep a changelog (and so get standbys),
which internal topics a query owns, and that the kind hashes into the metastore digest as
the plain string it always was."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import cast

import pytest

from millpond.services.worker.kinds import WORKER_KINDS
from millpond.services.worker.task import (
    AggregateSlice,
    AggregationTask,
    MaterializeSlice,
    ProjectionTask,
    ProjectSlice,
    SessionAggregationTask,
    SessionSlice,
    TableTask,
    WindowedAggregationTask,
    WindowSlice,
)
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.plans import PLAN_SPECS, PlanKind
from millpond.shared.catalog.queries import Resolved
from millpond.shared.catalog.topology import InternalTopic, internal_topics, stages
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.parser import parse_statement
from tests.metastores import applied

STREAM = ("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
          "WITH (kafka_topic='readings', partitions=4, value_format='json')")
USERS = ("CREATE TABLE users (id VARCHAR PRIMARY KEY, name VARCHAR) "
         "WITH (kafka_topic='users', partitions=2, value_format='json')")
QUERIES = {
    "CTAS_BY_SENSOR_1": "CREATE TABLE by_sensor AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor",
    "CTAS_BY_AREA_2": "CREATE TABLE by_area AS SELECT area, COUNT(*) AS n FROM readings GROUP BY area",
    "CSAS_HOT_3": "CREATE STREAM hot AS SELECT sensor, reading FROM readings WHERE reading > 10",
    "CSAS_BY_READING_4": "CREATE STREAM by_reading AS SELECT reading, sensor FROM readings PARTITION BY reading",
    "CTAS_NAMED_5": "CREATE TABLE named AS SELECT id, name FROM users WHERE name IS NOT NULL",
    "CTAS_PER_MINUTE_6": ("CREATE TABLE per_minute AS SELECT sensor, COUNT(*) AS n FROM readings "
                          "WINDOW TUMBLING (SIZE 1 MINUTE, RETENTION 2 HOURS, GRACE PERIOD 10 SECONDS) GROUP BY sensor"),
    "CTAS_AREA_HOPS_7": ("CREATE TABLE area_hops AS SELECT area, COUNT(*) AS n FROM readings "
                         "WINDOW HOPPING (SIZE 1 MINUTE, ADVANCE BY 20 SECONDS) GROUP BY area"),
}


@pytest.fixture(scope="module")
def meta() -> Metastore:
    meta = applied([STREAM, USERS, *QUERIES.values()])
    assert set(QUERIES) <= set(meta.queries)
    return meta


def _metastore(*statements: str) -> Metastore:
    """A metastore that applied ``statements`` in order."""
    return applied(statements)


def test_every_kind_has_one_spec_and_one_worker_row() -> None:
    assert set(PLAN_SPECS) == set(WORKER_KINDS) == set(PlanKind)
    assert [(k.task, k.slice) for k in (WORKER_KINDS[PlanKind.AGGREGATE], WORKER_KINDS[PlanKind.PROJECT],
                                        WORKER_KINDS[PlanKind.MATERIALIZE], WORKER_KINDS[PlanKind.WINDOWED_AGGREGATE])] == [
        (AggregationTask, AggregateSlice), (ProjectionTask, ProjectSlice), (TableTask, MaterializeSlice),
        (WindowedAggregationTask, WindowSlice)]
    assert (WORKER_KINDS[PlanKind.SESSION_AGGREGATE].task, WORKER_KINDS[PlanKind.SESSION_AGGREGATE].slice) == (
        SessionAggregationTask, SessionSlice)


def test_only_group_by_results_keep_a_changelog_and_only_they_and_joins_a_repartition_topic() -> None:
    grouped = {PlanKind.AGGREGATE, PlanKind.WINDOWED_AGGREGATE, PlanKind.SESSION_AGGREGATE}
    assert {k for k in PlanKind if k.spec.changelog} == grouped
    assert {k for k in PlanKind if k.spec.repartition_topic} == grouped | {PlanKind.STREAM_TABLE_JOIN}


def test_the_planner_gives_each_statement_its_kind(meta: Metastore) -> None:
    kinds = {q.query_id: q.plan.kind for q in meta.queries.values()}
    assert kinds == {"CST_USERS_0": PlanKind.MATERIALIZE, "CTAS_BY_SENSOR_1": PlanKind.AGGREGATE,
                     "CTAS_BY_AREA_2": PlanKind.AGGREGATE, "CSAS_HOT_3": PlanKind.PROJECT,
                     "CSAS_BY_READING_4": PlanKind.PROJECT, "CTAS_NAMED_5": PlanKind.PROJECT,
                     "CTAS_PER_MINUTE_6": PlanKind.WINDOWED_AGGREGATE, "CTAS_AREA_HOPS_7": PlanKind.WINDOWED_AGGREGATE}


def test_internal_topics_per_kind(meta: Metastore) -> None:
    owned = {q: internal_topics("svc", meta.queries[q]) for q in meta.queries}
    assert owned == {
        "CST_USERS_0": [],
        "CTAS_BY_SENSOR_1": [InternalTopic("_millpond-svc-CTAS_BY_SENSOR_1-changelog", compacted=True)],
        "CTAS_BY_AREA_2": [InternalTopic("_millpond-svc-CTAS_BY_AREA_2-changelog", compacted=True),
                           InternalTopic("_millpond-svc-CTAS_BY_AREA_2-repartition", compacted=False)],
        "CSAS_HOT_3": [],
        "CSAS_BY_READING_4": [],  # re-keyed straight into the sink's partitions
        "CTAS_NAMED_5": [],  # the sink topic is the table's changelog
        # Windowed changelogs are deleted a day after their windows' retention, as Kafka Streams'.
        "CTAS_PER_MINUTE_6": [InternalTopic("_millpond-svc-CTAS_PER_MINUTE_6-changelog", compacted=True, configs=(
            ("cleanup.policy", "compact,delete"), ("retention.ms", str((2 * 3600 + 24 * 3600) * 1000))))],
        "CTAS_AREA_HOPS_7": [InternalTopic("_millpond-svc-CTAS_AREA_HOPS_7-changelog", compacted=True, configs=(
            ("cleanup.policy", "compact,delete"), ("retention.ms", str(((24 * 3600 + 60) + 24 * 3600) * 1000)))),
                             InternalTopic("_millpond-svc-CTAS_AREA_HOPS_7-repartition", compacted=False)],
    }


def test_standbys_follow_the_result_stage_changelog(meta: Metastore) -> None:
    def staged(query_id: str) -> list[tuple[str, PlanKind, bool]]:
        q = meta.queries[query_id]
        return [(s.name, s.query.plan.kind, s.has_standbys)
                for s in stages(q, meta.source(q.source), meta.source(q.sink), "svc")]

    assert staged("CTAS_BY_SENSOR_1") == [("", PlanKind.AGGREGATE, True)]
    assert staged("CTAS_BY_AREA_2") == [("repartition", PlanKind.PROJECT, False), ("", PlanKind.AGGREGATE, True)]
    assert staged("CSAS_HOT_3") == [("", PlanKind.PROJECT, False)]
    assert staged("CTAS_NAMED_5") == [("project", PlanKind.PROJECT, False), ("", PlanKind.MATERIALIZE, False)]
    assert staged("CST_USERS_0") == [("", PlanKind.MATERIALIZE, False)]
    assert staged("CTAS_AREA_HOPS_7") == [("repartition", PlanKind.PROJECT, False),
                                          ("", PlanKind.WINDOWED_AGGREGATE, True)]
    # Windows by record timestamp behind a repartition: the timestamp travels in a column.
    q = meta.queries["CTAS_AREA_HOPS_7"]
    rekey, aggregate = stages(q, meta.source(q.source), meta.source(q.sink), "svc")
    assert q.plan.event_time is None and aggregate.query.plan.event_time == "`_INPUT_ROWTIME`"
    assert rekey.query.plan.columns[-1].expression == "_rowtime"
    assert rekey.sink.columns[-1].name == "_INPUT_ROWTIME"


def test_a_kind_hashes_into_the_digest_as_its_plain_string(meta: Metastore) -> None:
    assert json.dumps(PlanKind.AGGREGATE) == '"AGGREGATE"'
    # As a node that still held plain strings would have it: the same digest.
    plain = Metastore()
    plain.sources = dict(meta.sources)
    plain.queries = {k: replace(q, plan=replace(q.plan, kind=cast(PlanKind, str(q.plan.kind.value))))
                     for k, q in meta.queries.items()}
    plain.queries_created = meta.queries_created
    assert all(type(q.plan.kind) is str for q in plain.queries.values())
    assert plain.digest() == meta.digest()


def test_definitions_without_windows_hash_as_they_did_before_windows_existed() -> None:
    meta = applied([STREAM, USERS, QUERIES["CTAS_BY_AREA_2"], QUERIES["CSAS_HOT_3"]])
    # The digest of the same four statements by the code before windows (commit ee770fe).
    assert meta.digest() == "be90dee48ff75e6988eaf2a350aeca2b45f1f379e5ff1e12076d9cb504fbd149"


def test_a_join_repartitions_into_its_tables_partitions_whatever_the_sink_has() -> None:
    meta = _metastore(
        "CREATE STREAM s (k VARCHAR KEY, x VARCHAR) WITH (kafka_topic='s', partitions=4, value_format='json')",
        "CREATE TABLE t (id VARCHAR PRIMARY KEY, v INT) WITH (kafka_topic='t', partitions=4, value_format='json')",
        "CREATE STREAM j WITH (partitions=2) AS SELECT s.x, t.v FROM s JOIN t ON s.x = t.id")
    query = next(q for q in meta.queries.values() if q.sink == "J")
    rekey, join = stages(query, meta.source("S"), meta.source("J"), "svc")
    assert (rekey.sink.partitions, join.source.partitions, join.partitions) == (4, 4, 4)
    assert meta.source("J").partitions == 2


def test_a_table_table_join_gathers_its_tables_then_joins_then_materializes() -> None:
    meta = _metastore(
        "CREATE TABLE a (id VARCHAR PRIMARY KEY, x VARCHAR) WITH (kafka_topic='a', partitions=3, value_format='json')",
        "CREATE TABLE b (id VARCHAR PRIMARY KEY, y INT) WITH (kafka_topic='b', partitions=3, value_format='delimited')",
        "CREATE TABLE ab AS SELECT a.id, a.x, b.y FROM a FULL OUTER JOIN b ON a.id = b.id")
    query = next(q for q in meta.queries.values() if q.sink == "AB")
    assert query.plan.kind is PlanKind.TABLE_TABLE_JOIN
    staged = stages(query, meta.source("A"), meta.source("AB"), "svc")
    gathered = "_millpond-svc-" + query.query_id + "-joined"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions, s.has_standbys)
            for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "a", gathered, 3, False),
        ("side-1", PlanKind.JOIN_SIDE, "b", gathered, 3, False),
        ("join", PlanKind.TABLE_TABLE_JOIN, gathered, "AB", 3, False),
        ("", PlanKind.MATERIALIZE, "AB", "AB", 3, True)]
    assert internal_topics("svc", query) == [
        InternalTopic(gathered, compacted=True, configs=(("delete.retention.ms", str(7 * 24 * 3600 * 1000)),))]


def test_a_joined_table_of_any_types_has_standbys() -> None:
    """The result's copies and its active task decode its topic alike (``TableRecords``):
    DATE, TIME, BYTES and nested columns no longer leave it without standbys."""
    meta = _metastore(
        "CREATE TABLE a (id VARCHAR PRIMARY KEY, d DATE, t TIME) WITH (kafka_topic='a', partitions=3, value_format='json')",
        "CREATE TABLE b (id VARCHAR PRIMARY KEY, s STRUCT<b BYTES, ds ARRAY<DATE>>) "
        "WITH (kafka_topic='b', partitions=3, value_format='json')",
        "CREATE TABLE ab AS SELECT a.id, a.d, a.t, b.s FROM a LEFT JOIN b ON a.id = b.id")
    query = next(q for q in meta.queries.values() if q.sink == "AB")
    *_, materialize = stages(query, meta.source("A"), meta.source("AB"), "svc")
    assert (materialize.replayed, materialize.has_standbys) == (True, True)


def test_a_tables_aggregation_regroups_its_rows_then_aggregates_them() -> None:
    """GROUP BY over a table: the regroup stage reads the table whole (whatever the query's
    start offsets) into the repartition topic, ``_SIGN`` the first value column, and keeps a
    changelog of the table's partitions; the aggregation adds and retracts what it reads."""
    meta = _metastore(
        "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) "
        "WITH (kafka_topic='pages', partitions=3, value_format='json')",
        "CREATE TABLE owners WITH (partitions=2) AS SELECT owner, COUNT(*) AS n, SUM(weight) AS w FROM pages "
        "GROUP BY owner")
    query = replace(next(q for q in meta.queries.values() if q.sink == "OWNERS"), start_offsets=(5, 5, 5))
    assert (query.plan.kind, query.plan.repartition, query.plan.regrouped) == (PlanKind.AGGREGATE, True, 3)
    staged = stages(query, meta.source("PAGES"), meta.source("OWNERS"), "svc")
    repartition = "_millpond-svc-" + query.query_id + "-repartition"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions, s.sink.partitions,
             s.query.start_offsets, s.has_standbys) for s in staged] == [
        ("regroup", PlanKind.REGROUP, "pages", repartition, 3, 2, None, False),
        ("", PlanKind.AGGREGATE, repartition, "OWNERS", 2, 2, None, True)]
    assert [c.name for c in staged[0].sink.value_columns] == ["_SIGN", "PAGE", "OWNER", "WEIGHT", "_INPUT_ROWTIME",
                                                                   "_CHANGED_ROWTIME"]
    assert staged[0].query.plan.columns[1].expression == "1" and staged[0].query.plan.key_expression == "`OWNER`"
    assert [(t.name, t.compacted, t.partitions) for t in internal_topics("svc", query)] == [
        ("_millpond-svc-" + query.query_id + "-changelog", True, None),
        (repartition, False, None),
        ("_millpond-svc-" + query.query_id + "-regroup-changelog", True, 3)]


def test_a_group_by_over_tables_joined_regroups_the_joined_rows() -> None:
    """GROUP BY over a foreign-key join of two tables: the join's sides and join stage write
    each left key's joined row (every column) into the compacted joined-rows topic, a table of
    the left's partitions, which the regroup stage reads (no materialization of the rows)."""
    meta = _metastore(
        "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) "
        "WITH (kafka_topic='pages', partitions=4, value_format='json')",
        "CREATE TABLE owners (name VARCHAR PRIMARY KEY, team VARCHAR) "
        "WITH (kafka_topic='owners', partitions=3, value_format='json')",
        "CREATE TABLE teams WITH (partitions=2) AS SELECT o.team, COUNT(*) AS n, SUM(p.weight) AS w FROM pages p "
        "LEFT JOIN owners o ON p.owner = o.name WHERE p.weight > 0 GROUP BY o.team")
    query = next(q for q in meta.queries.values() if q.sink == "TEAMS")
    assert (query.plan.kind, query.plan.key_expression, query.plan.regrouped) == (PlanKind.AGGREGATE, "`O_TEAM`", 4)
    staged = stages(query, meta.source("PAGES"), meta.source("TEAMS"), "svc")
    prefix = "_millpond-svc-" + query.query_id
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions, s.sink.partitions)
            for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "pages", prefix + "-joined", 4, 4),
        ("side-1", PlanKind.JOIN_SIDE, "owners", prefix + "-joined", 3, 4),
        ("join", PlanKind.FOREIGN_KEY_JOIN, prefix + "-joined", prefix + "-joined-rows", 4, 4),
        ("regroup", PlanKind.REGROUP, prefix + "-joined-rows", prefix + "-repartition", 4, 2),
        ("", PlanKind.AGGREGATE, prefix + "-repartition", "TEAMS", 2, 2)]
    rows = staged[2].sink
    assert [(c.name, c.key) for c in rows.columns] == [
        ("_JOIN_KEY", True), ("P_PAGE", False), ("P_OWNER", False), ("P_WEIGHT", False), ("O_NAME", False),
        ("O_TEAM", False)]
    assert rows.kind == "TABLE" and staged[3].query.plan.where is None  # the join task applies the WHERE
    assert [(t.name, t.compacted, t.partitions) for t in internal_topics("svc", query)] == [
        (prefix + "-changelog", True, None), (prefix + "-repartition", False, None),
        (prefix + "-regroup-changelog", True, 4), (prefix + "-joined", True, 4), (prefix + "-joined-rows", True, 4)]


def test_a_group_by_over_a_stream_stream_join_then_a_table_keys_the_last_joined_rows_by_it() -> None:
    meta = _metastore(
        "CREATE STREAM c (uid VARCHAR KEY, page VARCHAR) WITH (kafka_topic='c', partitions=2, value_format='json')",
        "CREATE STREAM v (uid VARCHAR KEY, ms INT) WITH (kafka_topic='v', partitions=2, value_format='json')",
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, "
        "value_format='json')",
        "CREATE TABLE po AS SELECT p.owner, COUNT(*) AS n, SUM(v.ms) AS ms FROM c JOIN v WITHIN 1 HOUR "
        "ON c.uid = v.uid JOIN p ON c.page = p.id GROUP BY p.owner")
    query = next(q for q in meta.queries.values() if q.sink == "PO")
    prefix = "_millpond-svc-" + query.query_id
    staged = stages(query, meta.source("C"), meta.source("PO"), "svc")
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "c", prefix + "-joined"),
        ("side-1", PlanKind.JOIN_SIDE, "v", prefix + "-joined"),
        ("join-0", PlanKind.STREAM_STREAM_JOIN, prefix + "-joined", prefix + "-joined-1"),
        ("join", PlanKind.STREAM_TABLE_JOIN, prefix + "-joined-1", prefix + "-joined-grouped"),
        ("", PlanKind.AGGREGATE, prefix + "-joined-grouped", "PO")]
    assert {t.name for t in internal_topics("svc", query)} == {
        prefix + "-changelog", prefix + "-joined", prefix + "-joined-1", prefix + "-joined-grouped"}


def test_tables_joined_on_different_keys_chain_a_stage_per_key() -> None:
    """pages LEFT JOIN owners ON a foreign key, LEFT JOIN teams ON a column of owners (another
    foreign key), JOIN meta ON pages' key: a join stage each, the rows joined so far (every
    column, keyed by pages' key) the next stage's left table; then the materialization."""
    meta = _metastore(
        "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) "
        "WITH (kafka_topic='pages', partitions=4, value_format='json')",
        "CREATE TABLE owners (name VARCHAR PRIMARY KEY, team VARCHAR) WITH (kafka_topic='owners', partitions=3, "
        "value_format='json')",
        "CREATE TABLE teams (id VARCHAR PRIMARY KEY, boss VARCHAR) WITH (kafka_topic='teams', partitions=2, "
        "value_format='json')",
        "CREATE TABLE meta (page VARCHAR PRIMARY KEY, tag VARCHAR) WITH (kafka_topic='meta', partitions=4, "
        "value_format='json')",
        "CREATE TABLE pb AS SELECT p.page, p.weight, o.team, t.boss, m.tag FROM pages p LEFT JOIN owners o "
        "ON p.owner = o.name LEFT JOIN teams t ON o.team = t.id JOIN meta m ON p.page = m.page")
    query = next(q for q in meta.queries.values() if q.sink == "PB")
    assert query.plan.join is not None
    assert [(t.table.name, t.step, t.foreign_key) for t in query.plan.join.tables] == [
        ("OWNERS", 0, "OWNER"), ("TEAMS", 1, "O_TEAM"), ("META", 2, None)]
    prefix = "_millpond-svc-" + query.query_id
    staged = stages(query, meta.source("PAGES"), meta.source("PB"), "svc")
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "pages", prefix + "-joined", 4),
        ("side-1", PlanKind.JOIN_SIDE, "owners", prefix + "-joined", 3),
        ("join", PlanKind.FOREIGN_KEY_JOIN, prefix + "-joined", prefix + "-joined-rows-0", 4),
        ("side-1-0", PlanKind.JOIN_SIDE, prefix + "-joined-rows-0", prefix + "-joined-1", 4),
        ("side-1-1", PlanKind.JOIN_SIDE, "teams", prefix + "-joined-1", 2),
        ("join-1", PlanKind.FOREIGN_KEY_JOIN, prefix + "-joined-1", prefix + "-joined-rows-1", 4),
        ("side-2-0", PlanKind.JOIN_SIDE, prefix + "-joined-rows-1", prefix + "-joined-2", 4),
        ("side-2-1", PlanKind.JOIN_SIDE, "meta", prefix + "-joined-2", 4),
        ("join-2", PlanKind.TABLE_TABLE_JOIN, prefix + "-joined-2", "PB", 4),
        ("", PlanKind.MATERIALIZE, "PB", "PB", 4)]
    assert [c.name for c in staged[5].sink.value_columns] == ["P_PAGE", "P_OWNER", "P_WEIGHT", "O_NAME", "O_TEAM",
                                                               "T_ID", "T_BOSS"]
    assert [(t.name, t.compacted, t.partitions) for t in internal_topics("svc", query)] == [
        (prefix + "-joined", True, None), (prefix + "-joined-1", True, 4), (prefix + "-joined-rows-0", True, 4),
        (prefix + "-joined-2", True, 4), (prefix + "-joined-rows-1", True, 4)]

    # The same chain under a GROUP BY: its last stage writes the joined table the aggregation regroups.
    meta.apply(parse_statement("CREATE TABLE per_boss AS SELECT t.boss, COUNT(*) AS n FROM pages p JOIN owners o "
                               "ON p.owner = o.name JOIN teams t ON o.team = t.id GROUP BY t.boss"), 9)
    query = next(q for q in meta.queries.values() if q.sink == "PER_BOSS")
    prefix = "_millpond-svc-" + query.query_id
    staged = stages(query, meta.source("PAGES"), meta.source("PER_BOSS"), "svc")
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic) for s in staged][2:] == [
        ("join", PlanKind.FOREIGN_KEY_JOIN, prefix + "-joined", prefix + "-joined-rows-0"),
        ("side-1-0", PlanKind.JOIN_SIDE, prefix + "-joined-rows-0", prefix + "-joined-1"),
        ("side-1-1", PlanKind.JOIN_SIDE, "teams", prefix + "-joined-1"),
        ("join-1", PlanKind.FOREIGN_KEY_JOIN, prefix + "-joined-1", prefix + "-joined-rows"),
        ("regroup", PlanKind.REGROUP, prefix + "-joined-rows", prefix + "-repartition"),
        ("", PlanKind.AGGREGATE, prefix + "-repartition", "PER_BOSS")]
    assert {t.name for t in internal_topics("svc", query)} >= {prefix + "-joined-1", prefix + "-joined-rows-0",
                                                               prefix + "-joined-rows"}


def test_a_foreign_key_join_copies_the_right_table_to_every_partition_of_the_left() -> None:
    meta = _metastore(
        "CREATE TABLE a (id INT PRIMARY KEY, b_id VARCHAR) WITH (kafka_topic='a', partitions=4, value_format='json')",
        "CREATE TABLE b (id VARCHAR PRIMARY KEY, y INT) WITH (kafka_topic='b', partitions=3, value_format='json')",
        "CREATE TABLE ab AS SELECT a.id, b.y FROM a LEFT JOIN b ON a.b_id = b.id")
    query = next(q for q in meta.queries.values() if q.sink == "AB")
    assert query.plan.kind is PlanKind.FOREIGN_KEY_JOIN and query.start_offsets is None
    assert query.plan.join is not None and query.plan.join.tables[0].foreign_key == "B_ID"
    assert (query.plan.key_column, query.plan.key_expression, query.plan.repartition) == ("ID", None, False)
    staged = stages(query, meta.source("A"), meta.source("AB"), "svc")
    gathered = "_millpond-svc-" + query.query_id + "-joined"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions, s.sink.partitions)
            for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "a", gathered, 4, 4),
        ("side-1", PlanKind.JOIN_SIDE, "b", gathered, 3, 4),
        ("join", PlanKind.FOREIGN_KEY_JOIN, gathered, "AB", 4, 4),
        ("", PlanKind.MATERIALIZE, "AB", "AB", 4, 4)]
    assert internal_topics("svc", query) == [
        InternalTopic(gathered, compacted=True, configs=(("delete.retention.ms", str(7 * 24 * 3600 * 1000)),))]


def test_joins_without_windows_hash_as_they_did_before_stream_stream_joins() -> None:
    meta = _metastore(
        "CREATE STREAM s (k VARCHAR KEY, x VARCHAR) WITH (kafka_topic='s', partitions=4, value_format='json')",
        "CREATE TABLE t (id VARCHAR PRIMARY KEY, v INT) WITH (kafka_topic='t', partitions=4, value_format='json')",
        "CREATE STREAM j AS SELECT s.k, s.x, t.v FROM s LEFT JOIN t ON s.k = t.id")
    # The digest of the same statements by the code before stream-stream joins (commit b5fd11d).
    assert meta.digest() == "d2930da0bae29493dfcf9ccf240f4a240593654373d42d308ef1d49cbe54f8b7"


def test_definitions_hash_as_they_did_before_typed_calls_and_source_tables() -> None:
    """A call's argument types (``Call.arg_types``) and a source's ``read_only`` stay out of the
    digest while unset: functions in projections, filters, a HAVING and a join's condition, and
    declared sources, hash as before either existed, so nodes of both releases agree."""
    meta = _metastore(
        "CREATE STREAM s (k VARCHAR KEY, x VARCHAR, n INT, d DOUBLE) WITH (kafka_topic='s', partitions=2, value_format='json')",
        "CREATE TABLE t (id VARCHAR PRIMARY KEY, v INT) WITH (kafka_topic='t', partitions=2, value_format='json')",
        "CREATE STREAM f AS SELECT k, UCASE(x) AS u, ROUND(d, 2) AS r, SUBSTRING(x, 1, n) AS sub FROM s WHERE LEN(x) > 2",
        "CREATE TABLE g AS SELECT k, COUNT(*) AS c, SUM(n) AS total FROM s WHERE ABS(n) > 1 GROUP BY k HAVING COUNT(*) > 1",
        "CREATE STREAM j AS SELECT s.k, LCASE(s.x) AS lx, t.v FROM s LEFT JOIN t ON s.k = t.id WHERE t.v IS NOT NULL",
        "CREATE TABLE tt AS SELECT id, ABS(v) AS av FROM t")
    # The digest of the same statements by the code before either (commit 8cd3287).
    assert meta.digest() == "0918181f36add69da41f6b710ec1b256fd0b98e424cd269cadbcd247bbe7947e"


def test_a_stream_stream_join_stamps_event_time_in_its_sides_only() -> None:
    meta = _metastore(
        "CREATE STREAM a (k VARCHAR KEY, ts BIGINT, x INT) "
        "WITH (kafka_topic='a', partitions=2, value_format='json', timestamp='ts')",
        "CREATE STREAM b (k VARCHAR KEY, y INT) WITH (kafka_topic='b', partitions=2, value_format='json')",
        "CREATE STREAM ab AS SELECT a.k, a.x, b.y FROM a LEFT JOIN b WITHIN (1 SECOND, 2 SECONDS) "
        "GRACE PERIOD 3 SECONDS ON a.k = b.k")
    query = next(q for q in meta.queries.values() if q.sink == "AB")
    staged = stages(query, meta.source("A"), meta.source("AB"), "svc")
    assert [(s.name, s.query.plan.kind, s.query.plan.event_time, s.source.topic) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "`TS`", "a"), ("side-1", PlanKind.JOIN_SIDE, None, "b"),
        ("", PlanKind.STREAM_STREAM_JOIN, None, "_millpond-svc-" + query.query_id + "-joined")]
    assert internal_topics("svc", query) == [InternalTopic(
        "_millpond-svc-" + query.query_id + "-joined", compacted=False,
        configs=(("retention.ms", str(7 * 24 * 3600 * 1000)), ("message.timestamp.type", "CreateTime")))]


def test_where_one_stream_is_rekeyed_both_sides_go_to_their_join_keys_partition() -> None:
    meta = _metastore(
        "CREATE STREAM a (id VARCHAR KEY, x INT) WITH (kafka_topic='a', partitions=3, value_format='json')",
        "CREATE STREAM c (k VARCHAR KEY, ref VARCHAR) WITH (kafka_topic='c', partitions=3, value_format='json')",
        "CREATE STREAM ac AS SELECT a.id, a.x, c.k FROM a JOIN c WITHIN 1 SECOND ON a.id = c.ref",
        "CREATE STREAM ak AS SELECT a.id, a.x, c.k FROM a JOIN c WITHIN 1 SECOND ON a.id = c.k")
    rekeyed = next(q for q in meta.queries.values() if q.sink == "AC")
    staged = stages(rekeyed, meta.source("A"), meta.source("AC"), "svc")
    assert [(s.name, s.query.plan.key_expression, s.query.plan.repartition) for s in staged] == [
        ("side-0", None, True), ("side-1", "`REF`", True), ("", None, False)]
    on_keys = next(q for q in meta.queries.values() if q.sink == "AK")
    staged = stages(on_keys, meta.source("A"), meta.source("AK"), "svc")
    assert [(s.query.plan.key_expression, s.query.plan.repartition) for s in staged] == [(None, False)] * 3


def test_a_table_join_of_three_tables_has_a_side_stage_for_each() -> None:
    meta = _metastore(*(
        f"CREATE TABLE {t} (id VARCHAR PRIMARY KEY, {t}_v INT) WITH (kafka_topic='{t}', partitions=2, value_format='json')"
        for t in "abc"), "CREATE TABLE abc AS SELECT a.id, a_v, b_v, c_v FROM a LEFT JOIN b ON a.id = b.id "
                        "FULL OUTER JOIN c ON a.id = c.id")
    query = next(q for q in meta.queries.values() if q.sink == "ABC")
    staged = stages(query, meta.source("A"), meta.source("ABC"), "svc")
    assert [(s.name, s.source.topic, s.query.plan.repartition) for s in staged] == [
        ("side-0", "a", False), ("side-1", "b", False), ("side-2", "c", False),
        ("join", "_millpond-svc-" + query.query_id + "-joined", False), ("", "ABC", False)]


def test_a_multi_way_join_on_several_expressions_joins_in_a_stage_per_expression() -> None:
    meta = _metastore(
        "CREATE STREAM v (userid VARCHAR KEY, page VARCHAR, ms INT, ts BIGINT) "
        "WITH (kafka_topic='v', partitions=3, value_format='json', timestamp='ts')",
        "CREATE TABLE p (page VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=3, value_format='json')",
        "CREATE TABLE w (page VARCHAR PRIMARY KEY, weight INT) WITH (kafka_topic='w', partitions=3, value_format='json')",
        "CREATE TABLE o (name VARCHAR PRIMARY KEY, team INT) WITH (kafka_topic='o', partitions=3, value_format='json')",
        "CREATE TABLE t (id INT PRIMARY KEY, boss VARCHAR) WITH (kafka_topic='t', partitions=3, value_format='json')",
        "CREATE STREAM j AS SELECT t.id, v.ms, w.weight, p.owner, t.boss FROM v JOIN p ON v.page = p.page "
        "LEFT JOIN w ON v.page = w.page JOIN o ON p.owner = o.name LEFT JOIN t ON o.team + 1 = t.id")
    query = next(q for q in meta.queries.values() if q.sink == "J")
    assert query.plan.join is not None and [t.step for t in query.plan.join.tables] == [0, 0, 1, 2]
    staged = stages(query, meta.source("V"), meta.source("J"), "svc")
    joined = "_millpond-svc-" + query.query_id + "-joined"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.query.plan.event_time,
             s.query.plan.join and s.query.plan.join.step) for s in staged] == [
        ("repartition", PlanKind.PROJECT, "v", "_millpond-svc-" + query.query_id + "-repartition", None, None),
        ("join-0", PlanKind.STREAM_TABLE_JOIN, "_millpond-svc-" + query.query_id + "-repartition", joined + "-1",
         "`TS`", 0),
        ("join-1", PlanKind.STREAM_TABLE_JOIN, joined + "-1", joined + "-2", None, 1),
        ("", PlanKind.STREAM_TABLE_JOIN, joined + "-2", "J", None, 2)]
    # Each stage's topic carries the joined row so far, keyed as the next tables are.
    assert [c.name for c in staged[2].source.columns] == [
        "_REPARTITION_KEY", "V_USERID", "V_PAGE", "V_MS", "V_TS", "P_PAGE", "P_OWNER", "W_PAGE", "W_WEIGHT",
        "_INPUT_ROWTIME"]
    assert [str(c.type) for c in staged[2].sink.key_columns] == ["INT"] and staged[2].sink.partitions == 3
    assert [(t.name, t.compacted) for t in internal_topics("svc", query)] == [
        ("_millpond-svc-" + query.query_id + "-repartition", False), (joined + "-1", False), (joined + "-2", False)]
    assert staged[0].query.start_offsets == query.start_offsets and staged[-1].query.start_offsets is None
    # The stream is re-keyed as the first stage's table is keyed (VARCHAR), whatever the next
    # one's key (INT); the internal topics have the tables' partitions, whatever the sink has.
    meta.apply(parse_statement("CREATE STREAM j2 WITH (partitions=1) AS SELECT t.id, v.ms FROM v JOIN p "
                               "ON v.page = p.page JOIN t ON LEN(p.owner) = t.id"), len(meta.queries) + 10)
    query = next(q for q in meta.queries.values() if q.sink == "J2")
    rekey, first, last = stages(query, meta.source("V"), meta.source("J2"), "svc")
    assert [(c.name, str(c.type), c.expression) for c in rekey.query.plan.columns if c.key] == [
        ("_REPARTITION_KEY", "VARCHAR", "`PAGE`")]
    assert [str(c.type) for c in first.sink.key_columns] == ["INT"] and last.sink.partitions == 1
    assert [t.partitions for t in internal_topics("svc", query)] == [3, 3]


def test_a_stream_stream_join_then_a_table_runs_the_windowed_join_then_a_stream_table_join() -> None:
    meta = _metastore(
        "CREATE STREAM c (uid VARCHAR KEY, page VARCHAR) WITH (kafka_topic='c', partitions=2, value_format='json')",
        "CREATE STREAM v (uid VARCHAR KEY, ms INT) WITH (kafka_topic='v', partitions=2, value_format='json')",
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, value_format='json')",
        "CREATE STREAM s AS SELECT c.page, v.ms, p.owner FROM c JOIN v WITHIN 1 HOUR ON c.uid = v.uid "
        "LEFT JOIN p ON c.page = p.id")
    query = next(q for q in meta.queries.values() if q.sink == "S")
    staged = stages(query, meta.source("C"), meta.source("S"), "svc")
    joined = "_millpond-svc-" + query.query_id + "-joined"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "c", joined), ("side-1", PlanKind.JOIN_SIDE, "v", joined),
        ("join-0", PlanKind.STREAM_STREAM_JOIN, joined, joined + "-1"),
        ("", PlanKind.STREAM_TABLE_JOIN, joined + "-1", "S")]
    assert [c.name for c in staged[-1].source.value_columns] == [
        "C_UID", "C_PAGE", "C_ROWTIME", "V_UID", "V_MS", "_INPUT_ROWTIME"]
    assert [t.name for t in internal_topics("svc", query)] == [joined + "-1", joined]


def test_a_stream_joined_after_a_table_has_a_stream_stream_stage_of_its_own() -> None:
    """``c JOIN p ON ... JOIN v WITHIN ...``: the stream-table join writes its rows keyed by v's
    join column into the chained topic; that topic (by the rows' time) and v (by its own, from
    its start offsets) are copied into the stage's own topic; the stream-stream join there
    writes the result."""
    meta = _metastore(
        "CREATE STREAM c (uid VARCHAR KEY, page VARCHAR) WITH (kafka_topic='c', partitions=2, value_format='json')",
        "CREATE STREAM v (vid VARCHAR KEY, uid VARCHAR, ms INT) WITH (kafka_topic='v', partitions=2, value_format='json')",
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, value_format='json')")
    meta.apply(parse_statement(
        "CREATE STREAM s AS SELECT c.uid, p.owner, v.ms FROM c LEFT JOIN p ON c.page = p.id "
        "JOIN v WITHIN 10 SECONDS GRACE PERIOD 1 SECOND ON c.uid = v.uid"), 9, None, Resolved(start_offsets=(5, 6, 7, 8)))
    query = next(q for q in meta.queries.values() if q.sink == "S")
    assert query.plan.join is not None and [t.step for t in query.plan.join.tables] == [0, 1]
    staged = stages(query, meta.source("C"), meta.source("S"), "svc")
    prefix = "_millpond-svc-" + query.query_id
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.query.plan.event_time,
             s.query.plan.key_expression, s.query.start_offsets) for s in staged] == [
        ("repartition", PlanKind.PROJECT, "c", prefix + "-repartition", None, "`PAGE`", (5, 6)),
        ("join-0", PlanKind.STREAM_TABLE_JOIN, prefix + "-repartition", prefix + "-joined-1", None, None, None),
        ("side-1-0", PlanKind.JOIN_SIDE, prefix + "-joined-1", prefix + "-joined-1-streams", "`_INPUT_ROWTIME`", None,
         None),
        ("side-1-1", PlanKind.JOIN_SIDE, "v", prefix + "-joined-1-streams", None, "`UID`", (7, 8)),
        ("", PlanKind.STREAM_STREAM_JOIN, prefix + "-joined-1-streams", "S", None, None, None)]
    # The rows so far keep the stream record's own time: the next rows' time is the later record's.
    assert [c.name for c in staged[1].sink.value_columns] == [
        "C_UID", "C_PAGE", "C_ROWTIME", "P_ID", "P_OWNER", "_INPUT_ROWTIME"]
    topics = {t.name: t for t in internal_topics("svc", query)}
    assert list(topics) == [prefix + "-repartition", prefix + "-joined-1", prefix + "-joined-1-streams"]
    assert dict(topics[prefix + "-joined-1-streams"].configs) == {
        "retention.ms": str(7 * 24 * 3_600_000), "message.timestamp.type": "CreateTime"}


def test_three_streams_and_a_table_take_each_streams_own_start_offsets() -> None:
    """``a JOIN b WITHIN .. JOIN p ON .. JOIN c WITHIN ..`` under auto.offset.reset=latest: the
    start offsets cover the three streams in the order they are joined; each side stage of a
    stream takes its own, the stages reading the query's topics none."""
    meta = _metastore(*(
        f"CREATE STREAM {s} (id VARCHAR KEY, page VARCHAR, {s}_v INT) "
        f"WITH (kafka_topic='{s}', partitions=2, value_format='json')" for s in "abc"),
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, value_format='json')")
    meta.apply(parse_statement(
        "CREATE STREAM abpc AS SELECT c.page, a_v, b_v, c_v, p.owner FROM a JOIN b WITHIN 1 MINUTE ON a.id = b.id "
        "LEFT JOIN p ON a.page = p.id JOIN c WITHIN 1 MINUTE ON p.id = c.page"), 9, None,
        Resolved(start_offsets=(10, 11, 20, 21, 30, 31)))
    query = next(q for q in meta.queries.values() if q.sink == "ABPC")
    staged = stages(query, meta.source("A"), meta.source("ABPC"), "svc")
    assert [(s.name, s.query.plan.kind, s.source.topic, s.query.start_offsets) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "a", (10, 11)), ("side-1", PlanKind.JOIN_SIDE, "b", (20, 21)),
        ("join-0", PlanKind.STREAM_STREAM_JOIN, f"_millpond-svc-{query.query_id}-joined", None),
        ("join-1", PlanKind.STREAM_TABLE_JOIN, f"_millpond-svc-{query.query_id}-joined-1", None),
        ("side-2-0", PlanKind.JOIN_SIDE, f"_millpond-svc-{query.query_id}-joined-2", None),
        ("side-2-1", PlanKind.JOIN_SIDE, "c", (30, 31)),
        ("", PlanKind.STREAM_STREAM_JOIN, f"_millpond-svc-{query.query_id}-joined-2-streams", None)]
    assert staged[5].query.plan.key_expression == "`PAGE`"  # c re-keyed by the column it is joined on


def test_a_group_by_over_a_stream_joined_after_a_table_aggregates_the_last_stages_rows() -> None:
    """``c JOIN p ON .. JOIN v WITHIN .. GROUP BY p.owner``: the stages of the n-way join, the
    stream-stream stage last, writing every column of each joined row keyed by the GROUP BY
    into the joined topic at the table's partition count, which the aggregation reads; each
    stream's side takes its own start offsets, and the stream stage's topic is the query's."""
    meta = _metastore(
        "CREATE STREAM c (uid VARCHAR KEY, page VARCHAR) WITH (kafka_topic='c', partitions=2, value_format='json')",
        "CREATE STREAM v (vid VARCHAR KEY, uid VARCHAR, ms INT) WITH (kafka_topic='v', partitions=2, value_format='json')",
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, value_format='json')")
    meta.apply(parse_statement(
        "CREATE TABLE per_owner WITH (partitions=1) AS SELECT p.owner, COUNT(*) AS n, MAX(v.ms) AS longest FROM c "
        "JOIN p ON c.page = p.id JOIN v WITHIN 10 SECONDS ON c.uid = v.uid GROUP BY p.owner"), 9, None,
        Resolved(start_offsets=(5, 6, 7, 8)))
    query = next(q for q in meta.queries.values() if q.sink == "PER_OWNER")
    staged = stages(query, meta.source("C"), meta.source("PER_OWNER"), "svc")
    prefix = "_millpond-svc-" + query.query_id
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.sink.partitions, s.query.start_offsets)
            for s in staged] == [
        ("repartition", PlanKind.PROJECT, "c", prefix + "-repartition", 2, (5, 6)),
        ("join-0", PlanKind.STREAM_TABLE_JOIN, prefix + "-repartition", prefix + "-joined-1", 2, None),
        ("side-1-0", PlanKind.JOIN_SIDE, prefix + "-joined-1", prefix + "-joined-1-streams", 2, None),
        ("side-1-1", PlanKind.JOIN_SIDE, "v", prefix + "-joined-1-streams", 2, (7, 8)),
        ("join", PlanKind.STREAM_STREAM_JOIN, prefix + "-joined-1-streams", prefix + "-joined", 1, None),
        ("", PlanKind.AGGREGATE, prefix + "-joined", "PER_OWNER", 1, None)]
    # The rows' time is the later record's; c's own travels beside it, for c.ROWTIME.
    assert [c.name for c in staged[4].sink.columns] == [
        "_REPARTITION_KEY", "C_UID", "C_PAGE", "P_ID", "P_OWNER", "V_VID", "V_UID", "V_MS", "C_ROWTIME",
        "_INPUT_ROWTIME"]
    assert [t.name for t in internal_topics("svc", query)] == [
        prefix + "-changelog", prefix + "-repartition", prefix + "-joined", prefix + "-joined-1",
        prefix + "-joined-1-streams"]


@pytest.mark.parametrize("first", ["JOIN p ON c.page = p.id", "JOIN b WITHIN 1 MINUTE ON c.uid = b.id"])
def test_a_later_stream_is_keyed_as_the_rows_so_far_whatever_the_group_by(first: str) -> None:
    """A stream joined after another JOIN on a column of another type than the first JOIN's
    (INT after VARCHAR): its side stage re-keys it by that type, as the stage before writes
    the rows so far, under a GROUP BY too (whose result key is neither), so the two meet."""
    meta = _metastore(
        "CREATE STREAM c (uid VARCHAR KEY, page VARCHAR, n INT) WITH (kafka_topic='c', partitions=2, value_format='json')",
        "CREATE STREAM v (vid VARCHAR KEY, n INT, ms INT) WITH (kafka_topic='v', partitions=2, value_format='json')",
        "CREATE STREAM b (id VARCHAR KEY, y VARCHAR) WITH (kafka_topic='b', partitions=2, value_format='json')",
        "CREATE TABLE p (id VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='p', partitions=2, value_format='json')")
    for offset, sql in enumerate([f"CREATE TABLE g AS SELECT c.uid, COUNT(*) AS k FROM c {first} "
                                  "JOIN v WITHIN 1 MINUTE ON c.n = v.n GROUP BY c.uid",
                                  f"CREATE STREAM j AS SELECT c.n, v.ms FROM c {first} JOIN v WITHIN 1 MINUTE ON c.n = v.n"]):
        meta.apply(parse_statement(sql), 10 + offset)
    for query in (q for q in meta.queries.values() if q.sink in ("G", "J")):
        staged = {s.name: s for s in stages(query, meta.source("C"), meta.source(query.sink), "svc")}
        rows_so_far = staged["join-0"].sink.key_columns[0].type
        (rekeyed,) = [c for c in staged["side-1-1"].query.plan.columns if c.key]
        assert rows_so_far == rekeyed.type == SqlType("INT"), query.query_id


def test_a_group_by_over_a_stream_stream_join_gathers_at_the_streams_partitions() -> None:
    """The streams' sides gather in the joined topic, at the streams' partition count whatever
    the table's; the join writes each pair keyed by the GROUP BY into the grouped topic, at
    the table's count, which the aggregation reads."""
    meta = Metastore()
    for offset, sql in enumerate([
            "CREATE STREAM l (k VARCHAR KEY, v INT) WITH (kafka_topic='l', partitions=3, value_format='json')",
            "CREATE STREAM r (k VARCHAR KEY, site VARCHAR) WITH (kafka_topic='r', partitions=3, value_format='json')",
            "CREATE TABLE per_site WITH (partitions=1) AS SELECT r.site, COUNT(*) AS n FROM l JOIN r "
            "WITHIN 1 MINUTE ON l.k = r.k GROUP BY r.site"]):
        meta.apply(parse_statement(sql), offset)
    (query,) = meta.queries.values()
    staged = stages(query, meta.source(query.source), meta.source(query.sink), "svc")
    joined, grouped = f"_millpond-svc-{query.query_id}-joined", f"_millpond-svc-{query.query_id}-joined-grouped"
    assert [(s.name, s.query.plan.kind, s.source.topic, s.sink.topic, s.partitions) for s in staged] == [
        ("side-0", PlanKind.JOIN_SIDE, "l", joined, 3), ("side-1", PlanKind.JOIN_SIDE, "r", joined, 3),
        ("join", PlanKind.STREAM_STREAM_JOIN, joined, grouped, 3), ("", PlanKind.AGGREGATE, grouped, "PER_SITE", 1)]
    assert [(t.name, t.partitions) for t in internal_topics("svc", query)] == [
        (f"_millpond-svc-{query.query_id}-changelog", None), (grouped, None), (joined, 3)]


def test_a_repartition_carries_the_input_records_partition_and_offset_when_the_aggregation_reads_them() -> None:
    """ROWPARTITION and ROWOFFSET read by a GROUP BY's aggregates (stage 2) travel in the
    repartition topic's records, as ROWTIME does; one the WHERE alone reads (stage 1) does not,
    nor does either when no expression reads it."""
    meta = _metastore(STREAM,
                      "CREATE TABLE lasts AS SELECT area, MAX(ROWOFFSET) AS last FROM readings WHERE ROWPARTITION = 0 "
                      "GROUP BY area",
                      "CREATE TABLE plain AS SELECT area, COUNT(*) AS n FROM readings WHERE ROWOFFSET > 5 GROUP BY area")

    def carried(sink: str) -> list[tuple[str, str]]:
        q = next(q for q in meta.queries.values() if q.sink == sink)
        rekey, _ = stages(q, meta.source(q.source), meta.source(q.sink), "svc")
        return [(c.name, c.expression) for c in rekey.query.plan.columns if c.name.startswith("_INPUT")]

    assert carried("LASTS") == [("_INPUT_ROWTIME", "_rowtime"), ("_INPUT_ROWOFFSET", "`ROWOFFSET`")]
    assert carried("PLAIN") == [("_INPUT_ROWTIME", "_rowtime")]
