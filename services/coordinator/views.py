"""SHOW, DESCRIBE and EXPLAIN: read-only views of the metastore as statement outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from millpond.shared.catalog.metastore import Metastore, check_sources
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import JoinWindow, PersistentQuery, QueryPlan
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.upgrades import check_upgrades
from millpond.shared.errors import NotFoundError, StatementError
from millpond.shared.results import Outcome
from millpond.shared.sql import aggregates, arrays, ast, functions
from millpond.shared.sql.function_docs import OVERVIEWS
from millpond.shared.sql.planner import SelectPlan, plan_select
from millpond.shared.sql.types import LAMBDA_FUNCTIONS, LAMBDA_SHAPES, TABLE_FUNCTIONS
from millpond.shared.task_status import RESTORING, TaskReport, summarize

Reports = Mapping[str, list[TaskReport]]
"""What the workers last reported about each query's tasks, by query id."""

_PROPERTY_VALUE = [("PROPERTY", "VARCHAR"), ("VALUE", "VARCHAR")]


def show(metastore: Metastore, stmt: ast.Show, properties: Mapping[str, str], reports: Reports) -> Outcome:
    """SHOW STREAMS | TABLES | QUERIES | PROPERTIES | FUNCTIONS | TYPES (TOPICS asks Kafka, so the executor does it)."""
    if stmt.what in ("STREAMS", "TABLES"):
        return show_sources(metastore, stmt)
    if stmt.what == "QUERIES":
        return show_queries(metastore, stmt, reports)
    if stmt.what == "PROPERTIES":
        return show_properties(stmt, properties)
    if stmt.what == "FUNCTIONS":
        return show_functions(stmt)
    if stmt.what == "TYPES":
        return show_types(metastore, stmt)
    raise StatementError(f"SHOW {stmt.what} needs Kafka; the coordinator answers it")


def show_sources(metastore: Metastore, stmt: ast.Show) -> Outcome:
    """SHOW STREAMS / SHOW TABLES; EXTENDED (or ``DESCRIBE STREAMS``, ksqlDB's) with what
    ``DESCRIBE EXTENDED`` says of each too: its columns, event time, windows and queries."""
    kind = stmt.what[:-1]
    columns = ["NAME", "TOPIC", "KEY_FORMAT", "VALUE_FORMAT", "PARTITIONS", "STATUS"]
    if stmt.extended:
        columns += ["SCHEMA", "TIMESTAMP", "WINDOW", "WRITTEN_BY", "READ_BY"]
    rows = []
    for s in sorted(metastore.sources.values(), key=lambda s: s.name):
        if s.kind != kind:
            continue
        row: list[object] = [s.name, s.topic, s.key_format, s.value_format, s.partitions, metastore.status(s.name)]
        if stmt.extended:
            row += [s.schema_text(), s.timestamp or "", s.window.describe() if s.window is not None else "",
                    ", ".join(metastore.writers(s.name)), ", ".join(metastore.readers(s.name))]
        rows.append(row)
    return Outcome(stmt.text, status="", columns=[(c, "INT" if c == "PARTITIONS" else "VARCHAR") for c in columns],
                   rows=rows)


def _state(metastore: Metastore, query_id: str, reports: Reports) -> str:
    """``ERROR: why`` for a query that cannot run, else its tasks counted by state (as
    ksqlDB's ``RUNNING:2``), or UNASSIGNED while no worker reports a task of it."""
    error = metastore.errors.get(query_id)
    if error is not None:
        return f"ERROR: {error}"
    return summarize(reports.get(query_id, [])) or "UNASSIGNED"


def show_queries(metastore: Metastore, stmt: ast.Show, reports: Reports) -> Outcome:
    """SHOW QUERIES; EXTENDED: a row per task of each (input partition, stage), where it runs and
    how far it is, as EXPLAIN shows one query's (a query no worker reports a task of: one row)."""
    queries = sorted(metastore.queries.values(), key=lambda q: q.query_id)
    if not stmt.extended:
        columns = [("QUERY_ID", "VARCHAR"), ("TYPE", "VARCHAR"), ("STATE", "VARCHAR"), ("SOURCE", "VARCHAR"),
                   ("SINK", "VARCHAR"), ("SQL", "VARCHAR")]
        rows = [[q.query_id, q.kind, _state(metastore, q.query_id, reports), q.source, q.sink, q.statement]
                for q in queries]
        return Outcome(stmt.text, status="", columns=columns, rows=rows)
    columns = [("QUERY_ID", "VARCHAR"), ("PARTITION", "INT"), ("WORKER", "VARCHAR"), ("STATE", "VARCHAR"),
               ("INPUT_OFFSET", "BIGINT"), ("RESTORED", "VARCHAR"), ("FAILURES", "INT"), ("LAST_FAILURE", "VARCHAR")]
    task_rows: list[list[Any]] = []
    for q in queries:
        tasks = sorted(reports.get(q.query_id, []), key=lambda r: (r.partition, r.worker_id))
        if not tasks:
            task_rows.append([q.query_id, None, "", _state(metastore, q.query_id, reports), None, "", 0, ""])
        for task in tasks:
            restored = f"{task.restored_records}/{task.records_to_restore}" if task.state == RESTORING else ""
            task_rows.append([q.query_id, task.partition, task.worker_id, task.state,
                         task.input_offset if task.input_offset >= 0 else None, restored, task.failures, task.reason])
    return Outcome(stmt.text, status="", columns=columns, rows=task_rows)


