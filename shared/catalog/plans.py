"""The kinds of persistent-query plan, and what each kind needs from the cluster.

``PLAN_SPECS`` has one row per kind: whether its result keeps a changelog of its own (and
so gets standbys), whether re-keying it takes an internal topic, and its EXPLAIN step.
The worker's side of a kind (its task class and how Spark reduces a micro-batch for it)
is ``millpond.services.worker.kinds``; this module imports no service code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PlanKind(StrEnum):
    """How workers execute a persistent query (a ``str``: it hashes into the metastore
    digest exactly as the plain strings it replaced)."""

    PROJECT = "PROJECT"
    """Filter and project each record (CSAS, INSERT INTO ... SELECT, CTAS without GROUP BY)."""
    AGGREGATE = "AGGREGATE"
    """Keep per-key aggregate state (CTAS with GROUP BY)."""
    WINDOWED_AGGREGATE = "WINDOWED_AGGREGATE"
    """Keep aggregate state per key and window (CTAS with WINDOW TUMBLING|HOPPING ... GROUP BY)."""
    SESSION_AGGREGATE = "SESSION_AGGREGATE"
    """Keep aggregate state per key and session (CTAS with WINDOW SESSION ... GROUP BY)."""
    MATERIALIZE = "MATERIALIZE"
    """Keep the latest row per key of a table's topic, so it can be pulled."""
    STREAM_TABLE_JOIN = "STREAM_TABLE_JOIN"
    """Join each stream record with a table's row as of the record (CSAS ... JOIN table)."""
    TABLE_TABLE_JOIN = "TABLE_TABLE_JOIN"
    """Keep both tables' rows and the join of each key's rows (CTAS ... FROM table JOIN table)."""
    FOREIGN_KEY_JOIN = "FOREIGN_KEY_JOIN"
    """Keep the left table's rows, the right table whole and the left keys of each foreign key,
    and the join of each left key's row (CTAS ... FROM t1 JOIN t2 ON t1.column = t2.key)."""
    STREAM_STREAM_JOIN = "STREAM_STREAM_JOIN"
    """Join each record of two streams with the other's records within a window (CSAS ... WITHIN)."""
    REGROUP = "REGROUP"
    """A table aggregation's first stage: each changed row of the table retracted from the group
    it was counted in and added to its new one, into the query's repartition topic (internal)."""
    JOIN_SIDE = "JOIN_SIDE"
    """A two-topic join's first stages: each side's records into the query's joined topic,
    keyed by the side's place in the join and the key (internal: no statement has it)."""

    @property
    def spec(self) -> PlanSpec:
        """What this kind needs."""
        return PLAN_SPECS[self]


@dataclass(frozen=True)
class PlanSpec:
    """What a plan kind needs from the cluster."""

    changelog: bool
    """Its state store writes a compacted changelog topic of its own: the store is restored
    from it, standbys replay it, and it is deleted with the query. (A MATERIALIZE store
    has no topic of its own: it is rebuilt from the table's topic; only a joined table's has
    standbys, which replay that topic: ``Stage.replayed``.)"""
    repartition_topic: bool
    """A plan of this kind that changes its records' partition runs as two stages through an
    internal repartition topic. (A re-keying PROJECT writes each record straight to its new
    partition of the sink.)"""
    explain: str
    """The EXPLAIN step, a format string over ``key`` (the key column), ``aggregates``,
    ``columns`` (each ``name = expression``, comma-separated) and ``join`` (the join's
    type, table and condition)."""


PLAN_SPECS: dict[PlanKind, PlanSpec] = {
    PlanKind.PROJECT: PlanSpec(changelog=False, repartition_topic=False, explain="[ PROJECT ] | {columns}"),
    PlanKind.AGGREGATE: PlanSpec(
        changelog=True, repartition_topic=True,
        explain="[ AGGREGATE ] | Key: {key} | Aggregates: {aggregates} | State: RocksDB + changelog"),
    PlanKind.WINDOWED_AGGREGATE: PlanSpec(
        changelog=True, repartition_topic=True,
        explain="[ AGGREGATE ] | Key: {key}, WINDOWSTART | Aggregates: {aggregates} | "
                "State: RocksDB + changelog (compact, delete)"),
    PlanKind.SESSION_AGGREGATE: PlanSpec(
        changelog=True, repartition_topic=True,
        explain="[ AGGREGATE ] | Key: {key}, session | Aggregates: {aggregates} | "
                "State: RocksDB + changelog (compact, delete)"),
    PlanKind.MATERIALIZE: PlanSpec(
        changelog=False, repartition_topic=False,
        explain="[ MATERIALIZE ] | Latest row per key {key} | State: RocksDB, rebuilt from the source topic"),
    PlanKind.STREAM_TABLE_JOIN: PlanSpec(
        changelog=False, repartition_topic=True,
        explain="[ JOIN ] | {join} | {columns} | State: each table's rows in RocksDB, rebuilt from its topic"),
    PlanKind.TABLE_TABLE_JOIN: PlanSpec(
        changelog=False, repartition_topic=False,
        explain="[ JOIN ] | {join} | {columns} | State: both sides' rows in RocksDB, rebuilt from the joined topic; "
                "the result materialized from the sink topic"),
    PlanKind.FOREIGN_KEY_JOIN: PlanSpec(
        changelog=False, repartition_topic=False,
        explain="[ JOIN ] | {join} | {columns} | State: the left table's rows, all of the right table's and "
                "the left keys of each foreign key in RocksDB, rebuilt from the joined topic (the right table "
                "copied to each of its partitions); the result materialized from the sink topic"),
    PlanKind.STREAM_STREAM_JOIN: PlanSpec(
        changelog=False, repartition_topic=False,
        explain="[ JOIN ] | {join} | {columns} | State: both streams' records within the window, in memory, "
                "rebuilt from the joined topic"),
    PlanKind.JOIN_SIDE: PlanSpec(changelog=False, repartition_topic=False, explain="[ JOIN SIDE ]"),
    PlanKind.REGROUP: PlanSpec(changelog=False, repartition_topic=False, explain="[ REGROUP ]"),
}
"""Every plan kind's needs, one row per kind."""
