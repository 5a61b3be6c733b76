import pytest

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_script, parse_statement


def test_create_stream_upper_cases_identifiers_and_reads_properties() -> None:
    stmt = parse_statement(
        "CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
        "WITH (kafka_topic='readings', partitions=8, value_format='json');")
    assert isinstance(stmt, ast.CreateSource)
    assert stmt.name == "READINGS"
    assert [(c.name, str(c.type), c.key) for c in stmt.columns] == [
        ("SENSOR", "VARCHAR", True), ("AREA", "VARCHAR", False), ("READING", "INT", False)]
    assert stmt.properties == {"kafka_topic": "readings", "partitions": 8, "value_format": "json"}


def test_create_source_declares_a_read_only_stream_or_table_and_source_stays_a_name() -> None:
    """``CREATE [OR REPLACE] SOURCE STREAM|TABLE`` (ksqlDB's) is read-only; SOURCE is a word only
    there (a stream or a column may be named SOURCE); a query's result is never SOURCE."""
    for kind in ("STREAM", "TABLE"):
        stmt = parse_statement(f"CREATE SOURCE {kind} s (id INT {'KEY' if kind == 'STREAM' else 'PRIMARY KEY'}) "
                               "WITH (kafka_topic='s', value_format='json')")
        assert isinstance(stmt, ast.CreateSource) and stmt.read_only and stmt.kind == kind
    plain = parse_statement("CREATE TABLE source (source INT PRIMARY KEY) WITH (kafka_topic='s', value_format='json')")
    assert isinstance(plain, ast.CreateSource) and not plain.read_only and plain.name == "SOURCE"
    with pytest.raises(StatementError, match="unexpected 'AS'"):
        parse_statement("CREATE SOURCE TABLE t AS SELECT * FROM s")


def test_quoted_identifiers_keep_their_case() -> None:
    stmt = parse_statement('SELECT `MixedCase` FROM "Tbl"')
    assert isinstance(stmt, ast.Query)
    assert stmt.source == "Tbl"
    assert stmt.items[0].expr == ast.ColumnRef("MixedCase")


def test_a_create_statement_keeps_how_it_wrote_each_unquoted_name_not_in_upper_case() -> None:
    """Producers usually write a JSON key as the CREATE statement writes the column (a
    persistent query parses records by those spellings first): columns and STRUCT fields at
    any depth, the first of several spellings, none for a name written in upper case or quoted."""
    stmt = parse_statement("CREATE STREAM s (sensorId VARCHAR KEY, READING INT, `q` INT, "
                           "loc STRUCT<Lat DOUBLE, inner STRUCT<x INT>>, ID INT, ls ARRAY<STRUCT<id INT, x INT>>) "
                           "WITH (kafka_topic='t', value_format='json')")
    assert isinstance(stmt, ast.CreateSource)
    assert stmt.spellings == (("SENSORID", "sensorId"), ("LOC", "loc"), ("LAT", "Lat"), ("INNER", "inner"),
                              ("X", "x"), ("LS", "ls"))
    assert [c.name for c in stmt.columns] == ["SENSORID", "READING", "q", "LOC", "ID", "LS"]


def test_ctas_with_group_by_and_emit_changes() -> None:
    stmt = parse_statement("CREATE TABLE avg_readings AS SELECT sensor, AVG(reading) AS avg_reading "
                           "FROM readings GROUP BY sensor EMIT CHANGES;")
    assert isinstance(stmt, ast.CreateAsSelect)
    assert stmt.query.group_by == (ast.ColumnRef("SENSOR"),)
    assert stmt.query.emit_changes
    assert stmt.query.items[1] == ast.SelectItem(ast.Call("AVG", (ast.ColumnRef("READING"),)), "AVG_READING")


def test_insert_values_and_script_split_keep_statement_text() -> None:
    stmts = parse_script("INSERT INTO r (a, b) VALUES ('x', -2); SELECT * FROM t WHERE k = 'it''s' LIMIT 3;")
    assert [s.text for s in stmts] == ["INSERT INTO r (a, b) VALUES ('x', -2)",
                                       "SELECT * FROM t WHERE k = 'it''s' LIMIT 3"]
    insert, query = stmts
    assert isinstance(insert, ast.InsertValues) and insert.values[1] == ast.Literal(-2, ast.SqlType("INT"))
    assert isinstance(query, ast.Query) and query.limit == 3
    assert query.where == ast.Binary("=", ast.ColumnRef("K"), ast.Literal("it's", ast.SqlType("VARCHAR")))


