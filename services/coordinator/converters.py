"""Protobuf forms of the coordinator's domain values (the assignment, the hosts' status);
the shared ones (task reports, lags, outcomes) are in ``millpond.shared.rpc.converters``."""

from __future__ import annotations

from collections.abc import Iterable

from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.coordinator.assignor import Task, WorkerTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.leadership import ElectionState, ElectionStatus
from millpond.shared.rpc.converters import store_lag_to_proto, task_report_to_proto


def task_ids(tasks: Iterable[Task]) -> list[coordinator_pb2.TaskId]:
    """Tasks as protobuf ``TaskId`` messages."""
    return [coordinator_pb2.TaskId(query_id=t.query_id, partition=t.partition) for t in tasks]


def assignment_to_proto(cluster: Cluster) -> coordinator_pb2.Assignment:
    """The cluster's assignment as protobuf (members only)."""
    members = cluster.membership.members
    return coordinator_pb2.Assignment(
        generation=cluster.generation,
        workers=[
            coordinator_pb2.WorkerAssignment(
                worker_id=worker_id, endpoint=members[worker_id].endpoint,
                active_tasks=task_ids(tasks.active), standby_tasks=task_ids(tasks.standby),
                warmup_tasks=task_ids(tasks.warmup))
            for worker_id, tasks in cluster.assignment.workers.items() if worker_id in members
        ],
    )


def host_statuses(cluster: Cluster) -> list[coordinator_pb2.HostStatus]:
    """Every known worker, alive or recently gone, for the cluster status."""
    hosts = []
    for worker_id, view in sorted(cluster.views.items()):
        tasks = cluster.assignment.tasks_of(worker_id) if view.alive else WorkerTasks()
        hosts.append(coordinator_pb2.HostStatus(
            worker_id=worker_id, endpoint=view.endpoint, alive=view.alive, last_status_update_ms=view.last_seen_ms,
            active_tasks=task_ids(tasks.active), standby_tasks=task_ids(tasks.standby),
            warmup_tasks=task_ids(tasks.warmup), lags=[store_lag_to_proto(lag) for lag in view.lags],
            tasks=[task_report_to_proto(r) for r in view.reports]))
    return hosts


_ELECTION_STATES = {
    ElectionState.FOLLOWING: coordinator_pb2.ELECTION_STATE_FOLLOWING,
    ElectionState.ELECTING: coordinator_pb2.ELECTION_STATE_ELECTING,
    ElectionState.LEADING: coordinator_pb2.ELECTION_STATE_LEADING,
}


def with_election(response: coordinator_pb2.GetClusterStatusResponse,
                  election: ElectionStatus) -> coordinator_pb2.GetClusterStatusResponse:
    """The status ``response`` with where this coordinator's election stands."""
    response.election = _ELECTION_STATES[election.state]
    response.failed_claims = election.failed_claims
    response.last_claim_error = election.last_error
    return response
