"""Which workers are alive, judged by heartbeats against an injected clock.

A worker whose heartbeats stop for ``session_timeout`` seconds becomes a *suspect*, and so
does one whose beat stream broke (its process died: the kernel closed its connection); the
coordinator then asks the worker's own gRPC health endpoint, and counts an answer as a beat
(``vouch``), before it declares it dead. A killed process refuses the connection at once, so
detection costs about the window; a worker whose beats were only delayed (a busy machine)
still answers, and keeps its tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Member:
    """A worker as the coordinator sees it."""

    worker_id: str
    endpoint: str
    last_heartbeat: float
    """When its last heartbeat arrived, or its health check answered for it (the membership's clock)."""
    last_beat: float = 0.0
    """When its last heartbeat itself arrived."""
    disconnected: bool = False
    """Its beat stream broke since its last heartbeat: a suspect however recent that beat."""


class Membership:
    """Tracks heartbeats; a worker silent for ``session_timeout`` seconds is a suspect."""

    def __init__(self, session_timeout: float, clock: Callable[[], float] = time.monotonic):
        self.session_timeout = session_timeout
        self.clock = clock
        self.members: dict[str, Member] = {}

    def beat(self, worker_id: str, endpoint: str) -> bool:
        """Record a heartbeat; True when this changes membership (a new member or endpoint)."""
        member = self.members.get(worker_id)
        now = self.clock()
        self.members[worker_id] = Member(worker_id, endpoint, now, now)
        return member is None or member.endpoint != endpoint

    def suspects(self) -> list[Member]:
        """Members whose heartbeats stopped for longer than the session timeout, or whose beat
        stream broke."""
        now = self.clock()
        return [m for m in self.members.values() if m.disconnected or now - m.last_heartbeat > self.session_timeout]

    def disconnected(self, worker_id: str) -> None:
        """The worker's beat stream broke (not ended by the worker): probe it now rather than
        after the session timeout."""
        member = self.members.get(worker_id)
        if member is not None:
            member.disconnected = True

    def remove(self, worker_id: str) -> bool:
        """Drop a member (it left, or it was confirmed dead); True if it was one."""
        return self.members.pop(worker_id, None) is not None

    def vouch(self, worker_id: str) -> None:
        """A suspect answered its health check: count that as a heartbeat."""
        member = self.members.get(worker_id)
        if member is not None:
            member.last_heartbeat, member.disconnected = self.clock(), False
