"""CREATE OR REPLACE of a running query: an aggregation keeps its source, GROUP BY and
aggregate list (its stored state must still fit); a filter may change; a projection may add
columns; no plan changes kind. Replay applies what was accepted, whatever these rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.upgrades import check_upgrade, check_upgrades
from millpond.shared.errors import StatementError
from millpond.shared.sql.parser import parse_statement
from tests.metastores import applied

STREAM = ("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
          "WITH (kafka_topic='readings', partitions=4, value_format='json')")
CTAS = "CREATE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total FROM readings GROUP BY area"
CSAS = "CREATE STREAM loud AS SELECT sensor, reading FROM readings WHERE reading > 10"
REMEDY = "ksqlDB-style upgrades keep the aggregate list and GROUP BY; drop the table and create it again"


def _metastore() -> Metastore:
    return applied((STREAM, CTAS, CSAS))


def _accept(meta: Metastore, sql: str) -> str:
    """What the coordinator does before appending: plan, check the upgrade, then apply."""
    stmt = parse_statement(sql)
    check_upgrades(meta.queries, meta.plan(stmt))
    return meta.apply(stmt, meta.command_offset + 1)


@pytest.mark.parametrize("sql", [
    "CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total FROM readings "
    "WHERE area != 'test' GROUP BY area",
    CTAS.replace("CREATE TABLE", "CREATE OR REPLACE TABLE"),
    "CREATE OR REPLACE STREAM loud AS SELECT sensor, reading, area FROM readings WHERE reading > 20",
])
def test_a_compatible_replacement_is_accepted_and_keeps_the_query_id(sql: str) -> None:
    meta = _metastore()
    assert _accept(meta, sql).startswith("Replaced query ")
    assert sorted(meta.queries) == ["CSAS_LOUD_1", "CTAS_BY_AREA_0"]


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total, MAX(reading) AS top "
     "FROM readings GROUP BY area",
     "cannot replace query CTAS_BY_AREA_0: its aggregates change from [N = COUNT(1), TOTAL = SUM(`READING`)] to "
     "[N = COUNT(1), TOTAL = SUM(`READING`), TOP = MAX(`READING`)]; " + REMEDY),
    ("CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(reading) AS n, SUM(reading) AS total "
     "FROM readings GROUP BY area",
     "its aggregates change from [N = COUNT(1), TOTAL = SUM(`READING`)] to [N = COUNT(`READING`), TOTAL = "
     "SUM(`READING`)]"),
    ("CREATE OR REPLACE TABLE by_area AS SELECT UCASE(area) AS area, COUNT(*) AS n, SUM(reading) AS total "
     "FROM readings GROUP BY UCASE(area)",
     "its GROUP BY changes from AREA = `AREA` to AREA = upper(`AREA`)"),
])
def test_an_incompatible_replacement_is_refused_and_changes_nothing(sql: str, message: str) -> None:
    meta = _metastore()
    digest = meta.digest()
    with pytest.raises(StatementError) as err:
        _accept(meta, sql)
    assert message in err.value.message
    assert meta.digest() == digest


def test_same_aggregates_in_another_order_are_refused() -> None:
    old = _metastore().queries["CTAS_BY_AREA_0"]
    swapped = replace(old, plan=replace(old.plan, aggregates=old.plan.aggregates[::-1]))
    with pytest.raises(StatementError, match="its aggregates change"):
        check_upgrade(old, swapped)


def test_a_plan_that_changes_kind_is_refused() -> None:
    old = _metastore().queries["CTAS_BY_AREA_0"]
    projection = replace(old, plan=replace(old.plan, kind=PlanKind.PROJECT, aggregates=()))
    with pytest.raises(StatementError, match="it would turn from an aggregation \\(GROUP BY\\) into a projection"):
        check_upgrade(old, projection)


def test_replay_applies_a_replacement_that_was_accepted_before_the_rule() -> None:
    meta = _metastore()
    meta.apply(parse_statement("CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total, "
                               "MAX(reading) AS top FROM readings GROUP BY area"), 3)
    assert [a.column for a in meta.queries["CTAS_BY_AREA_0"].plan.aggregates] == ["N", "TOTAL", "TOP"]


JOIN_SOURCES = ("CREATE TABLE sensors (id VARCHAR PRIMARY KEY, site VARCHAR) "
                "WITH (kafka_topic='sensors', partitions=4, value_format='json')",
                "CREATE TABLE owners (id VARCHAR PRIMARY KEY, owner VARCHAR) "
                "WITH (kafka_topic='owners', partitions=4, value_format='json')",
                "CREATE STREAM sited AS SELECT r.sensor, r.reading, s.site FROM readings r "
                "LEFT JOIN sensors s ON r.sensor = s.id",
                "CREATE TABLE busy AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor HAVING COUNT(*) > 1")


def _joined() -> Metastore:
    meta = _metastore()
    for sql in JOIN_SOURCES:
        _accept(meta, sql)
    return meta


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE OR REPLACE STREAM sited AS SELECT r.sensor, r.reading, s.owner AS site FROM readings r "
     "LEFT JOIN owners s ON r.sensor = s.id", "its joins change"),
    ("CREATE OR REPLACE STREAM sited AS SELECT r.sensor, r.reading, s.site FROM readings r "
     "JOIN sensors s ON r.sensor = s.id", "its joins change"),
    ("CREATE OR REPLACE STREAM sited AS SELECT r.sensor, r.reading, s.site FROM readings r "
     "LEFT JOIN sensors s ON r.sensor = s.id LEFT JOIN owners o ON r.sensor = o.id", "its joins change"),
    ("CREATE OR REPLACE STREAM sited AS SELECT sensor, reading, 'x' AS site FROM readings",
     "it would turn from a stream-table join into a projection"),
    ("CREATE OR REPLACE TABLE busy AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor HAVING COUNT(*) > 9",
     "its HAVING changes from (N > 1) to (N > 9)"),
])
def test_a_join_keeps_its_tables_and_an_aggregation_its_having(sql: str, message: str) -> None:
    meta = _joined()
    with pytest.raises(StatementError) as err:
        _accept(meta, sql)
    assert message in err.value.message


def test_a_table_table_join_keeps_both_tables_and_its_type() -> None:
    meta = _joined()
    _accept(meta, "CREATE TABLE site_owner AS SELECT s.id, s.site, o.owner FROM sensors s LEFT JOIN owners o "
                  "ON s.id = o.id")
    assert _accept(meta, "CREATE OR REPLACE TABLE site_owner AS SELECT s.id, s.site, UCASE(o.owner) AS owner "
                         "FROM sensors s LEFT JOIN owners o ON s.id = o.id").startswith("Replaced query ")
    for changed, message in (("s.id, s.site, o.owner FROM sensors s FULL OUTER JOIN owners o ON s.id = o.id",
                              "its joins change"),
                             ("o.id, o.site, s.owner FROM owners s LEFT JOIN sensors o ON s.id = o.id",
                              "cannot change what SITE_OWNER reads")):
        with pytest.raises(StatementError) as err:
            _accept(meta, f"CREATE OR REPLACE TABLE site_owner AS SELECT {changed}")
        assert message in err.value.message, err.value.message


def test_a_join_may_change_its_projection_and_filter() -> None:
    meta = _joined()
    assert _accept(meta, "CREATE OR REPLACE STREAM sited AS SELECT r.sensor, r.reading, s.site FROM readings r "
                         "LEFT JOIN sensors s ON r.sensor = s.id WHERE r.reading > 1").startswith("Replaced query ")
