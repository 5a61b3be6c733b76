"""The router's own view of the workers, from their heartbeats: who is alive and how far
each table copy is behind (ksqlDB's HeartbeatAgent and LagReportingAgent, receiving side).

Pure: beats come in as calls, time from an injected clock. A worker the router has never
heard from is *unknown*, not dead, so routing still works when workers do not report here
(for example a router started by hand without the workers knowing it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.router.pull import Replica
from shared.task_status import StoreLag


@dataclass
class HostView:
    """What one worker said last."""

    worker_id: str
    last_beat: float
    lags: dict[tuple[str, int], StoreLag] = field(default_factory=dict)


class HostTable:
    """Heartbeats and lags per worker endpoint."""

    def __init__(self, dead_after: float, clock: Callable[[], float] = time.monotonic):
        self.dead_after = dead_after
        """Seconds without a beat after which a worker counts as dead."""
        self.clock = clock
        self.hosts: dict[str, HostView] = {}

    def beat(self, endpoint: str, worker_id: str, lags: list[StoreLag]) -> None:
        """A worker's heartbeat and lag report."""
        self.hosts[endpoint] = HostView(worker_id, self.clock(), {(lag.query_id, lag.partition): lag for lag in lags})

    def dead(self, endpoint: str) -> bool:
        """True when the worker stopped beating; False while alive or never heard from."""
        view = self.hosts.get(endpoint)
        return view is not None and self.clock() - view.last_beat > self.dead_after

    def lag(self, endpoint: str, query_id: str, partition: int) -> int | None:
        """The reported lag of the worker's copy of the partition, or None when unknown."""
        view = self.hosts.get(endpoint)
        report = view.lags.get((query_id, partition)) if view is not None else None
        return report.lag if report is not None else None

    def order(self, query_id: str, partition: int, replicas: list[Replica]) -> list[Replica]:
        """The replicas to ask, best first: the active, then standbys by smallest reported lag
        (unknown lags last); hosts this router thinks dead go to the end rather than away, so
        a wrong verdict costs time, never an answer."""
        def rank(r: Replica) -> tuple[bool, bool, float]:
            lag = self.lag(r.endpoint, query_id, partition)
            return self.dead(r.endpoint), r.standby, float("inf") if lag is None else lag

        return sorted(replicas, key=rank)
