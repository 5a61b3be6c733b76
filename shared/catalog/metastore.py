"""The metastore: every stream, table and persistent query, built by replaying statements.

``plan`` checks a statement against the current state and says what it would change,
without changing anything; ``apply`` makes the change. Both are deterministic functions of
the statements seen so far, so every node that replays the command topic in order ends with
the same metastore (compare ``digest``).

Errors that come from outside (a topic deleted behind Millpond's back) do not stop replay:
the statement keeps its place, and ``check_topics`` marks the entity with the error, which
SHOW and DESCRIBE report. Those marks are each node's own observation, so they are kept
out of the digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from millpond.shared.catalog.names import NOT_IN_TOPICS, check_not_internal
from millpond.shared.catalog.queries import PersistentQuery, Resolved
from millpond.shared.catalog.sources import Column, DataSource
from millpond.shared.catalog.topology import TABLE_JOINS
from millpond.shared.errors import AlreadyExistsError, NotFoundError, StatementError
from millpond.shared.kafka.serde import VALUE_FORMATS
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.expressions import quote_identifier
from millpond.shared.sql.joins import started_sources
from millpond.shared.sql.planner import (
    SOURCE_PROPERTIES,
    check_key_format,
    check_key_type,
    check_properties,
    check_timestamp,
    plan_materialization,
    plan_persistent,
)
from millpond.shared.sql.types import RECORD_PLACES

MAX_NAME_IN_ID = 100
"""Of a source's name, how much a query id keeps (its topics' names stay within Kafka's 249)."""
DDL = (ast.CreateSource, ast.CreateAsSelect, ast.InsertSelect, ast.Drop, ast.Terminate, ast.CreateType, ast.DropType,
       ast.AlterSource)
"""Statements that change the metastore and so go through the command topic."""


@dataclass
class Change:
    """What one statement does to the metastore."""

    message: str
    add_sources: list[DataSource] = field(default_factory=list)
    add_queries: list[PersistentQuery] = field(default_factory=list)
    drop_sources: list[str] = field(default_factory=list)
    drop_queries: list[PersistentQuery] = field(default_factory=list)
    delete_topics: list[str] = field(default_factory=list)
    """Topics the coordinator deletes once the statement is committed (DROP ... DELETE TOPIC)."""
    counts_query: bool = False
    """True when the statement takes a query number (so ids stay deterministic)."""
    add_types: dict[str, ast.SqlType] = field(default_factory=dict)
    drop_types: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        """True when nothing changes (IF NOT EXISTS / IF EXISTS on a settled name)."""
        return not (self.add_sources or self.add_queries or self.drop_sources or self.drop_queries or self.add_types
                    or self.drop_types)


PSEUDO_COLUMNS = ("ROWTIME", "WINDOWSTART", "WINDOWEND")


def _refuse_read_only(target: DataSource) -> None:
    """INSERT writes no SOURCE stream or table (ksqlDB's ``Cannot insert into read-only``)."""
    if target.read_only:
        raise StatementError(f"cannot insert into read-only {target.kind.lower()} {target.name}: it was declared with "
                             f"CREATE SOURCE {target.kind}, which only its topic's producers write")


def _refuse_pseudo_columns(names: Sequence[str]) -> None:
    """StatementError when a declared column takes a pseudo-column's name."""
    if reserved := sorted(set(names) & set(PSEUDO_COLUMNS)):
        raise StatementError(f"{', '.join(reserved)} is a pseudo-column name that ksqlDB reserves; "
                             "name the column otherwise")


