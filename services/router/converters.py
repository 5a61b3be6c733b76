"""Protobuf <-> domain conversions at the router's boundaries: the assignment it routes by,
its view of the workers, and push-query messages (outcomes and lags:
``millpond.shared.rpc.converters``)."""

from __future__ import annotations

from typing import Any

from millpond.common.v1 import rows_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.router.v1 import router_pb2
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull import Replica, Replicas
from millpond.services.router.push import PushHeader
from millpond.shared.kafka.serde import to_proto


def replicas_from_assignment(assignment: coordinator_pb2.Assignment) -> dict[str, Replicas]:
    """Per query and partition, the workers holding a copy: the active, then the standbys."""
    out: dict[str, Replicas] = {}
    for worker in assignment.workers:
        for task in worker.active_tasks:
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).insert(0, Replica(worker.endpoint, False))
        for task in worker.standby_tasks:
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).append(Replica(worker.endpoint, True))
    return out


def router_host_views(hosts: HostTable) -> list[router_pb2.RouterHostView]:
    """This router's view of each worker that beats it, by endpoint."""
    now = hosts.clock()
    return [router_pb2.RouterHostView(endpoint=e, worker_id=v.worker_id, alive=not hosts.dead(e),
                                      last_beat_age_ms=int((now - v.last_beat) * 1000))
            for e, v in sorted(hosts.hosts.items())]


def push_message(item: PushHeader | list[Any]) -> router_pb2.StreamQueryResponse:
    """A push query's header or one of its rows as a ``StreamQueryResponse``."""
    if isinstance(item, PushHeader):
        return router_pb2.StreamQueryResponse(header=router_pb2.StreamHeader(
            query_id=item.query_id, columns=[rows_pb2.Column(name=n, type=t) for n, t in item.columns]))
    return router_pb2.StreamQueryResponse(row=rows_pb2.Row(values=[to_proto(v) for v in item]))
