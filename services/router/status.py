"""The cluster status as a router answers it: the leading coordinator's view with the
router's own view of the workers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from millpond.coordinator.v1 import coordinator_pb2
from millpond.router.v1 import router_pb2
from millpond.services.router.converters import router_host_views
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.shared.errors import UnavailableError
from millpond.shared.rpc.converters import coordinator_role


class ClusterStatus:
    """Asks every coordinator for its status and keeps the leader's."""

    def __init__(self, coordinators: Coordinators, hosts: HostTable, push_queries: Callable[[], int],
                 timeout: float):
        self.coordinators = coordinators
        self.hosts = hosts
        self.push_queries = push_queries
        """How many push queries this router streams now."""
        self.timeout = timeout

    async def get(self) -> router_pb2.GetClusterStatusResponse:
        """The leading coordinator's cluster status with this router's view of the workers."""
        answers = await asyncio.gather(*(
            c.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=self.timeout)
            for c in self.coordinators.stubs), return_exceptions=True)
        leader = next((a for a in answers if isinstance(a, coordinator_pb2.GetClusterStatusResponse) and a.leader),
                      None)
        if leader is None:
            replies = "; ".join(f"{e}: {_role(a)}" for e, a in zip(self.coordinators.endpoints, answers, strict=True))
            raise UnavailableError(f"no coordinator leads the cluster ({replies}); a new leader is elected within "
                                   "the leader session timeout")
        return router_pb2.GetClusterStatusResponse(
            cluster=leader, push_queries=self.push_queries(), router_hosts=router_host_views(self.hosts))


def _role(answer: coordinator_pb2.GetClusterStatusResponse | BaseException) -> str:
    if isinstance(answer, coordinator_pb2.GetClusterStatusResponse):
        return coordinator_role(answer)
    return answer.code().name if isinstance(answer, grpc.aio.AioRpcError) else type(answer).__name__
