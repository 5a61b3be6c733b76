"""Which replacements of a running query keep its state usable (ksqlDB's query upgrades).

CREATE OR REPLACE swaps a query's plan in place: its tasks keep their stores, changelogs
and committed positions, so what the old plan stored must be what the new one reads. An
aggregation stores, per GROUP BY key, one state per aggregate in the plan's order, and
merges each batch into it aggregate by aggregate. A replacement of it therefore keeps:

- the source (the metastore checks that for every replacement);
- the GROUP BY key: the key column and the expression it is computed from;
- the aggregate list: each output column, function and argument, in the same order.

It may change the WHERE filter (not of a table's aggregation, whose rows stay counted as
the WHERE was when they last changed), but not HAVING (standby copies filter their rows with the
plan they were made with). A stream-table join keeps its tables' rows and positions per
JOIN: a replacement keeps the tables, their order, join types and conditions. A projection
keeps no state, so it may add columns at the
end as the metastore allows for any result. No plan turns into another kind. Anything
else is refused, as ksqlDB refuses an incompatible upgrade: drop the result and create it
again (its state starts over).

Checked when a statement is accepted, never on replay: the commands already in the
command topic replay as they were accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from millpond.shared.catalog.metastore import Change
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import AggregateCall, JoinSpec, PersistentQuery
from millpond.shared.catalog.sources import WindowSpec
from millpond.shared.errors import StatementError

_REMEDY = ("ksqlDB-style upgrades keep the aggregate list and GROUP BY; drop the table and create it again "
           "(its state starts over)")


def check_upgrades(queries: Mapping[str, PersistentQuery], change: Change) -> None:
    """StatementError when ``change`` replaces one of the running ``queries`` by an
    incompatible plan."""
    for new in change.add_queries:
        old = queries.get(new.query_id)
        if old is not None:
            check_upgrade(old, new)


def check_upgrade(old: PersistentQuery, new: PersistentQuery) -> None:
    """StatementError when ``new`` cannot take over ``old``'s state."""
    before, after = old.plan, new.plan
    what = f"cannot replace query {old.query_id}"
    if before.kind != after.kind:
        raise StatementError(f"{what}: it would turn from {_KIND_NAMES[before.kind]} into "
                             f"{_KIND_NAMES[after.kind]}; {_REMEDY}")
    if before.join is not None and after.join is not None:
        def sides(join: JoinSpec) -> list[tuple[Any, ...]]:
            first = (join.stream.name, join.stream.topic, join.stream.columns)
            return [first if before.kind is not PlanKind.STREAM_TABLE_JOIN else (),
                    *((t.type, t.table.name, t.table.topic, t.table.columns, t.condition, t.within, t.foreign_key, t.rekey,
                       t.step)
                      for t in join.tables)]
        if sides(before.join) != sides(after.join):
            raise StatementError(f"{what}: its joins change (tables, their order, types, columns or conditions); its "
                                 "store keeps each joined table's rows and position; drop the stream and create it "
                                 "again")
    if before.kind not in (PlanKind.AGGREGATE, PlanKind.WINDOWED_AGGREGATE, PlanKind.SESSION_AGGREGATE):
        return
    if before.having != after.having:
        raise StatementError(f"{what}: its HAVING changes from {before.having} to {after.having}; {_REMEDY}")
    where_before, where_after = ((p.where, None if p.join is None else p.join.where) for p in (before, after))
    if before.regrouped is not None and where_before != where_after:
        # Rows counted under the old WHERE would stay counted until they change: the table
        # would match neither statement.
        raise StatementError(f"{what}: its WHERE changes, and an aggregation of a table counts each of its rows as "
                             f"the WHERE was when the row last changed; {_REMEDY}")
    if (before.join is None) != (after.join is None):
        raise StatementError(f"{what}: its source changes between a stream and a join; {_REMEDY}")
    keys_before, keys_after = ([f"{c.name} = {c.expression}" for c in p.columns if c.key] for p in (before, after))
    if keys_before != keys_after:
        raise StatementError(f"{what}: its GROUP BY changes from {', '.join(keys_before)} to {', '.join(keys_after)}; "
                             f"{_REMEDY}")
    if (before.key_column, before.key_expression) != (after.key_column, after.key_expression):
        raise StatementError(f"{what}: its GROUP BY changes from {_key(before.key_column, before.key_expression)} "
                             f"to {_key(after.key_column, after.key_expression)}; {_REMEDY}")
    if (before.window, before.event_time) != (after.window, after.event_time):
        raise StatementError(f"{what}: its windows change (from {_windows(before.window)} to {_windows(after.window)}, "
                             "or their event time); a windowed store keeps the windows it was made with; "
                             f"{_REMEDY}")
    if before.aggregates != after.aggregates:
        raise StatementError(f"{what}: its aggregates change from {_aggregates(before.aggregates)} to "
                             f"{_aggregates(after.aggregates)}; {_REMEDY}")


_KIND_NAMES = {
    PlanKind.AGGREGATE: "an aggregation (GROUP BY)",
    PlanKind.WINDOWED_AGGREGATE: "a windowed aggregation (WINDOW ... GROUP BY)",
    PlanKind.SESSION_AGGREGATE: "a session-windowed aggregation (WINDOW SESSION ... GROUP BY)",
    PlanKind.PROJECT: "a projection",
    PlanKind.MATERIALIZE: "a table's materialization",
    PlanKind.STREAM_TABLE_JOIN: "a stream-table join",
    PlanKind.TABLE_TABLE_JOIN: "a table-table join",
    PlanKind.FOREIGN_KEY_JOIN: "a foreign-key table-table join",
    PlanKind.STREAM_STREAM_JOIN: "a stream-stream join",
    PlanKind.JOIN_SIDE: "a table-table join's side",
    PlanKind.REGROUP: "a table aggregation's regrouping",
}


def _key(column: str | None, expression: str | None) -> str:
    return f"{column} = {expression}" if expression is not None else f"{column} (the input's key)"


def _aggregates(calls: tuple[AggregateCall, ...]) -> str:
    return "[" + ", ".join(f"{a.column} = {a.shown()}" for a in calls) + "]"


def _windows(window: WindowSpec | None) -> str:
    if window is None:
        return "none"
    return (f"{window.kind} SIZE {window.size_ms} ms, ADVANCE BY {window.advance_ms} ms, "
            f"GRACE PERIOD {window.grace_ms} ms, RETENTION {window.retention_ms} ms")