def show_properties(stmt: ast.Show, properties: Mapping[str, str]) -> Outcome:
    """SHOW PROPERTIES: the settings in effect for this request."""
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=[[k, v] for k, v in sorted(properties.items())])


def function_rows() -> list[list[str]]:
    """Every function a statement may call: its name, its type (SCALAR, AGGREGATE, LAMBDA, TABLE) and
    how a call is written, by name."""
    rows = [[f.name, "SCALAR", f.signature()] for f in functions.FUNCTIONS.values()]
    rows += [[a.name, "AGGREGATE", _aggregate_signature(a)] for a in aggregates.AGGREGATES.values()]
    rows += [[name, "LAMBDA", " or ".join(shape for (f, _), shape in LAMBDA_SHAPES.items() if f == name)]
             for name in LAMBDA_FUNCTIONS]
    rows += [[name, "TABLE", f"{name}(ARRAY)"] for name in TABLE_FUNCTIONS]
    return sorted(rows)


def show_functions(stmt: ast.Show) -> Outcome:
    """SHOW FUNCTIONS: ``function_rows``."""
    return Outcome(stmt.text, status="", columns=[("NAME", "VARCHAR"), ("TYPE", "VARCHAR"), ("SIGNATURE", "VARCHAR")],
                   rows=function_rows())


def describe_function(stmt: ast.DescribeFunction) -> Outcome:
    """DESCRIBE FUNCTION name (ksqlDB's): its name, type, how a call is written and what it does."""
    found = next((row for row in function_rows() if row[0] == stmt.name), None)
    if found is None:
        raise NotFoundError(f"function {stmt.name} does not exist; SHOW FUNCTIONS lists the functions")
    name, kind, signature = found
    rows = [["NAME", name], ["TYPE", kind], ["SIGNATURE", signature], ["OVERVIEW", OVERVIEWS[name]]]
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=rows)


def show_types(metastore: Metastore, stmt: ast.Show) -> Outcome:
    """SHOW TYPES: each custom type's name and the type it stands for."""
    return Outcome(stmt.text, status="", columns=[("NAME", "VARCHAR"), ("SCHEMA", "VARCHAR")],
                   rows=[[name, str(type_)] for name, type_ in sorted(metastore.types.items())])


def _exploded(spark: str) -> str:
    """A table function's column as EXPLAIN shows it: the function over its ARRAY's Spark SQL."""
    items = arrays.cubed_items(spark)
    return f"EXPLODE({spark})" if items is None else f"CUBE_EXPLODE({items})"


def _aggregate_signature(aggregate: aggregates.Aggregate) -> str:
    argument = functions.KIND_SHOWN.get(aggregate.param, aggregate.param)
    if aggregate.name == "COUNT":
        argument = f"* or {argument}"
    argument = ", ".join([argument] * aggregate.columns)
    return f"{aggregate.name}({argument}{'' if aggregate.given is None else ', literals'})"


