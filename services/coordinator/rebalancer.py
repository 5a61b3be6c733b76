"""When the assignment is recomputed: a worker joins or leaves, a coordinator is elected,
the metastore changes, and periodically so that warm-ups that caught up take their actives."""

from __future__ import annotations

import asyncio
import logging

from millpond.services.coordinator.assignor import QueryTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import stages
from millpond.shared.events import wait_at_most
from millpond.shared.task_status import StoreLag, TaskReport

log = logging.getLogger(__name__)


class Changes:
    """Wakes whoever waits for the assignment to change: a new generation, or this
    coordinator starting or ceasing to lead. On the service's event loop only."""

    def __init__(self) -> None:
        self._next = asyncio.Event()
        self.closed = False
        """Set when the service stops: watchers end their streams."""

    def next(self) -> asyncio.Event:
        """The event the next change sets: take it before reading what it guards, so a change
        in between is not missed."""
        return self._next

    def fire(self) -> None:
        self._next.set()
        self._next = asyncio.Event()

    def close(self) -> None:
        """Wake every watcher for the last time."""
        self.closed = True
        self.fire()


class Rebalancer:
    """Feeds the cluster's membership and reassigns on every event that may change it."""

    def __init__(self, cluster: Cluster, metastore: Metastore, service_id: str):
        self.cluster = cluster
        self.metastore = metastore
        self.service_id = service_id
        self.changes = Changes()
        """Fired at every new generation and leadership change (what routers watch)."""

    def heartbeat(self, worker_id: str, endpoint: str, reports: list[TaskReport], lags: list[StoreLag]) -> None:
        """A worker is alive; a new worker triggers a reassignment."""
        if self.cluster.beat(worker_id, endpoint, reports, lags):
            log.info("worker joined", extra={"worker": worker_id, "endpoint": endpoint})
            self.reassign()

    def disconnected(self, worker_id: str) -> None:
        """A worker's beat stream broke: the failure detector probes it at once."""
        self.cluster.membership.disconnected(worker_id)

    def leave(self, worker_id: str) -> None:
        """A worker is shutting down: hand its tasks over now (to caught-up standbys first)."""
        if self.cluster.remove(worker_id):
            log.info("worker left", extra={"worker": worker_id})
            self.reassign()

    def _queries(self) -> list[QueryTasks]:
        """Every running query's tasks; a query in error (its topic is gone) gets none until fixed."""
        out = []
        for q in self.metastore.queries.values():
            if q.query_id in self.metastore.errors:
                continue
            plan = stages(q, self.metastore.source(q.source), self.metastore.source(q.sink), self.service_id)
            out.append(QueryTasks(q.query_id, max(s.partitions for s in plan), plan[-1].has_standbys,
                                  plan[-1].partitions))
        return out

    def reassign(self) -> None:
        """Recompute the assignment from the live workers, the running queries and the lags."""
        if self.cluster.reassign(self._queries()):
            self.changes.fire()
            a = self.cluster.assignment
            log.info("new assignment", extra={
                "generation": self.cluster.generation,
                "tasks": {w: [len(t.active), len(t.standby), len(t.warmup)] for w, t in a.workers.items()},
                "pending": {f"{t.query_id}/{t.partition}": w for t, w in a.pending.items()}})

    def elected(self, epoch: int) -> None:
        """This coordinator leads from ``epoch`` on."""
        self.cluster.lead(epoch)
        self.changes.fire()
        self.reassign()

    def deposed(self) -> None:
        """Another coordinator leads."""
        self.cluster.follow()
        self.changes.fire()

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """Re-run the assignor with fresh lags every ``interval`` seconds, so warm-ups that
        caught up take their actives."""
        while not stop.is_set():
            await wait_at_most(stop, interval)
            self.reassign()
