"""``millpond status``: the cluster as the leading coordinator sees it, through the router
(with the router's own view of each worker) or straight from the coordinators."""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc

from millpond.cli.client import PLAINTEXT
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.shared.errors import UnavailableError
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import coordinator_role
from millpond.shared.rpc.tls import ClientCredentials

COLUMNS = ["WORKER", "ENDPOINT", "ALIVE", "LAST UPDATE", "ACTIVE", "STANDBY", "WARMUP", "MAX LAG", "RESTORING",
           "ROUTER SAYS"]
LAG_COLUMNS = ["WORKER", "QUERY", "PARTITION", "ROLE", "CURRENT OFFSET", "END OFFSET", "LAG", "INPUT OFFSET"]


def router_status(endpoint: str, timeout: float = 10.0,
                  credentials: ClientCredentials = PLAINTEXT) -> router_pb2.GetClusterStatusResponse:
    """The router's cluster status; raises ``grpc.RpcError`` with its status on failure."""
    with credentials.channel(endpoint) as channel:
        reply: router_pb2.GetClusterStatusResponse = router_pb2_grpc.RouterServiceStub(channel).GetClusterStatus(
            router_pb2.GetClusterStatusRequest(), timeout=timeout)
        return reply


def leader_status(coordinators: Iterable[str], timeout: float = 5.0,
                  credentials: ClientCredentials = PLAINTEXT) -> coordinator_pb2.GetClusterStatusResponse:
    """The leading coordinator's answer; UnavailableError naming each coordinator's reply if none leads."""
    replies = []
    for endpoint in coordinators:
        with credentials.channel(endpoint) as channel:
            try:
                reply: coordinator_pb2.GetClusterStatusResponse = coordinator_pb2_grpc.CoordinatorServiceStub(
                    channel).GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=timeout)
            except grpc.RpcError as err:
                replies.append(f"{endpoint}: {err.code().name}")
                continue
        if reply.leader:
            return reply
        replies.append(f"{endpoint}: {coordinator_role(reply)}")
    raise UnavailableError(f"no coordinator leads the cluster ({'; '.join(replies)}); a new leader is elected "
                           "within the leader session timeout")


def _tasks(tasks: Iterable[coordinator_pb2.TaskId]) -> str:
    return " ".join(f"{t.query_id}/{t.partition}" for t in tasks) or "-"


def status_outcome(status: coordinator_pb2.GetClusterStatusResponse, now_ms: int | None = None,
                   router_hosts: Iterable[router_pb2.RouterHostView] = ()) -> Outcome:
    """One row per worker, for the table and JSON renderers; ROUTER SAYS is the router's own
    failure detector's verdict (empty when asked straight from the coordinators)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    seen = {h.endpoint: h for h in router_hosts}
    rows: list[list[object]] = []
    for host in status.hosts:
        view = seen.get(host.endpoint)
        verdict = "" if view is None else (
            f"alive, beat {view.last_beat_age_ms} ms ago" if view.alive else f"dead, silent {view.last_beat_age_ms} ms")
        restoring = [t for t in host.tasks if t.state == coordinator_pb2.TASK_STATE_RESTORING]
        rows.append([
            host.worker_id, host.endpoint, host.alive, f"{max(now - host.last_status_update_ms, 0)} ms ago",
            _tasks(host.active_tasks), _tasks(host.standby_tasks), _tasks(host.warmup_tasks),
            max((lag.lag for lag in host.lags), default=0),
            " ".join(f"{t.task.query_id}/{t.task.partition} {t.restored_records}/{t.records_to_restore}"
                     for t in restoring) or "-",
            verdict,
        ])
    return Outcome("status", message=f"leader {status.coordinator_id}, generation {status.generation}",
                   columns=[(c, "VARCHAR") for c in COLUMNS], rows=rows)


def lag_outcome(status: coordinator_pb2.GetClusterStatusResponse) -> Outcome:
    """One row per table copy (store partition): its changelog position, end and lag."""
    rows: list[list[object]] = [
        [host.worker_id, lag.task.query_id, lag.task.partition, "active" if lag.active else "standby",
         lag.current_offset, lag.end_offset, lag.lag, lag.input_offset]
        for host in status.hosts if host.alive
        for lag in sorted(host.lags, key=lambda lag: (lag.task.query_id, lag.task.partition, not lag.active))]
    return Outcome("lags", message="store partitions", columns=[(c, "VARCHAR") for c in LAG_COLUMNS], rows=rows)