def check_sources(change: Change) -> None:
    """Refuse a stream or table that Millpond's persistent queries could not read or write.
    Checked when a statement is accepted, not on replay, which keeps what was accepted.

    - Column names that differ only in case (``"a"`` and ``A``), also from a pseudo-column's
      (``"rowtime"``): Spark, which runs the persistent queries, resolves column names
      regardless of case (as JSON field names are read), so every query reading it failed.
    - An ARRAY, MAP or STRUCT value column of a DELIMITED value, as ksqlDB refuses it: a
      DELIMITED field is text (Spark's CSV reader takes none of them)."""
    for source in change.add_sources:
        if source.value_format == "DELIMITED":
            nested = [c for c in source.value_columns if c.type.base in ("ARRAY", "MAP", "STRUCT")]
            if nested:
                raise StatementError(
                    f"{source.name}'s value is DELIMITED, whose fields cannot hold {nested[0].type.base} (the column "
                    f"{quote_identifier(nested[0].name)}); DELIMITED holds only VARCHAR, numbers, BOOLEAN, dates and "
                    "times and BYTES: use VALUE_FORMAT='JSON'")
        seen: dict[str, str] = {name.lower(): name for name in PSEUDO_COLUMNS}
        for column in source.columns:
            if column.name in PSEUDO_COLUMNS:  # a windowed table's own, or refused as reserved already
                continue
            if column.name.upper() in RECORD_PLACES:  # (its queries read the record's; one declared before keeps it)
                raise StatementError(
                    f"{source.name} would have a column {quote_identifier(column.name)}: {column.name.upper()} is a "
                    "pseudo-column name that ksqlDB reserves (each record's partition or offset); name the column "
                    f"otherwise (in a SELECT list, {column.name.upper()} AS another name)")
            other = seen.setdefault(column.name.lower(), column.name)
            if other != column.name:
                raise StatementError(
                    f"{source.name} would have the columns {quote_identifier(other)} and "
                    f"{quote_identifier(column.name)}, whose names differ only in case; Millpond's persistent queries "
                    "match column names regardless of case: rename one (or give it an alias with AS)")


def reads(query: PersistentQuery, name: str) -> bool:
    """Whether ``query`` reads the source called ``name`` (as its input or a joined one)."""
    return query.source == name or (query.plan.join is not None and any(t.table.name == name for t in query.plan.join.tables))


def uses(query: PersistentQuery, name: str) -> bool:
    """Whether ``query`` reads or writes the source called ``name``."""
    return query.sink == name or reads(query, name)


