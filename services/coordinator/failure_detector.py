"""Failure detection: a worker silent for the session timeout is probed and removed if its
process is gone, or once its silence passes the hard limit; a busy worker whose beats were
late keeps its tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.membership import Member
from millpond.shared import metrics
from millpond.shared.events import wait_at_most
from millpond.shared.rpc.tls import ChannelFactory

log = logging.getLogger(__name__)


ANSWERED_LIMIT_FACTOR = 10
"""A worker whose health endpoint answers but that sends no heartbeat for this many hard limits
(30 s by default) is dead: whatever answers there now (a process that took its address, one
whose beats cannot reach this coordinator) is not running its tasks for the cluster."""


class FailureDetector:
    """Probes silent workers' health endpoints and removes the dead ones from the cluster."""

    def __init__(self, cluster: Cluster, channels: ChannelFactory, probe_timeout: float, hard_limit: float,
                 on_dead: Callable[[], None]):
        self.cluster = cluster
        self.channels = channels
        self.probe_timeout = probe_timeout
        """Seconds a health check may take."""
        self.hard_limit = hard_limit
        """Seconds of silence after which a worker that does not answer is dead."""
        self.answered_limit = ANSWERED_LIMIT_FACTOR * hard_limit
        """Seconds without a heartbeat after which a worker is dead even if its endpoint answers."""
        self.on_dead = on_dead
        """Called once after removing one or more dead workers (reassigns their tasks)."""
        self._probes: dict[str, grpc.aio.Channel] = {}

    async def _alive(self, member: Member) -> bool | None:
        """Ask a silent worker's health endpoint: True if it answers (NOT_SERVING included: a
        worker that is starting answers so, one that is stopping leaves by itself), False if
        nothing listens any more (a killed process refuses at once), None if it did not answer
        in time (hung, or starved of CPU: only a long silence makes that one dead)."""
        channel = self._probes.get(member.endpoint)
        if channel is None:
            channel = self._probes[member.endpoint] = self.channels.open(member.endpoint)
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=self.probe_timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            return True if err.code() == grpc.StatusCode.NOT_FOUND else None  # NOT_FOUND: it answered
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Check the suspects every 50 ms until ``stop``; refresh the membership gauges."""
        membership = self.cluster.membership
        while not stop.is_set():
            suspects = membership.suspects()
            if suspects:
                verdicts = await asyncio.gather(*(self._alive(m) for m in suspects))
                dead = []
                for member, alive in zip(suspects, verdicts, strict=True):
                    if membership.members.get(member.worker_id) is not member:
                        continue  # it beat (or left) during the probe: judged on that
                    now = membership.clock()
                    silence = now - member.last_heartbeat
                    metrics.VERDICTS.labels({True: "answered", False: "refused", None: "silent"}[alive]).inc()
                    if alive and now - member.last_beat > self.answered_limit:
                        # Something answers at its endpoint, but it has not beaten for long: maybe
                        # another process there now. Its tasks move (its commits would be fenced).
                        alive = False
                    if alive:
                        membership.vouch(member.worker_id)
                    elif (alive is False or silence > self.hard_limit) and self.cluster.remove(member.worker_id):
                        dead.append(member.worker_id)
                        channel = self._probes.pop(member.endpoint, None)
                        if channel is not None:
                            await channel.close()
                if dead:
                    log.warning("workers dead", extra={"workers": dead})
                    self.on_dead()
            endpoints = {m.endpoint for m in membership.members.values()}
            for endpoint in [e for e in self._probes if e not in endpoints]:  # left, or moved to another endpoint
                await self._probes.pop(endpoint).close()
            now = membership.clock()
            metrics.MEMBERS.set(len(membership.members))
            metrics.HEARTBEAT_AGE.clear()
            for member in membership.members.values():
                metrics.HEARTBEAT_AGE.labels(member.worker_id).set(now - member.last_heartbeat)
            await wait_at_most(stop, 0.05)

    async def close(self) -> None:
        """Close the probe channels."""
        for channel in self._probes.values():
            await channel.close()