@pytest.mark.parametrize("text", [
    "SHOW STREAMS", "LIST TABLES", "SHOW QUERIES", "DESCRIBE EXTENDED t", "DROP TABLE IF EXISTS t DELETE TOPIC",
    "TERMINATE CTAS_T_0", "EXPLAIN CTAS_T_0", "SET 'auto.offset.reset'='earliest'", "UNSET 'x'",
    "SELECT a FROM s WHERE b BETWEEN 1 AND 2 AND c IS NOT NULL OR d IN (1, 2) EMIT CHANGES LIMIT 5",
    "SELECT CASE WHEN a > 1 THEN 'x' ELSE 'y' END, CAST(b AS DOUBLE), UCASE(c) FROM s",
    "CREATE TABLE t (id INT PRIMARY KEY, m MAP<VARCHAR, ARRAY<INT>>, d DECIMAL(10, 2)) WITH (kafka_topic='t', value_format='json')",
])
def test_statement_forms_parse(text: str) -> None:
    assert len(parse_script(text)) == 1


@pytest.mark.parametrize(("text", "line", "column", "fragment"), [
    ("SELEC * FROM x", 1, 1, "expected one of"),
    ("SELECT *\nFROM x WHERE", 2, 13, "ends early"),
    ("CREATE STREAM s (a INT) WITH (x=1", 1, 34, "ends early"),
    ("SELECT $ FROM x", 1, 8, "unexpected character"),
])
def test_syntax_errors_say_where_and_what_was_expected(text: str, line: int, column: int, fragment: str) -> None:
    with pytest.raises(StatementError) as info:
        parse_script(text)
    assert (info.value.line, info.value.column) == (line, column)
    assert fragment in info.value.message


def test_optional_keyword_clauses_are_seen() -> None:
    create = parse_statement("CREATE OR REPLACE STREAM IF NOT EXISTS s (a INT) WITH (kafka_topic='s', value_format='json')")
    assert isinstance(create, ast.CreateSource) and create.or_replace and create.if_not_exists
    plain = parse_statement("CREATE STREAM s (a INT) WITH (kafka_topic='s', value_format='json')")
    assert isinstance(plain, ast.CreateSource) and not plain.or_replace and not plain.if_not_exists
    drop = parse_statement("DROP TABLE IF EXISTS t DELETE TOPIC")
    assert isinstance(drop, ast.Drop) and drop.if_exists and drop.delete_topic
    assert parse_statement("DROP TABLE t") == ast.Drop(kind="TABLE", name="T")


def test_names_may_hold_quotes_backslashes_and_path_characters() -> None:
    """As in ksqlDB, a quoted name is any text (control characters too): Spark gets it as data
    (test_reducer) and a store's path encodes it (test_store)."""
    stmt = parse_statement('SELECT `it\'s "a" \\x` FROM "x/../../tmp/evil"')
    assert isinstance(stmt, ast.Query)
    assert stmt.source == "x/../../tmp/evil"
    assert stmt.items[0].expr == ast.ColumnRef('it\'s "a" \\x')
    assert parse_statement('SELECT * FROM "a\nb\x00"').source == "a\nb\x00"


@pytest.mark.parametrize(("window", "expected"), [
    ("TUMBLING (SIZE 1 MINUTE)", ast.Window("TUMBLING", 60_000)),
    ("tumbling (size 90 seconds, retention 2 days, grace period 250 milliseconds)",
     ast.Window("TUMBLING", 90_000, retention_ms=2 * 86_400_000, grace_ms=250)),
    ("HOPPING (SIZE 1 HOUR, ADVANCE BY 10 MINUTES, GRACE PERIOD 1 SECOND)",
     ast.Window("HOPPING", 3_600_000, 600_000, grace_ms=1000)),
    ("SESSION (30 SECONDS)", ast.Window("SESSION", 30_000)),
])
def test_windows_parse_with_their_durations_in_milliseconds(window: str, expected: ast.Window) -> None:
    query = parse_statement(f"SELECT sensor, COUNT(*) FROM readings WINDOW {window} GROUP BY sensor EMIT CHANGES")
    assert isinstance(query, ast.Query)
    assert query.window == expected
    assert query.emit_changes and not query.emit_final


