"""The worker's side of each plan kind: the task class that commits a partition's slice of
a micro-batch, the slice it takes, and the reducer that computes those slices on Spark.

What a kind needs from the cluster (changelog, standbys, internal topics, EXPLAIN) is
``millpond.shared.catalog.plans``; this is what the worker runs for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from pyspark.sql import DataFrame

from millpond.services.worker.joining import JoinSlice, JoinTask
from millpond.services.worker.reducers import (
    Reduction,
    aggregate_reduction,
    join_reduction,
    keyed_reduction,
    materialize_reduction,
    project_reduction,
    sessions_reduction,
    windowed_reduction,
)
from millpond.services.worker.regrouping import RegroupTask
from millpond.services.worker.stream_joining import StreamJoinTask
from millpond.services.worker.table_joining import ForeignKeyJoinTask, JoinSideTask, KeyedSlice, TableJoinTask
from millpond.services.worker.task import (
    AggregateSlice,
    AggregationTask,
    MaterializeSlice,
    ProjectionTask,
    ProjectSlice,
    RegroupSlice,
    ReplayedTableTask,
    SessionAggregationTask,
    SessionSlice,
    SliceT,
    TableTask,
    Task,
    WindowedAggregationTask,
    WindowSlice,
)
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import Stage
from millpond.shared.config import WorkerSettings


@dataclass(frozen=True)
class WorkerKind(Generic[SliceT]):
    """How the worker runs one plan kind."""

    task: type[Task[SliceT]]
    """One input partition's task: commits each of its slices exactly once."""
    slice: type[SliceT]
    """A partition's part of a micro-batch, as the task takes it."""
    reduction: Callable[[DataFrame, PersistentQuery, DataSource, DataSource, Mapping[int, Any]], Reduction[SliceT]]
    """How a query reduces the records parsed (query, its source, its sink, the tasks it
    starts with, by partition): each record's columns, and each batch of them to each
    partition's slice, in one Spark job."""


WORKER_KINDS: dict[PlanKind, WorkerKind[Any]] = {
    PlanKind.AGGREGATE: WorkerKind(AggregationTask, AggregateSlice, aggregate_reduction),
    PlanKind.WINDOWED_AGGREGATE: WorkerKind(WindowedAggregationTask, WindowSlice, windowed_reduction),
    PlanKind.SESSION_AGGREGATE: WorkerKind(SessionAggregationTask, SessionSlice, sessions_reduction),
    PlanKind.PROJECT: WorkerKind(ProjectionTask, ProjectSlice, project_reduction),
    PlanKind.MATERIALIZE: WorkerKind(TableTask, MaterializeSlice, materialize_reduction),
    PlanKind.STREAM_TABLE_JOIN: WorkerKind(JoinTask, JoinSlice, join_reduction),
    PlanKind.TABLE_TABLE_JOIN: WorkerKind(TableJoinTask, KeyedSlice, keyed_reduction),
    PlanKind.FOREIGN_KEY_JOIN: WorkerKind(ForeignKeyJoinTask, KeyedSlice, keyed_reduction),
    PlanKind.STREAM_STREAM_JOIN: WorkerKind(StreamJoinTask, KeyedSlice, keyed_reduction),
    PlanKind.JOIN_SIDE: WorkerKind(JoinSideTask, KeyedSlice, keyed_reduction),
    PlanKind.REGROUP: WorkerKind(RegroupTask, RegroupSlice, project_reduction),
}
"""Every plan kind's task, slice and reducer, one row per kind."""


def new_task(settings: WorkerSettings, stage: Stage, partition: int) -> Task[Any]:
    """The task of ``stage`` for input partition ``partition``: its kind's, or, for a table
    whose standby copies replay its topic, one that applies a kept store's tail the same way
    at start (``ReplayedTableTask``)."""
    task = ReplayedTableTask if stage.replayed else WORKER_KINDS[stage.query.plan.kind].task
    return task(settings, stage.query, stage.source, stage.sink, partition, stage.name)
