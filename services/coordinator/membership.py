"""Which workers are alive, judged by heartbeats against an injected clock."""

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


class Membership:
    """Tracks heartbeats; a worker silent for ``session_timeout`` seconds is gone."""

    def __init__(self, session_timeout: float, clock: Callable[[], float] = time.monotonic):
        self.session_timeout = session_timeout
        self.clock = clock
        self.members: dict[str, Member] = {}

    def beat(self, worker_id: str, endpoint: str) -> bool:
        """Record a heartbeat; True when this changes membership (a new member or endpoint)."""
        member = self.members.get(worker_id)
        changed = member is None or member.endpoint != endpoint
        self.members[worker_id] = Member(worker_id, endpoint, self.clock())
        return changed

    def expire(self) -> list[str]:
        """Drop members whose heartbeats stopped; returns their ids."""
        now = self.clock()
        gone = [m.worker_id for m in self.members.values() if now - m.last_heartbeat > self.session_timeout]
        for worker_id in gone:
            del self.members[worker_id]
        return gone
