"""ksqlDB's custom types: written out where a statement names them, as they are when it runs;
a persistent query keeps the types its statement meant, and every node replays them alike."""

from __future__ import annotations

import pytest

from millpond.shared.errors import NotFoundError
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.parser import parse_statement, statement_query
from tests.metastores import applied

STREAM = ("CREATE STREAM pays (id VARCHAR KEY, amount DECIMAL(12, 2), tags ARRAY<VARCHAR>) "
          "WITH (kafka_topic='pays', partitions=2, value_format='json')")


def test_a_query_keeps_the_types_its_statement_meant_when_the_name_is_made_anew() -> None:
    metastore = applied(["CREATE TYPE cents AS DECIMAL(12, 2)", STREAM,
                         "CREATE TABLE paid AS SELECT id, CAST(SUM(amount) * 2 AS cents) AS twice FROM pays GROUP BY id",
                         "DROP TYPE cents", "CREATE TYPE cents AS INT"])
    query = metastore.queries["CTAS_PAID_0"]
    assert query.types == (("CENTS", ast.SqlType("DECIMAL", (12, 2))),)
    cast = statement_query(query.statement, dict(query.types)).items[1].expr
    assert isinstance(cast, ast.Cast) and cast.type == ast.SqlType("DECIMAL", (12, 2))
    assert [str(c.type) for c in metastore.sources["PAID"].columns] == ["VARCHAR", "DECIMAL(12, 2)"]
    with pytest.raises(NotFoundError, match="type CENTS does not exist"):
        statement_query(query.statement)  # the name alone says nothing without the types


def test_a_statement_without_custom_types_is_left_as_it_is_and_a_named_one_is_written_out_deep() -> None:
    plain = parse_statement("SELECT id, CAST(amount AS INT) FROM paid WHERE id = 'x'")
    assert custom_types.resolved(plain, {}) is plain  # every pull passes here: no walk
    types = {"TAGS": ast.SqlType("ARRAY", (ast.SqlType("VARCHAR"),))}
    named = parse_statement("CREATE STREAM s (k INT KEY, m MAP<VARCHAR, STRUCT<t tags>>) WITH (kafka_topic='s', "
                            "value_format='json')")
    written = custom_types.resolved(named, types)
    assert isinstance(written, ast.CreateSource) and written.text == named.text and written.custom_types == ()
    assert str(written.columns[1].type) == "MAP<VARCHAR, STRUCT<T ARRAY<VARCHAR>>>"


def test_types_count_in_the_digest_and_replay_alike() -> None:
    statements = ("CREATE TYPE cents AS DECIMAL(12, 2)", "CREATE TYPE pay AS STRUCT<amount cents>", "DROP TYPE cents")
    first, second = applied(statements), applied(statements)
    assert first.digest() == second.digest() != applied(statements[:2]).digest()
    assert first.types == {"PAY": ast.SqlType("STRUCT", (("AMOUNT", ast.SqlType("DECIMAL", (12, 2))),))}
