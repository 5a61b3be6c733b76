"""Protobuf <-> domain conversions of the types more than one service's contract carries:
task reports, store lags and statement outcomes. The domain modules (``task_status``,
``results``) stay free of protobuf; the servicers and the clients convert here."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

from millpond.common.v1 import rows_pb2, status_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.shared.kafka.serde import add_values, from_proto
from millpond.shared.results import Outcome
from millpond.shared.task_status import FAILED, RESTORING, RUNNING, STARTING, STOPPING, StoreLag, TaskReport

_TASK_STATE_TO_PROTO = {
    STARTING: coordinator_pb2.TASK_STATE_STARTING,
    RESTORING: coordinator_pb2.TASK_STATE_RESTORING,
    RUNNING: coordinator_pb2.TASK_STATE_RUNNING,
    FAILED: coordinator_pb2.TASK_STATE_FAILED,
    STOPPING: coordinator_pb2.TASK_STATE_STOPPING,
}
_TASK_STATE_FROM_PROTO = {v: k for k, v in _TASK_STATE_TO_PROTO.items()}


def task_report_to_proto(report: TaskReport) -> coordinator_pb2.TaskStatus:
    """A task report as sent in a heartbeat."""
    return coordinator_pb2.TaskStatus(
        task=coordinator_pb2.TaskId(query_id=report.query_id, partition=report.partition),
        state=_TASK_STATE_TO_PROTO[report.state], reason=report.reason, failures=report.failures,
        restored_records=report.restored_records, records_to_restore=report.records_to_restore,
        input_offset=report.input_offset, start_input_offset=report.start_input_offset, worker_id=report.worker_id,
    )


def task_report_from_proto(worker_id: str, status: coordinator_pb2.TaskStatus) -> TaskReport:
    """A task report from a heartbeat of ``worker_id``."""
    return TaskReport(
        query_id=status.task.query_id, partition=status.task.partition, worker_id=worker_id,
        state=_TASK_STATE_FROM_PROTO.get(status.state, STARTING), reason=status.reason, failures=status.failures,
        restored_records=status.restored_records, records_to_restore=status.records_to_restore,
        input_offset=status.input_offset, start_input_offset=status.start_input_offset,
    )


def heartbeat_tasks(reports: Sequence[TaskReport]) -> dict[str, list[coordinator_pb2.TaskStatus]]:
    """A heartbeat's task fields: ``tasks`` and, apart, ``stopping_tasks`` (see the message)."""
    return {"tasks": [task_report_to_proto(r) for r in reports if r.state != STOPPING],
            "stopping_tasks": [task_report_to_proto(r) for r in reports if r.state == STOPPING]}


def heartbeat_reports(beat: coordinator_pb2.HeartbeatRequest) -> list[TaskReport]:
    """The task reports of a heartbeat: its ``tasks``, and its ``stopping_tasks`` as STOPPING
    (a worker of the version before that field reported those in ``tasks``)."""
    return ([task_report_from_proto(beat.worker_id, t) for t in beat.tasks]
            + [replace(task_report_from_proto(beat.worker_id, t), state=STOPPING) for t in beat.stopping_tasks])


def store_lag_to_proto(lag: StoreLag) -> coordinator_pb2.StoreLag:
    """A store lag as a heartbeat to a coordinator (and the cluster status) carries it."""
    return coordinator_pb2.StoreLag(
        task=coordinator_pb2.TaskId(query_id=lag.query_id, partition=lag.partition), active=lag.active,
        current_offset=lag.current_offset, end_offset=lag.end_offset, lag=lag.lag,
        last_applied_ms=lag.last_applied_ms, input_offset=lag.input_offset)


def store_lag_to_common(lag: StoreLag) -> status_pb2.StoreLag:
    """A store lag as a worker's status report to a router carries it."""
    return status_pb2.StoreLag(
        task=status_pb2.TaskId(query_id=lag.query_id, partition=lag.partition), active=lag.active,
        current_offset=lag.current_offset, end_offset=lag.end_offset, lag=lag.lag,
        last_applied_ms=lag.last_applied_ms, input_offset=lag.input_offset)


def store_lag_from_proto(lag: coordinator_pb2.StoreLag | status_pb2.StoreLag) -> StoreLag:
    """A store lag from a heartbeat or a status report (the two messages have the same fields)."""
    return StoreLag(lag.task.query_id, lag.task.partition, lag.active, lag.current_offset, lag.end_offset,
                    lag.last_applied_ms, lag.input_offset)


@functools.lru_cache(maxsize=1024)
def _columns(columns: tuple[tuple[str, str], ...]) -> bytes:
    """A serialized ``StatementResult`` of these columns alone: a pull's columns repeat from
    one request to the next, and merging them in costs less than making them."""
    return bytes(rows_pb2.StatementResult(columns=[rows_pb2.Column(name=n, type=t) for n, t in columns])
                 .SerializeToString())


def outcome_to_proto(outcome: Outcome, into: rows_pb2.StatementResult | None = None) -> rows_pb2.StatementResult:
    """A statement's outcome as the protobuf ``StatementResult`` (written into ``into``, an
    empty one, when given: a response's own, so its rows are not copied again)."""
    result = rows_pb2.StatementResult() if into is None else into
    result.statement_text = outcome.statement
    result.status = outcome.status
    result.message = outcome.message
    if outcome.columns:
        result.MergeFromString(_columns(tuple(outcome.columns)))
    for row in outcome.rows:
        add_values(result.rows.add().values, row)
    for rows in outcome.encoded_rows:
        result.MergeFromString(rows)
    result.partition = outcome.partition
    result.offset = outcome.offset
    result.consistency_token = outcome.consistency_token
    return result


def outcome_from_proto(result: rows_pb2.StatementResult) -> Outcome:
    """Inverse of ``outcome_to_proto``."""
    return Outcome(
        statement=result.statement_text,
        message=result.message,
        status=result.status,
        columns=[(c.name, c.type) for c in result.columns],
        rows=[[from_proto(v) for v in row.values] for row in result.rows],
        partition=result.partition,
        offset=result.offset,
        consistency_token=result.consistency_token,
    )


def coordinator_role(status: coordinator_pb2.GetClusterStatusResponse) -> str:
    """What a coordinator's status reply says of its part in the election, for messages:
    ``leader``, ``follower`` or ``electing`` with its failed claims (no leader meanwhile)."""
    if status.leader:
        return "leader"
    if status.election == coordinator_pb2.ELECTION_STATE_ELECTING:
        failed = f"{status.failed_claims} claims failed, the last: {status.last_claim_error}" if status.failed_claims \
            else "claiming now"
        return f"electing, without a leader until its claim is written ({failed})"
    return "follower"
