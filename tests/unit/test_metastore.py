import pytest

from shared.errors import AlreadyExistsError, NotFoundError, StatementError
from shared.metastore import Metastore
from shared.sql.parser import parse_statement

STREAM = ("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
          "WITH (kafka_topic='readings', partitions=8, value_format='json')")
CTAS = ("CREATE TABLE avg_readings AS SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n "
        "FROM readings WHERE area != 'x' GROUP BY sensor EMIT CHANGES")


def test_readings_stream_and_aggregate_table() -> None:
    meta = Metastore()
    assert meta.apply(parse_statement(STREAM), 0) == "Stream created"
    assert meta.apply(parse_statement(CTAS), 2) == "Created query with ID CTAS_AVG_READINGS_0"
    table = meta.source("AVG_READINGS")
    assert [(c.name, str(c.type), c.key) for c in table.columns] == [
        ("SENSOR", "VARCHAR", True), ("AVG_READING", "DOUBLE", False), ("N", "BIGINT", False)]
    assert table.partitions == 8 and table.query_id == "CTAS_AVG_READINGS_0"
    plan = meta.queries["CTAS_AVG_READINGS_0"].plan
    assert [(a.function, a.argument) for a in plan.aggregates] == [("AVG", "`READING`"), ("COUNT", "1")]
    assert plan.where == "(`AREA` != 'x')"


def test_replaying_the_same_statements_gives_the_same_digest() -> None:
    a, b = Metastore(), Metastore()
    for meta in (a, b):
        meta.apply(parse_statement(STREAM), 0)
        meta.apply(parse_statement(CTAS), 2)
    assert a.digest() == b.digest()
    assert a.digest() != Metastore().digest()


def test_errors_name_what_is_wrong() -> None:
    meta = Metastore()
    with pytest.raises(NotFoundError, match="READINGS does not exist"):
        meta.validate(parse_statement(CTAS))
    meta.apply(parse_statement(STREAM), 0)
    with pytest.raises(AlreadyExistsError):
        meta.validate(parse_statement(STREAM))
    assert "already exists" in meta.validate(parse_statement(STREAM.replace("STREAM", "STREAM IF NOT EXISTS", 1)))
    with pytest.raises(StatementError, match="GROUP BY must name the key column"):
        meta.validate(parse_statement("CREATE TABLE t AS SELECT area, COUNT(*) FROM readings GROUP BY area"))
    with pytest.raises(StatementError, match="unknown column NOPE"):
        meta.validate(parse_statement("CREATE TABLE t AS SELECT sensor, SUM(nope) FROM readings GROUP BY sensor"))
    with pytest.raises(StatementError, match="value_format"):
        meta.validate(parse_statement("CREATE STREAM s (a INT) WITH (kafka_topic='s')"))
