import pytest

from millpond.shared.catalog.metastore import Metastore, _definition
from millpond.shared.catalog.queries import Resolved
from millpond.shared.errors import AlreadyExistsError, NotFoundError, StatementError
from millpond.shared.sql.parser import parse_statement

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


def test_a_stream_join_with_a_grace_period_hashes_as_before_the_legacy_flag_existed() -> None:
    """``JoinWindow.eager`` (no GRACE PERIOD) came later: a join that gives a grace period leaves
    it out of the digest, so nodes of either version agree on it; one without says it."""
    for grace, listed in ((" GRACE PERIOD 1 SECOND", False), ("", True)):
        meta = Metastore()
        meta.apply(parse_statement(STREAM), 0)
        meta.apply(parse_statement(STREAM.replace("readings", "alerts")), 1)
        meta.apply(parse_statement("CREATE STREAM joined AS SELECT r.sensor, r.reading, a.area FROM readings r "
                                   f"JOIN alerts a WITHIN 1 MINUTE{grace} ON r.sensor = a.sensor"), 2)
        (query,) = meta.queries.values()
        assert ("'eager'" in str(_definition(query))) == listed, grace


def test_a_sources_spellings_are_kept_out_of_the_digest() -> None:
    """``DataSource.spellings`` came later and only changes how fast records are read: nodes of
    either version agree on a source's digest whatever its statement's spelling."""
    digests = []
    for columns in ("ID INT, sensorId VARCHAR", "ID INT, SENSORID VARCHAR"):
        meta = Metastore()
        meta.apply(parse_statement(f"CREATE STREAM s ({columns}) WITH (kafka_topic='s', value_format='json')"), 0)
        digests.append(meta.digest())
    assert meta.source("S").spellings == () and digests[0] == digests[1]
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (ID INT, sensorId VARCHAR) WITH (kafka_topic='s', value_format='json')"), 0)
    assert meta.source("S").spellings == (("SENSORID", "sensorId"),)


def test_errors_name_what_is_wrong() -> None:
    meta = Metastore()
    with pytest.raises(NotFoundError, match="READINGS does not exist"):
        meta.validate(parse_statement(CTAS))
    meta.apply(parse_statement(STREAM), 0)
    with pytest.raises(AlreadyExistsError):
        meta.validate(parse_statement(STREAM))
    assert "already exists" in meta.validate(parse_statement(STREAM.replace("STREAM", "STREAM IF NOT EXISTS", 1)))
    with pytest.raises(NotFoundError, match="column NOPE does not exist in READINGS"):
        meta.validate(parse_statement("CREATE TABLE t AS SELECT sensor, SUM(nope) FROM readings GROUP BY sensor"))
    with pytest.raises(StatementError, match="value_format"):
        meta.validate(parse_statement("CREATE STREAM s (a INT) WITH (kafka_topic='s')"))
    with pytest.raises(StatementError, match=r"SUM needs a numeric argument: AREA is VARCHAR"):
        meta.validate(parse_statement("CREATE TABLE t AS SELECT sensor, SUM(area) FROM readings GROUP BY sensor"))


def test_grouping_by_another_column_plans_a_repartition() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    meta.apply(parse_statement("CREATE TABLE by_area AS SELECT area, COUNT(*) AS n FROM readings GROUP BY area"), 1)
    plan = meta.queries["CTAS_BY_AREA_0"].plan
    assert plan.repartition and plan.key_expression == "`AREA`" and plan.key_column == "AREA"
    assert [(c.name, c.key) for c in meta.source("BY_AREA").columns] == [("AREA", True), ("N", False)]