@dataclass
class Metastore:
    """Streams, tables and queries, and the offset of the last command applied."""

    sources: dict[str, DataSource] = field(default_factory=dict)
    queries: dict[str, PersistentQuery] = field(default_factory=dict)
    command_offset: int = -1
    queries_created: int = 0
    failed_commands: dict[int, str] = field(default_factory=dict)
    """Commands that could not be applied on replay, by offset, with the reason."""
    errors: dict[str, str] = field(default_factory=dict)
    """Sources and queries this node found broken (by name or query id), with the reason."""
    terminated: dict[str, PersistentQuery] = field(default_factory=dict)
    """The queries terminated (or dropped with their result), by id: a coordinator that starts
    deletes what internal topics of theirs are left (``StatementExecutor.delete_left_topics``)."""
    dropped_topics: dict[str, str] = field(default_factory=dict)
    """The topics of sources dropped with DELETE TOPIC, each with the source's name, until
    their delete is noted in the command topic (``forget_dropped``) or a later CREATE takes the
    topic again: a coordinator that starts deletes those still there."""
    types: dict[str, ast.SqlType] = field(default_factory=dict)
    """The custom types (CREATE TYPE), by name, each written out."""

    # ---- lookups
    def source(self, name: str) -> DataSource:
        """The stream or table called ``name``."""
        found = self.sources.get(name)
        if found is None:
            known = ", ".join(sorted(self.sources)) or "none yet"
            raise NotFoundError(f"{name} does not exist; streams and tables: {known}")
        return found

    def query(self, query_id: str) -> PersistentQuery:
        """The persistent query with id ``query_id``."""
        found = self.queries.get(query_id)
        if found is None:
            known = ", ".join(sorted(self.queries)) or "none"
            raise NotFoundError(f"query {query_id} does not exist; running queries: {known}")
        return found

    def insert_target(self, name: str) -> DataSource:
        """The source ``INSERT INTO name VALUES`` writes to: not one a query computes (a
        table's own materializing query, which reads the topic, does not count)."""
        source = self.source(name)
        _refuse_read_only(source)
        check_not_internal(source.topic, "written")
        writer = self.queries.get(source.query_id or "")
        if writer is not None and writer.kind != "CST":
            raise StatementError(f"{source.name} is written by query {writer.query_id}; INSERT into its source instead")
        return source

    def readers(self, name: str) -> list[str]:
        """Ids of the queries that read ``name``."""
        return sorted(q.query_id for q in self.queries.values() if reads(q, name))

    def writers(self, name: str) -> list[str]:
        """Ids of the queries that write ``name``."""
        return sorted(q.query_id for q in self.queries.values() if q.sink == name)

    def status(self, name: str) -> str:
        """``OK``, or ``ERROR: <reason>`` for a source or query this node found broken."""
        error = self.errors.get(name)
        return "OK" if error is None else f"ERROR: {error}"

    def digest(self) -> str:
        """A hash of every definition, equal on every node that replayed the same commands."""
        body = {
            "sources": {k: _definition(v) for k, v in sorted(self.sources.items())},
            "queries": {k: _definition(v) for k, v in sorted(self.queries.items())},
            "queries_created": self.queries_created,
            "failed_commands": {str(k): v for k, v in sorted(self.failed_commands.items())},
        }
        if self.types:  # (a metastore without custom types hashes as before they existed)
            body["types"] = {k: str(v) for k, v in sorted(self.types.items())}
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    # ---- statements
    def validate(self, stmt: ast.Statement, properties: Mapping[str, str] | None = None) -> str:
        """Raise if ``stmt`` cannot be applied now; changes nothing. Returns its message."""
        return self.plan(stmt, properties).message

    def forget_dropped(self, topics: Sequence[str], offset: int) -> None:
        """Apply the note at command-topic ``offset`` that ``topics`` of dropped sources were
        deleted: no coordinator that starts looks for them again."""
        for topic in topics:
            self.dropped_topics.pop(topic, None)
        self.command_offset = offset

    def apply(self, stmt: ast.Statement, offset: int, properties: Mapping[str, str] | None = None,
              resolved: Resolved | None = None) -> str:
        """Apply a statement read at command-topic ``offset``; returns its status message."""
        change = self.plan(stmt, properties, resolved)
        for name in change.drop_sources:
            self.sources.pop(name, None)
            self.errors.pop(name, None)
        for query in change.drop_queries:
            self.queries.pop(query.query_id, None)
            self.errors.pop(query.query_id, None)
            self.terminated[query.query_id] = query
        for topic in change.delete_topics:
            self.dropped_topics[topic] = change.drop_sources[0]
        for source in change.add_sources:
            self.sources[source.name] = source
            self.dropped_topics.pop(source.topic, None)
        for query in change.add_queries:
            self.queries[query.query_id] = query
        for name in change.drop_types:
            self.types.pop(name, None)
        self.types.update(change.add_types)
        if change.counts_query:
            self.queries_created += 1
        self.command_offset = offset
        return change.message

    def record_failure(self, offset: int, error: str) -> None:
        """A command that could not be applied keeps its place: remember it and move on."""
        self.failed_commands[offset] = error
        self.command_offset = offset

    def check_topics(self, existing: set[str]) -> None:
        """Mark sources whose topic is gone, and the queries that use them, with the error."""
        errors: dict[str, str] = {}
        for source in self.sources.values():
            if source.topic not in existing:
                errors[source.name] = f"topic {source.topic} does not exist (deleted outside Millpond?)"
        for query in self.queries.values():
            broken = [n for n in (query.source, query.sink) if n in errors]
            if broken:
                errors[query.query_id] = f"{broken[0]} is in error: {errors[broken[0]]}"
        self.errors = errors

    def plan(self, stmt: ast.Statement, properties: Mapping[str, str] | None = None,
             resolved: Resolved | None = None) -> Change:
        """What ``stmt`` would change; raises if it cannot be applied now.

        ``properties`` are the session's (they are checked by the caller); ``resolved``
        carries what the coordinator looked up in Kafka when it accepted the statement.
        """
        # A custom type a statement names is written out as it is now; a query keeps it so.
        named = tuple((name, self.types[name]) for name in stmt.custom_types if name in self.types)
        change = self._plan(custom_types.resolved(stmt, self.types), resolved or Resolved())
        if named:  # (not an ALTERed table's query: it keeps its own statement, and that statement's types)
            change.add_queries = [replace(query, types=named) if query.statement == stmt.text else query
                                  for query in change.add_queries]
        return change

    def _plan(self, stmt: ast.Statement, resolved: Resolved) -> Change:
        offsets = resolved.start_offsets
        if isinstance(stmt, ast.CreateType):
            type_ = custom_types.check_new_type(stmt, self.types)
            if type_ is None:
                return Change(f"Type {stmt.name} exists")
            return Change(f"Created type {stmt.name} as {type_}", add_types={stmt.name: type_})
        if isinstance(stmt, ast.DropType):
            if stmt.name not in self.types:
                if stmt.if_exists:
                    return Change(f"Type {stmt.name} does not exist")
                raise NotFoundError(f"type {stmt.name} does not exist; SHOW TYPES lists the types")
            return Change(f"Dropped type {stmt.name}", drop_types=[stmt.name])
        if isinstance(stmt, ast.CreateSource):
            return self._create_source(stmt, resolved.partitions)
        if isinstance(stmt, ast.AlterSource):
            return self._alter_source(stmt)
        if isinstance(stmt, ast.CreateAsSelect):
            return self._create_as_select(stmt, offsets)
        if isinstance(stmt, ast.InsertSelect):
            return self._insert_select(stmt, offsets)
        if isinstance(stmt, ast.Drop):
            return self._drop(stmt)
        if isinstance(stmt, ast.Terminate):
            return self._terminate(stmt)
        raise StatementError(f"{type(stmt).__name__} does not change the metastore")

    def _existing(self, name: str, kind: str, if_not_exists: bool, or_replace: bool) -> DataSource | None:
        """The source a CREATE would meet, after the IF NOT EXISTS / OR REPLACE rules."""
        found = self.sources.get(name)
        if found is None or if_not_exists:
            return found
        if not or_replace:
            raise AlreadyExistsError(f"{found.kind.lower()} {name} already exists; "
                                     "choose another name, DROP it first, or use CREATE OR REPLACE")
        if found.kind != kind:
            raise StatementError(f"{name} is a {found.kind}; CREATE OR REPLACE cannot turn it into a {kind}")
        return found

    def _create_source(self, stmt: ast.CreateSource, partitions: int | None) -> Change:
        existing = self._existing(stmt.name, stmt.kind, stmt.if_not_exists, stmt.or_replace)
        if stmt.or_replace and (stmt.read_only or (existing is not None and existing.read_only)):
            advice = "DROP it first, then CREATE it again" if existing is not None else "leave out OR REPLACE"
            raise StatementError(f"cannot replace {stmt.kind.lower()} {stmt.name}: CREATE OR REPLACE is not supported on "
                                 f"SOURCE {stmt.kind.lower()}s (ksqlDB's rule); {advice}")
        if existing is not None and stmt.if_not_exists:
            return Change(f"{stmt.kind.title()} {stmt.name} already exists")
        source = self._declared_source(stmt, partitions)
        if existing is not None:
            _check_replacement(existing, source)
        change = Change(f"{stmt.kind.title()} {stmt.name} replaced" if existing else f"{stmt.kind.title()} created",
                        add_sources=[source])
        if source.kind == "TABLE":
            # As ksqlDB's CREATE SOURCE TABLE: a query keeps the latest row per key in a
            # store, so the table can be pulled from. A replaced table keeps its query's id.
            old = self.queries.get(existing.query_id) if existing is not None and existing.query_id else None
            query_id = old.query_id if old is not None else self._query_id("CST", source.name)
            source = replace(source, query_id=query_id)
            change.add_sources = [source]
            change.add_queries = [PersistentQuery(query_id, "CST", stmt.text, source.name, source.name,
                                                  plan_materialization(source), None)]
            change.counts_query = old is None
        return change

    def _alter_source(self, stmt: ast.AlterSource) -> Change:
        """ALTER ... ADD COLUMN: the source with the columns at its end, as CREATE OR REPLACE would
        declare it (a table's materialization stores them too, under its query's id)."""
        found = self.source(stmt.name)
        if found.kind != stmt.kind:
            raise StatementError(f"{stmt.name} is a {found.kind}; use ALTER {found.kind}")
        writer = self.queries.get(found.query_id or "")
        if writer is not None and writer.kind != "CST":
            raise StatementError(f"{stmt.name} is the result of query {writer.query_id} (CREATE ... AS SELECT): ALTER "
                                 "adds columns to a stream or table that CREATE declared; CREATE OR REPLACE the query "
                                 "to change its columns")
        names = [c.name for c in found.columns] + [c.name for c in stmt.columns]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise StatementError(f"{stmt.name} already has a column {twice[0]}, or ALTER adds it twice")
        _refuse_pseudo_columns([c.name for c in stmt.columns])
        spellings = dict(found.spellings) | dict(stmt.spellings)
        source = replace(found, columns=(*found.columns, *(Column(c.name, c.type) for c in stmt.columns)),
                         spellings=tuple(spellings.items()))
        _check_replacement(found, source)
        change = Change(f"{found.kind.title()} {found.name} altered", add_sources=[source])
        if writer is not None:  # a table's CST: it stores the new columns too
            change.add_queries = [replace(writer, plan=plan_materialization(source))]
        return change

    @staticmethod
    def _declared_source(stmt: ast.CreateSource, partitions: int | None) -> DataSource:
        props = stmt.properties
        what = f"CREATE {stmt.kind} {stmt.name}"
        check_properties(props, SOURCE_PROPERTIES, what)
        if "kafka_topic" not in props:
            raise StatementError(f"{what} needs WITH (kafka_topic='...')")
        if "value_format" not in props:
            raise StatementError(f"{what} needs WITH (value_format=...); one of {', '.join(VALUE_FORMATS)}")
        keys = [c for c in stmt.columns if c.key]
        if stmt.kind == "TABLE" and not keys:
            raise StatementError(f"table {stmt.name} needs a PRIMARY KEY column")
        key_format = check_key_format(str(props.get("key_format", "JSON" if len(keys) > 1 else "KAFKA")).upper(),
                                      tuple(c.name for c in keys))
        for key in keys:
            check_key_type(key.name, key.type, key_format)
        names = [c.name for c in stmt.columns]
        _refuse_pseudo_columns(names)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise StatementError(f"{stmt.name} declares the column {', '.join(twice)} twice")
        columns = tuple(Column(c.name, c.type, c.key) for c in stmt.columns)
        return DataSource(
            stmt.kind, stmt.name, columns, str(props["kafka_topic"]), int(props.get("partitions", partitions or 1)),
            key_format, str(props["value_format"]).upper(),
            value_delimiter=str(props.get("value_delimiter", ",")), timestamp=check_timestamp(props, columns),
            timestamp_format=props.get("timestamp_format"), spellings=stmt.spellings, read_only=stmt.read_only,
        )

    def _query_id(self, prefix: str, name: str = "") -> str:
        # Numbered by how many queries came before, so the coordinator knows the id (and
        # creates the query's topics) before the command is appended. The id names Kafka
        # topics: a (quoted) name's characters Kafka does not allow become '_' and a long name
        # is cut short (the number keeps ids unique).
        named = NOT_IN_TOPICS.sub("_", name)[:MAX_NAME_IN_ID]
        return "_".join(filter(None, (prefix, named, str(self.queries_created))))

    def _create_as_select(self, stmt: ast.CreateAsSelect, start_offsets: tuple[int, ...] | None) -> Change:
        existing = self._existing(stmt.name, stmt.kind, stmt.if_not_exists, stmt.or_replace)
        if existing is not None and stmt.if_not_exists:
            return Change(f"{stmt.kind.title()} {stmt.name} already exists")
        check_properties(stmt.properties, SOURCE_PROPERTIES, f"CREATE {stmt.kind} {stmt.name} AS SELECT")
        source = self.source(stmt.query.source)
        if source.name == stmt.name:
            raise StatementError(f"{stmt.name} cannot read from itself")
        prefix = "CTAS" if stmt.kind == "TABLE" else "CSAS"
        if existing is not None and existing.read_only:
            raise StatementError(f"cannot replace {stmt.kind.lower()} {stmt.name}: it is a SOURCE {stmt.kind.lower()}, "
                                 "declared over its topic and read-only, not a query's result")
        old_query = self.queries.get(existing.query_id) if existing is not None and existing.query_id else None
        if existing is not None and old_query is None:
            raise StatementError(f"{stmt.name} is not written by a running query; only a query's result can be "
                                 "replaced with CREATE OR REPLACE ... AS SELECT")
        query_id = old_query.query_id if old_query is not None else self._query_id(prefix, stmt.name)
        properties = dict(stmt.properties)
        if existing is not None:
            properties.setdefault("kafka_topic", existing.topic)
            properties.setdefault("partitions", existing.partitions)
            properties.setdefault("value_format", existing.value_format)
        joined = tuple(self.source(join.source) for join in stmt.query.joins)
        if stmt.name in (j.name for j in joined):
            raise StatementError(f"{stmt.name} cannot read from itself")
        sink, plan = plan_persistent(stmt.kind, stmt.name, stmt.query, source, properties, query_id, joined=joined)
        check_not_internal(sink.topic, "written")
        self._check_partitions(start_offsets, source, joined)
        if old_query is not None and existing is not None:
            if old_query.source != source.name:
                raise StatementError(f"CREATE OR REPLACE cannot change what {stmt.name} reads "
                                     f"({old_query.source}, not {source.name})")
            _check_replacement(existing, sink)
            query = PersistentQuery(query_id, prefix, stmt.text, source.name, sink.name, plan,
                                    old_query.start_offsets)
            return Change(f"Replaced query {query_id}", add_sources=[sink], add_queries=[query])
        if plan.kind in TABLE_JOINS or plan.regrouped is not None:
            start_offsets = None  # a join or a table's aggregation reads its tables whole, whatever auto.offset.reset says
        query = PersistentQuery(query_id, prefix, stmt.text, source.name, sink.name, plan, start_offsets)
        return Change(f"Created query with ID {query_id}", add_sources=[sink], add_queries=[query], counts_query=True)

    def _insert_select(self, stmt: ast.InsertSelect, start_offsets: tuple[int, ...] | None) -> Change:
        target = self.source(stmt.target)
        if target.kind != "STREAM":
            raise StatementError(f"INSERT INTO ... SELECT writes a STREAM; {target.name} is a {target.kind}")
        _refuse_read_only(target)
        check_not_internal(target.topic, "written")
        source = self.source(stmt.query.source)
        if source.name == target.name:
            raise StatementError(f"INSERT INTO {target.name} cannot read from {target.name} itself")
        query_id = self._query_id("INSERTQUERY")
        joined = tuple(self.source(join.source) for join in stmt.query.joins)
        if target.name in (j.name for j in joined):
            raise StatementError(f"INSERT INTO {target.name} cannot read from {target.name} itself")
        _, plan = plan_persistent(None, target.name, stmt.query, source, {}, query_id, target=target, joined=joined)
        self._check_partitions(start_offsets, source, joined)
        query = PersistentQuery(query_id, "INSERT", stmt.text, source.name, target.name, plan, start_offsets)
        return Change(f"Created query with ID {query_id}", add_queries=[query], counts_query=True)

    @staticmethod
    def _check_partitions(start_offsets: tuple[int, ...] | None, source: DataSource,
                          joined: tuple[DataSource, ...]) -> None:
        """The start offsets cover the source's partitions (a stream-stream join's: both streams')."""
        sides = len(started_sources(source, joined))
        if start_offsets is not None and len(start_offsets) != sides * source.partitions:
            raise StatementError(f"the command's start offsets cover {len(start_offsets)} partitions "
                                 f"but {source.name} has {source.partitions}")

    def _drop(self, stmt: ast.Drop) -> Change:
        found = self.sources.get(stmt.name)
        if found is None:
            if stmt.if_exists:
                return Change(f"{stmt.kind.title()} {stmt.name} does not exist")
            self.source(stmt.name)  # raises NOT_FOUND naming the known sources
        assert found is not None
        if found.kind != stmt.kind:
            raise StatementError(f"{stmt.name} is a {found.kind}; use DROP {found.kind}")
        own = found.query_id if found.query_id in self.queries else None
        blockers = [q for q in self.readers(found.name) + self.writers(found.name) if q != own]
        if blockers:
            raise StatementError(f"cannot drop {found.name}: queries {', '.join(blockers)} read or write it; "
                                 f"TERMINATE them first")
        change = Change(f"Source {found.name} (topic: {found.topic}) was dropped.", drop_sources=[found.name])
        if own is not None:
            change.drop_queries.append(self.queries[own])
        if stmt.delete_topic:
            check_not_internal(found.topic, "deleted (leave out DELETE TOPIC)")
            sharing = sorted(s.name for s in self.sources.values() if s.topic == found.topic and s.name != found.name)
            if sharing:
                raise StatementError(f"topic {found.topic} is also the topic of {', '.join(sharing)}; "
                                     "drop those first or leave out DELETE TOPIC")
            change.delete_topics.append(found.topic)
        return change

    def _terminate(self, stmt: ast.Terminate) -> Change:
        """TERMINATE: the queries stop, their results stay as plain sources. A SOURCE table's
        materialization is the table's own (ksqlDB's ``linked to a source table``): refused by id,
        left running by TERMINATE ALL."""
        if stmt.query_id is None:
            queries = [q for q in self.queries.values() if not self._materializes_source(q)]
        else:
            queries = [self.query(stmt.query_id)]
            if self._materializes_source(queries[0]):
                raise StatementError(f"cannot terminate query {stmt.query_id}: it materializes SOURCE table "
                                     f"{queries[0].sink}, and goes when the table is dropped (DROP TABLE {queries[0].sink})")
        change = Change("All queries terminated" if stmt.query_id is None else f"Query {stmt.query_id} terminated",
                        drop_queries=queries)
        for query in queries:
            sink = self.sources.get(query.sink)
            if sink is not None and sink.query_id == query.query_id:
                # The result stays, now a plain source nobody writes.
                change.add_sources.append(replace(sink, query_id=None))
        return change

    def _materializes_source(self, query: PersistentQuery) -> bool:
        """Whether ``query`` is a SOURCE table's materialization."""
        sink = self.sources.get(query.sink)
        return query.kind == "CST" and sink is not None and sink.read_only


