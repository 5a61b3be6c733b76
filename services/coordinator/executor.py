"""Executes statements at the coordinator: validate, create topics, append to the command
topic in a transaction (DDL), produce (INSERT), or answer from the metastore (SHOW, DESCRIBE).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from shared.command_log import Command, CommandReader, CommandWriter
from shared.config import CoordinatorSettings
from shared.errors import StatementError
from shared.kafka import changelog_topic, ensure_topic, topic_partitions
from shared.metastore import DataSource, Metastore
from shared.partitioner import partition_for
from shared.results import Outcome
from shared.serde import coerce, serialize_key, serialize_value
from shared.sql import ast
from shared.sql.expressions import evaluate
from shared.sql.parser import parse_statement


@dataclass
class StatementExecutor:
    """Validates and runs one statement at a time, in arrival order."""

    settings: CoordinatorSettings
    metastore: Metastore
    reader: CommandReader
    writer: CommandWriter
    admin: AIOKafkaAdminClient
    producer: AIOKafkaProducer

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()

    async def execute(self, sql: str, properties: dict[str, str]) -> Outcome:
        """Run one statement and describe what happened."""
        stmt = parse_statement(sql)
        async with self._lock:
            if isinstance(stmt, ast.CreateSource | ast.CreateAsSelect):
                return await self._distribute(stmt, properties)
            if isinstance(stmt, ast.InsertValues):
                return await self._insert(stmt)
            if isinstance(stmt, ast.Show):
                return await self._show(stmt)
            if isinstance(stmt, ast.Describe):
                return self._describe(stmt)
        raise StatementError(f"{stmt.text.split()[0].upper()} statements are not supported yet")

    async def _distribute(self, stmt: ast.CreateSource | ast.CreateAsSelect, properties: dict[str, str]) -> Outcome:
        async with self.writer.producer.transaction():
            # Reading to the end inside the transaction means we validate against every
            # statement committed before ours; a fenced writer cannot commit at all.
            await self.reader.catch_up()
            message = self.metastore.validate(stmt)
            if stmt.name in self.metastore.sources:  # IF NOT EXISTS on an existing name
                return Outcome(stmt.text, message)
            await self._create_topics(stmt)
            command = Command(stmt.text, properties)
            await self.writer.producer.send_and_wait(self.writer.topic, command.encode(), partition=0)
        await self.reader.catch_up()
        return Outcome(stmt.text, message)

    async def _create_topics(self, stmt: ast.CreateSource | ast.CreateAsSelect) -> None:
        sources, query = self.metastore.planned(stmt)
        for source in sources:
            existing = await topic_partitions(self.admin, source.topic)
            declared = isinstance(stmt, ast.CreateSource) and "partitions" in stmt.properties
            if existing is None:
                if isinstance(stmt, ast.CreateSource) and not declared:
                    raise StatementError(
                        f"topic {source.topic} does not exist; add PARTITIONS=n to the WITH clause to create it"
                    )
                await ensure_topic(self.admin, source.topic, source.partitions)
            elif existing != source.partitions:
                raise StatementError(
                    f"topic {source.topic} has {existing} partitions but the statement says "
                    f"{source.partitions}; set PARTITIONS={existing}"
                )
        if query is not None:
            await ensure_topic(
                self.admin, changelog_topic(self.settings.service_id, query.query_id),
                self.metastore.source(query.source).partitions, compacted=True,
            )

    async def _insert(self, stmt: ast.InsertValues) -> Outcome:
        await self.reader.catch_up()
        source = self.metastore.source(stmt.target)
        if source.query_id is not None:
            raise StatementError(f"{source.name} is written by query {source.query_id}; INSERT into its source instead")
        names = list(stmt.columns) if stmt.columns is not None else [c.name for c in source.columns]
        if len(names) != len(stmt.values):
            raise StatementError(f"INSERT names {len(names)} columns but gives {len(stmt.values)} values")
        schema = source.schema
        row = {}
        for name, expr in zip(names, stmt.values, strict=True):
            if name not in schema:
                raise StatementError(f"{source.name} has no column {name}; columns are {', '.join(schema)}")
            row[name] = coerce(evaluate(expr, {}), schema[name], name)
        key_col = source.key_column
        key = serialize_key(row.get(key_col.name), key_col.type) if key_col else None
        value_cols = source.value_columns
        value = serialize_value([c.name for c in value_cols], [row.get(c.name) for c in value_cols],
                                source.value_format)
        partition = partition_for(key, source.partitions) if key is not None else None
        meta = await self.producer.send_and_wait(source.topic, value, key=key, partition=partition)
        return Outcome(stmt.text, f"Inserted into {source.name}", partition=meta.partition, offset=meta.offset)

    async def _show(self, stmt: ast.Show) -> Outcome:
        await self.reader.catch_up()
        if stmt.what in ("STREAMS", "TABLES"):
            kind = stmt.what[:-1]
            rows = [r for r in self.metastore.describe_rows() if r["TYPE"] == kind]
            cols = ["NAME", "TOPIC", "KEY_FORMAT", "VALUE_FORMAT", "PARTITIONS"]
            return Outcome(stmt.text, status="", columns=[(c, "VARCHAR") for c in cols],
                           rows=[[r[c] for c in cols] for r in rows])
        if stmt.what == "QUERIES":
            return Outcome(stmt.text, status="", columns=[("QUERY_ID", "VARCHAR"), ("STATE", "VARCHAR"),
                                                         ("SINK", "VARCHAR"), ("SQL", "VARCHAR")],
                           rows=[[q.query_id, q.state, q.sink, q.statement]
                                 for q in self.metastore.queries.values()])
        if stmt.what == "TOPICS":
            topics = sorted(t for t in await self.admin.list_topics() if not t.startswith("_") and not t.startswith("__"))
            return Outcome(stmt.text, status="", columns=[("NAME", "VARCHAR")], rows=[[t] for t in topics])
        raise StatementError(f"SHOW {stmt.what} is not supported yet")

    def _describe(self, stmt: ast.Describe) -> Outcome:
        source: DataSource = self.metastore.source(stmt.name)
        rows = [[c.name, str(c.type), "KEY" if c.key else ""] for c in source.columns]
        return Outcome(stmt.text, status="", columns=[("FIELD", "VARCHAR"), ("TYPE", "VARCHAR"), ("KEY", "VARCHAR")],
                       rows=rows)
