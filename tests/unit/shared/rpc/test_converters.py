"""The shared proto <-> domain conversions round-trip, and the common StoreLag is
wire-compatible with the coordinator's (a router decodes either)."""

from __future__ import annotations

from millpond.common.v1 import rows_pb2, status_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.shared.kafka.serde import add_values, from_proto, to_proto
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import (
    heartbeat_reports,
    heartbeat_tasks,
    outcome_from_proto,
    outcome_to_proto,
    store_lag_from_proto,
    store_lag_to_common,
    store_lag_to_proto,
    task_report_from_proto,
    task_report_to_proto,
)
from millpond.shared.task_status import FAILED, RESTORING, RUNNING, STARTING, STOPPING, StoreLag, TaskReport


def test_task_reports_round_trip_in_every_state() -> None:
    for state in (STARTING, RESTORING, RUNNING, FAILED, STOPPING):
        report = TaskReport("Q", 3, state, "w1", "boom", 2, 10, 40, 7, 5)
        assert task_report_from_proto("w1", task_report_to_proto(report)) == report


def test_a_heartbeat_carries_stopping_tasks_apart_where_an_earlier_coordinator_does_not_read_them() -> None:
    running, stopping = TaskReport("Q", 0, RUNNING, "w1", input_offset=7), TaskReport("Q", 1, STOPPING, "w1", input_offset=9)
    beat = coordinator_pb2.HeartbeatRequest(worker_id="w1", **heartbeat_tasks((running, stopping)))
    # What a coordinator that knows no stopping_tasks reads: the running task alone.
    assert [(t.task.partition, t.state) for t in beat.tasks] == [(0, coordinator_pb2.TASK_STATE_RUNNING)]
    assert heartbeat_reports(beat) == [running, stopping]
    # A worker of the version before the field sent its stopping tasks among the others.
    before = coordinator_pb2.HeartbeatRequest(worker_id="w1", tasks=[task_report_to_proto(stopping)])
    assert heartbeat_reports(before) == [stopping]
    # Whatever state a stopping task carries, it is stopping.
    odd = coordinator_pb2.HeartbeatRequest(worker_id="w1", stopping_tasks=[task_report_to_proto(running)])
    assert [r.state for r in heartbeat_reports(odd)] == [STOPPING]


def test_store_lags_round_trip_through_both_messages_which_share_a_wire_format() -> None:
    lag = StoreLag("Q", 1, False, 40, 50, 1_700_000_000_000, input_offset=60)
    assert store_lag_from_proto(store_lag_to_proto(lag)) == lag
    assert store_lag_from_proto(store_lag_to_common(lag)) == lag
    assert store_lag_to_proto(lag).lag == store_lag_to_common(lag).lag == 10
    as_common = status_pb2.StoreLag.FromString(store_lag_to_proto(lag).SerializeToString())
    assert store_lag_from_proto(as_common) == lag
    assert coordinator_pb2.StoreLag.FromString(store_lag_to_common(lag).SerializeToString()) == store_lag_to_proto(lag)


def test_outcomes_round_trip() -> None:
    outcome = Outcome("SELECT 1;", "", "", [("ID", "VARCHAR"), ("N", "BIGINT")], [["a", 1], [None, 2]], 2, 9, "v1.x")
    assert outcome_from_proto(outcome_to_proto(outcome)) == outcome


def test_a_lag_reported_with_extreme_offsets_still_fits_the_cluster_status() -> None:
    # A beat's offsets are whatever the sender put there: their difference once overflowed the
    # int64 of the cluster status, and every GetClusterStatus after it failed with INTERNAL.
    for current, end in ((-1, 2**63 - 1), (-(2**63), 2**63 - 1), (2**63 - 1, -(2**63))):
        beat = coordinator_pb2.StoreLag(task=coordinator_pb2.TaskId(query_id="Q"), current_offset=current,
                                        end_offset=end)
        lag = store_lag_from_proto(beat)
        assert 0 <= store_lag_to_proto(lag).lag == lag.lag <= 2**63 - 1
        assert store_lag_to_common(lag).lag == lag.lag


def test_values_added_in_place_are_the_messages_to_proto_makes() -> None:
    values = [None, True, False, 0, -7, 2**62, 1.5, float("inf"), "", "café", b"\x00\xff", [1, "a"], {"k": None}]
    row = rows_pb2.Row()
    add_values(row.values, values)
    assert list(row.values) == [to_proto(v) for v in values]
    assert [from_proto(v) for v in row.values] == values