def _check_replacement(old: DataSource, new: DataSource) -> None:
    """CREATE OR REPLACE may add columns, but not change the topic, the key or existing columns."""
    if new.topic != old.topic or new.partitions != old.partitions:
        raise StatementError(f"CREATE OR REPLACE cannot change the topic of {old.name} "
                             f"({old.topic}, {old.partitions} partitions)")
    if new.columns[:len(old.columns)] != old.columns:
        raise StatementError(f"CREATE OR REPLACE can only add columns at the end of {old.name}; "
                             f"it has ({old.schema_text()}) and the new statement gives ({new.schema_text()})")
    if new.key_format != old.key_format or new.value_format != old.value_format:
        raise StatementError(f"CREATE OR REPLACE cannot change the formats of {old.name}")


_UNSET_NEWER: dict[str, Any] = {"window": None, "event_time": None, "timestamp_format": None, "join": None,
                                 "having": None, "step": 0, "regrouped": None, "types": (),
                                 "read_only": False, "arg_types": ()}
"""Fields added after the first release, and their unset value: unset, they stay out of the
digest, so a definition that does not use them hashes as it did before they existed."""


_UNSET_NEWER_NESTED: dict[str, Any] = {"within": None, "foreign_key": None, "rekey": None, "step": 0,
                                        "literals": (), "eager": False, "result": None, "exploded": False,
                                        "read_only": False, "arg_types": ()}
"""The same inside tuples (a join's tables), where the older fields always stayed in."""


_NOT_HASHED = frozenset({"spellings"})
"""Fields that change how fast a record is read, not what is read: nodes that differ in them
still agree (a source's spellings came later, and most sources have some)."""


def _definition(value: Any) -> Any:
    """A source's or query's fields for the digest (nested plans too), without unset newer fields."""
    def strip(node: Any, nested: bool = False) -> Any:
        if isinstance(node, dict):
            unset = _UNSET_NEWER_NESTED if nested else _UNSET_NEWER
            return {k: strip(v, nested) for k, v in node.items()
                    if k not in _NOT_HASHED and not (k in unset and v == unset[k])}
        if isinstance(node, list | tuple):
            return type(node)(strip(v, True) for v in node)
        return node
    return strip(asdict(value))