def test_a_key_of_a_decimal_expression_is_a_double_and_its_values_keep_their_decimal_types() -> None:
    """A literal with a point is a DECIMAL, so ``reading * 1.5`` is a DECIMAL(13, 1); no key format
    holds a DECIMAL, so a key computed by one is a DOUBLE (cast in Spark), as it was before such
    literals were DECIMALs: the statement is not refused. Its value columns keep Spark's types."""
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    meta.apply(parse_statement("CREATE TABLE by_scaled AS SELECT reading * 1.5 AS scaled, SUM(reading * 1.5) AS total, "
                               "COUNT(*) AS n FROM readings GROUP BY reading * 1.5"), 1)
    meta.apply(parse_statement("CREATE TABLE pairs AS SELECT sensor, reading * 1.5 AS scaled, COUNT(*) AS n "
                               "FROM readings GROUP BY sensor, reading * 1.5"), 2)
    meta.apply(parse_statement("CREATE STREAM moved AS SELECT reading * 1.5 AS scaled, reading / 4.0 AS part "
                               "FROM readings PARTITION BY reading * 1.5"), 3)
    assert [(c.name, str(c.type), c.key) for c in meta.source("BY_SCALED").columns] == [
        ("SCALED", "DOUBLE", True), ("TOTAL", "DECIMAL(23, 1)", False), ("N", "BIGINT", False)]
    assert meta.queries["CTAS_BY_SCALED_0"].plan.key_expression == "CAST((`READING` * 1.5) AS DOUBLE)"
    assert [(c.name, str(c.type)) for c in meta.source("PAIRS").columns if c.key] == [("SENSOR", "VARCHAR"), ("SCALED", "DOUBLE")]
    assert [(c.name, str(c.type), c.key) for c in meta.source("MOVED").columns] == [
        ("SCALED", "DOUBLE", True), ("PART", "DECIMAL(17, 6)", False)]
    assert meta.queries["CSAS_MOVED_2"].plan.key_expression == "CAST((`READING` * 1.5) AS DOUBLE)"


def test_a_deleted_topic_marks_the_source_and_its_queries_without_changing_the_digest() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    meta.apply(parse_statement(CTAS), 1)
    digest = meta.digest()
    meta.check_topics({"AVG_READINGS"})
    assert meta.status("READINGS").startswith("ERROR: topic readings does not exist")
    assert meta.errors["CTAS_AVG_READINGS_0"].startswith("READINGS is in error")
    assert meta.status("AVG_READINGS") == "OK"
    assert meta.digest() == digest
    meta.check_topics({"readings", "AVG_READINGS"})
    assert meta.errors == {}


def test_a_failed_command_keeps_its_place_and_counts_in_the_digest() -> None:
    a, b = Metastore(), Metastore()
    for meta in (a, b):
        meta.apply(parse_statement(STREAM), 0)
        meta.record_failure(1, "StatementError: something outside changed")
    assert a.command_offset == 1 and a.digest() == b.digest()
    b.record_failure(2, "another")
    assert a.digest() != b.digest()


def test_drop_terminates_the_writing_query_and_terminate_keeps_the_result() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    meta.apply(parse_statement(CTAS), 1)
    change = meta.plan(parse_statement("DROP TABLE avg_readings DELETE TOPIC"))
    assert [q.query_id for q in change.drop_queries] == ["CTAS_AVG_READINGS_0"]
    assert change.delete_topics == ["AVG_READINGS"]
    meta.apply(parse_statement("TERMINATE CTAS_AVG_READINGS_0"), 2)
    assert meta.queries == {} and meta.source("AVG_READINGS").query_id is None
    meta.apply(parse_statement("DROP STREAM readings"), 3)
    assert set(meta.sources) == {"AVG_READINGS"}


def test_a_topic_dropped_with_delete_topic_is_kept_for_a_starting_coordinator_until_a_create_takes_it() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    meta.apply(parse_statement(CTAS), 1)
    meta.apply(parse_statement("DROP TABLE avg_readings"), 2)  # the topic stays: nothing to delete
    assert meta.dropped_topics == {} and "CTAS_AVG_READINGS_0" in meta.terminated
    meta.apply(parse_statement("DROP STREAM readings DELETE TOPIC"), 3)
    assert meta.dropped_topics == {"readings": "READINGS"}
    meta.apply(parse_statement(STREAM.replace("readings (", "again (")), 4)  # the same topic, taken again
    assert meta.dropped_topics == {}


def test_latest_queries_start_where_the_coordinator_resolved() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    with pytest.raises(StatementError, match="cover 2 partitions but READINGS has 8"):
        meta.plan(parse_statement(CTAS), {}, Resolved((1, 2)))
    meta.apply(parse_statement(CTAS), 1, {}, Resolved(tuple(range(8))))
    assert meta.queries["CTAS_AVG_READINGS_0"].start_offsets == tuple(range(8))