@pytest.mark.parametrize(("text", "fragment"), [
    ("SELECT a, COUNT(*) FROM s WINDOW TUMBLING (SIZE 1 MINUTE, GRACE PERIOD 1 SECOND, GRACE PERIOD 2 SECONDS) "
     "GROUP BY a", "gives GRACE twice"),
    ("SELECT a, COUNT(*) FROM s WINDOW TUMBLING (SIZE 1 FORTNIGHT) GROUP BY a", "unexpected"),
    ("SELECT a, COUNT(*) FROM s GRACE PERIOD 1 SECOND GROUP BY a", "unexpected 'PERIOD'"),
    ("SELECT a, COUNT(*) FROM s WINDOW HOPPING (SIZE 1 MINUTE) GROUP BY a", "expected"),
])
def test_malformed_windows_are_refused_saying_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(StatementError, match=fragment):
        parse_statement(text)


@pytest.mark.parametrize(("join", "kind", "within"), [
    ("JOIN {t} ON", "INNER", None),
    ("INNER JOIN {t} ON", "INNER", None),
    ("left outer join {t} ON", "LEFT", None),
    ("LEFT JOIN {t} ON", "LEFT", None),
    ("FULL OUTER JOIN {t} ON", "FULL", None),
    ("RIGHT JOIN {t} ON", "RIGHT", None),
    ("JOIN {t} WITHIN 10 SECONDS ON", "INNER", ast.Within(10_000, 10_000)),
    ("JOIN {t} WITHIN (1 SECOND, 2 MINUTES) GRACE PERIOD 3 SECONDS ON", "INNER", ast.Within(1_000, 120_000, 3_000)),
])
def test_joins_parse_with_their_type_source_alias_window_and_condition(join: str, kind: str,
                                                                     within: ast.Within | None) -> None:
    query = parse_statement(f"SELECT r.k, t.v FROM s r {join.format(t='t AS x')} r.k = x.k WHERE r.n > 1")
    assert isinstance(query, ast.Query) and query.alias == "R" and query.where is not None
    (parsed,) = query.joins
    assert (parsed.kind, parsed.source, parsed.alias, parsed.within) == (kind, "T", "X", within)
    assert parsed.on == ast.Binary("=", ast.ColumnRef("K", "R"), ast.ColumnRef("K", "X"))
    assert parsed.on.left.qualifier == "R" and parsed.on.right.qualifier == "X"  # type: ignore[attr-defined]


def test_a_query_may_name_several_joins_in_order() -> None:
    query = parse_statement("SELECT * FROM a JOIN b ON a.k = b.k LEFT JOIN c ON a.k = c.k")
    assert isinstance(query, ast.Query)
    assert [(j.kind, j.source) for j in query.joins] == [("INNER", "B"), ("LEFT", "C")]


@pytest.mark.parametrize("text", ["SELECT * FROM a JOIN b", "SELECT * FROM a JOIN ON a.k = b.k",
                                  "SELECT * FROM a OUTER JOIN b ON a.k = b.k", "SELECT * FROM a JOIN b WITHIN ON x = y"])
def test_malformed_joins_are_syntax_errors(text: str) -> None:
    with pytest.raises(StatementError):
        parse_statement(text)


def test_show_extended_all_topics_and_describe_streams_are_ksqldbs() -> None:
    """``SHOW|LIST ... EXTENDED`` (streams, tables, queries), ``SHOW ALL TOPICS`` (the internal
    ones too) and ``DESCRIBE STREAMS|TABLES [EXTENDED]`` (every source: SHOW ... EXTENDED);
    ALL or EXTENDED where they mean nothing are refused with what they apply to; a source named
    STREAMS is described quoted."""
    assert parse_statement("list tables extended") == ast.Show(text="list tables extended", what="TABLES", extended=True)
    assert parse_statement("SHOW ALL TOPICS") == ast.Show(text="SHOW ALL TOPICS", what="TOPICS", internal=True)
    assert parse_statement("DESCRIBE TABLES") == ast.Show(text="DESCRIBE TABLES", what="TABLES", extended=True)
    assert parse_statement("DESCRIBE `STREAMS`") == ast.Describe(text="DESCRIBE `STREAMS`", name="STREAMS", extended=False)
    for text, error in (("SHOW ALL STREAMS", "ALL applies to TOPICS"),
                        ("SHOW FUNCTIONS EXTENDED", "EXTENDED applies to STREAMS, TABLES, QUERIES, not to FUNCTIONS")):
        with pytest.raises(StatementError, match=error):
            parse_statement(text)