def describe(metastore: Metastore, stmt: ast.Describe) -> Outcome:
    """DESCRIBE name: the columns, with a summary line; EXTENDED: every property as a row;
    DESCRIBE FUNCTION: ``describe_function``."""
    if isinstance(stmt, ast.DescribeFunction):
        return describe_function(stmt)
    source = metastore.source(stmt.name)
    if not stmt.extended:
        key = "KEY" if source.window is None else f"KEY (Window type: {source.window.kind})"
        rows = [[c.name, str(c.type), key if c.key else ""] for c in source.columns]
        kind = f"{source.kind} (SOURCE, read-only)" if source.read_only else source.kind
        summary = (f"Name: {source.name} | Type: {kind} | Topic: {source.topic} | "
                   f"Status: {metastore.status(source.name)}")
        return Outcome(stmt.text, message=summary, status="",
                       columns=[("FIELD", "VARCHAR"), ("TYPE", "VARCHAR"), ("KEY", "VARCHAR")], rows=rows)
    writer = metastore.queries.get(source.query_id or "")
    rows = [
        ["NAME", source.name], ["TYPE", source.kind], ["SCHEMA", source.schema_text()],
        ["TOPIC", source.topic], ["PARTITIONS", str(source.partitions)],
        ["KEY_FORMAT", source.key_format], ["VALUE_FORMAT", source.value_format],
        ["TIMESTAMP", source.timestamp or ""],
        ["TIMESTAMP_FORMAT", source.timestamp_format or ""],
        ["WINDOW", source.window.describe() if source.window is not None else ""],
        ["WRITTEN_BY", ", ".join(metastore.writers(source.name))],
        ["READ_BY", ", ".join(metastore.readers(source.name))],
        ["STATUS", metastore.status(source.name)],
        ["STATEMENT", writer.statement if writer else ""],
    ]
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=rows)


def plan_lines(plan: QueryPlan, source: DataSource, sink: DataSource) -> list[str]:
    """A persistent query's plan as an indented tree, sink first (as ksqlDB's EXPLAIN)."""
    steps = [f"[ SINK ] | {sink.kind} {sink.name} | Topic: {sink.topic} | Partitions: {sink.partitions} | "
             f"Format: {sink.value_format} | Schema: {sink.schema_text()}"]
    join = "" if plan.join is None else ", ".join(
        f"{t.type} JOIN {t.table.name}{_within(t.within)} ON {t.condition} ({t.table.kind.lower()} topic "
        f"{t.table.topic})" for t in plan.join.tables)
    steps.append(plan.kind.spec.explain.format(
        key=plan.key_column,
        aggregates=", ".join(f"{a.column} = {a.shown()}" for a in plan.aggregates),
        columns=", ".join(f"{c.name} = {_exploded(c.expression) if c.exploded else c.expression}" for c in plan.columns),
        join=join))
    if plan.kind is PlanKind.STREAM_TABLE_JOIN and plan.join is not None and any(
            t.within is not None for t in plan.join.tables):  # a stream joined after the tables
        steps[-1] += "; each later stream's records within its window, in memory, rebuilt from its stage's topic"
    repartition = (f"[ REPARTITION ] | Key: {plan.key_expression or plan.key_column} | "
                   f"Partitions: {source.partitions} -> {sink.partitions}")
    if plan.regrouped is not None:  # a table's rows (over a join: the joined table's) regrouped, then aggregated
        steps += ["[ REGROUP ] | each changed row of the table taken out of the group it was counted in and "
                  "put into its new one (_SIGN -1, then 1) | State: the row each key last added, in RocksDB + "
                  "changelog", repartition]
    if plan.join is not None and "{join}" not in plan.kind.spec.explain:  # a GROUP BY over a join
        streams = plan.join.tables[0].within is not None
        tables = any(t.within is None for t in plan.join.tables)
        held = ["both streams' records within the window, in memory, rebuilt from the joined topic"] if streams else []
        if any(t.within is not None for t in plan.join.tables[1:]):  # a stream joined after another JOIN
            held.append("a later stream's stage's records within its window, in memory, rebuilt from its streams "
                        "topic")
        if tables:
            held.append("each table's rows in RocksDB, rebuilt from its topic")
        state = "; ".join(held)
        if plan.join.stream.kind == "TABLE":
            steps.append(f"[ JOIN ] | {join} | every column of each key's joined row, keyed by the join key into the "
                         "query's joined-rows topic | State: every table's rows in RocksDB, rebuilt from the joined "
                         "topic")
        else:
            steps.append(f"[ JOIN ] | {join} | every column of the joined row, keyed by the GROUP BY into the "
                         f"query's {'grouped' if streams else 'joined'} topic | State: {state}")
    if plan.join is not None and plan.join.steps > 1 and plan.join.stream.kind == "TABLE":
        each = "; ".join(
            f"{step + 1}: " + ", ".join(f"{t.table.name} ({'foreign key' if t.foreign_key else 'key'} {t.condition}"
                                       f"{', copied to every partition' if t.foreign_key else ''})"
                                       for t in plan.join.stage_tables(step))
            for step in range(plan.join.steps))
        steps.append(f"[ CHAIN ] | {plan.join.steps} join stages ({each}): each later one joins the rows joined "
                     f"so far, keyed by {plan.join.stream.name}'s key through an internal topic of the query, with "
                     "its tables | State: each stage's sides' rows in RocksDB, rebuilt from its joined topic")
    elif plan.join is not None and plan.join.steps > 1:
        later = [t.table.name for t in plan.join.tables if t.step > 0 and t.within is not None]
        apart = (f"; {', '.join(later)} joined WITHIN in a stage of {'its' if len(later) == 1 else 'each'} own, "
                 "both sides copied into a topic of the query by event time, their buffers in memory") if later else ""
        steps.append(f"[ REPARTITION ] | {plan.join.steps} join stages, one per JOIN expression{apart}: each joined "
                     "row re-keyed by the next JOIN's expression through an internal topic of the query")
    if plan.join is not None and plan.join.where is not None:
        steps.append(f"[ FILTER ] | {plan.join.where}")
    if plan.having is not None:  # over the aggregated rows, before the sink
        steps.insert(1, f"[ HAVING ] | {plan.having} (a row that fails it is a tombstone in the sink, "
                        "absent from pulls)")
    if plan.window is not None:
        steps.append(f"[ WINDOW ] | {plan.window.describe()} | Event time: {plan.event_time or 'ROWTIME'}")
    if plan.repartition and plan.regrouped is None:
        steps.append(repartition)
    if plan.where is not None:
        steps.append(f"[ FILTER ] | {plan.where}")
    steps.append(f"[ SOURCE ] | {source.kind} {source.name} | Topic: {source.topic} | "
                 f"Partitions: {source.partitions} | Format: {source.value_format}")
    return [" " * (2 * depth) + "> " + step for depth, step in enumerate(steps)]