def test_topic_names_kafka_refuses_are_refused_with_what_to_change() -> None:
    meta = Metastore()
    for topic in ("a b", "x/../../tmp", "..", "t" * 250, "é"):
        with pytest.raises(StatementError, match=r"is not a Kafka topic name.*change KAFKA_TOPIC"):
            meta.validate(parse_statement(STREAM.replace("kafka_topic='readings'", f"kafka_topic='{topic}'")))
    with pytest.raises(StatementError, match=r"t{60}\.\.\. \(60000 characters\)"):
        meta.validate(parse_statement(STREAM.replace("kafka_topic='readings'", f"kafka_topic='{'t' * 60_000}'")))
    for big in ("partitions=2147483648", "replicas=60000"):
        with pytest.raises(StatementError, match="must be an integer from 1 to"):
            meta.validate(parse_statement(STREAM.replace("partitions=8", big)))
    meta.apply(parse_statement(STREAM.replace("kafka_topic='readings'", f"kafka_topic='{'t' * 249}'")), 0)
    # A result named so that it cannot be its own topic's name needs KAFKA_TOPIC.
    with pytest.raises(StatementError, match=r"a b needs WITH \(KAFKA_TOPIC='\.\.\.'\): its topic is named after it otherwise"):
        meta.validate(parse_statement('CREATE TABLE "a b" AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor'))


def test_query_ids_name_topics_kafka_allows() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STREAM), 0)
    odd = "x/y z" + "w" * 300
    message = meta.apply(parse_statement(f"CREATE TABLE \"{odd}\" WITH (kafka_topic='odd') AS "
                                         "SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor"), 1)
    query_id = message.rsplit(" ", 1)[-1]
    assert query_id == f"CTAS_x_y_z{'w' * 95}_0" and meta.source(odd).query_id == query_id
    assert meta.apply(parse_statement(CTAS), 2) == "Created query with ID CTAS_AVG_READINGS_1"  # as before


def test_an_internal_topic_can_be_read_but_not_written_or_deleted() -> None:
    """A stream over an internal topic (the processing log's, the command topic to debug)
    reads it; INSERT, a query's sink and DROP ... DELETE TOPIC on it are refused: a record in
    the command topic would be replayed as a statement, and a deleted one loses the metastore."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM dbg (statement VARCHAR) WITH (kafka_topic='_millpond-svc-command_topic', "
                               "value_format='json');"), 0)
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=1, "
                               "value_format='json');"), 1)
    meta.apply(parse_statement("CREATE STREAM copy AS SELECT * FROM dbg;"), 2)  # reading it is fine
    with pytest.raises(StatementError, match=r"_millpond-svc-command_topic is one of Millpond's internal topics.*not written"):
        meta.insert_target("DBG")
    with pytest.raises(StatementError, match=r"internal topics.*not written"):
        meta.apply(parse_statement("INSERT INTO dbg SELECT k AS statement FROM s;"), 3)
    with pytest.raises(StatementError, match=r"internal topics.*not written"):
        meta.apply(parse_statement("CREATE STREAM out WITH (kafka_topic='_millpond-other-x-changelog') AS SELECT * FROM s;"), 3)
    assert meta.insert_target("S").topic == "s"
    meta.apply(parse_statement("TERMINATE ALL;"), 3)
    meta.apply(parse_statement("DROP STREAM copy;"), 4)
    with pytest.raises(StatementError, match=r"internal topics.*not deleted \(leave out DELETE TOPIC\)"):
        meta.apply(parse_statement("DROP STREAM dbg DELETE TOPIC;"), 5)
    meta.apply(parse_statement("DROP STREAM dbg;"), 5)  # dropped without its topic
    assert "DBG" not in meta.sources


def test_terminate_all_leaves_a_source_tables_materialization_and_terminate_by_id_refuses_it() -> None:
    """A SOURCE table's CST query is the table's own (ksqlDB's "linked to a source table"):
    TERMINATE ALL stops every other query and leaves it, TERMINATE of its id is refused; a
    declared table's CST stops as before."""
    meta = Metastore()
    for offset, sql in enumerate([
            "CREATE SOURCE TABLE rates (c VARCHAR PRIMARY KEY, r DOUBLE) WITH (kafka_topic='rates', value_format='json')",
            "CREATE TABLE plain (c VARCHAR PRIMARY KEY, r DOUBLE) WITH (kafka_topic='plain', partitions=1, value_format='json')",
            "CREATE TABLE copied AS SELECT c, r FROM rates"]):
        meta.apply(parse_statement(sql), offset)
    source_query = meta.source("RATES").query_id
    assert source_query is not None
    with pytest.raises(StatementError, match=f"cannot terminate query {source_query}: it materializes SOURCE table RATES"):
        meta.apply(parse_statement(f"TERMINATE {source_query}"), 3)
    meta.apply(parse_statement("TERMINATE ALL"), 4)
    assert list(meta.queries) == [source_query]
    assert meta.source("RATES").query_id == source_query and meta.source("PLAIN").query_id is None