def _within(window: JoinWindow | None) -> str:
    if window is None:
        return ""
    return f" WITHIN ({window.before_ms} ms, {window.after_ms} ms) GRACE PERIOD {window.grace_ms} ms"


def explain_query(metastore: Metastore, stmt: ast.Explain, query: PersistentQuery, reports: Reports) -> Outcome:
    """EXPLAIN query_id: the query, its plan, and the state of each of its tasks."""
    source, sink = metastore.source(query.source), metastore.source(query.sink)
    rows = [["QUERY_ID", query.query_id], ["TYPE", query.kind], ["STATE", _state(metastore, query.query_id, reports)],
            ["SQL", query.statement], ["SOURCE", source.name], ["SINK", sink.name], ["SINK_TOPIC", sink.topic],
            ["SCHEMA", sink.schema_text()],
            ["START", "latest" if query.start_offsets is not None else "earliest"]]
    rows += [["PLAN", line] for line in plan_lines(query.plan, source, sink)]
    rows += [["TASK", r.describe()] for r in sorted(reports.get(query.query_id, []), key=lambda r: r.partition)]
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=rows)


def explain_planned(stmt: ast.Explain, query: PersistentQuery, source: DataSource, sink: DataSource) -> Outcome:
    """EXPLAIN of a CREATE ... AS SELECT or INSERT INTO ... SELECT that is not run."""
    rows = [["TYPE", query.kind], ["SQL", query.statement], ["SOURCE", source.name], ["SINK", sink.name],
            ["SCHEMA", sink.schema_text()]]
    rows += [["PLAN", line] for line in plan_lines(query.plan, source, sink)]
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=rows)


def explain_select(stmt: ast.Explain, plan: SelectPlan) -> Outcome:
    """EXPLAIN of a pull or push query."""
    kind = "PUSH" if isinstance(stmt.statement, ast.Query) and stmt.statement.emit_changes else "PULL"
    rows = [["TYPE", kind], ["SQL", stmt.statement.text if stmt.statement else ""],
            ["SCHEMA", ", ".join(f"{n} {t}" for n, t in plan.columns)]]
    rows += [["PLAN", line] for line in plan.describe()]
    return Outcome(stmt.text, status="", columns=_PROPERTY_VALUE, rows=rows)


def explain(metastore: Metastore, stmt: ast.Explain, properties: Mapping[str, str], reports: Reports) -> Outcome:
    """EXPLAIN query_id, or EXPLAIN of a statement that is planned but not run."""
    if stmt.query_id is not None:
        return explain_query(metastore, stmt, metastore.query(stmt.query_id), reports)
    inner = stmt.statement
    if isinstance(inner, ast.Query):
        return explain_select(stmt, plan_select(inner, metastore.source(inner.source)))
    assert inner is not None
    change = metastore.plan(inner, properties)
    check_upgrades(metastore.queries, change)  # EXPLAIN refuses what running it would
    check_sources(change)
    if not change.add_queries:
        return Outcome(stmt.text, change.message)
    query = change.add_queries[0]
    sinks = {s.name: s for s in change.add_sources}
    sink = sinks.get(query.sink) or metastore.source(query.sink)
    return explain_planned(stmt, query, metastore.source(query.source), sink)
