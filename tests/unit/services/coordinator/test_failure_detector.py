"""The failure detector's verdicts against an injected clock (the health checks faked): a worker
whose endpoint answers but that sends no heartbeat for long is dead all the same; a worker that
beats while it is being probed is judged on that beat; probe channels of endpoints no member
has any more are closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from millpond.services.coordinator import failure_detector
from millpond.services.coordinator.assignor import AssignorConfig
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.failure_detector import FailureDetector
from millpond.services.coordinator.membership import Member


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Channel:
    closed = False

    async def close(self) -> None:
        self.closed = True


class Channels:
    def __init__(self) -> None:
        self.opened: dict[str, Channel] = {}

    def open(self, endpoint: str) -> Channel:
        channel = self.opened[endpoint] = Channel()
        return channel


async def detect(detector: FailureDetector, rounds: float = 0.2) -> None:
    stop = asyncio.Event()
    running = asyncio.ensure_future(detector.run(stop))
    await asyncio.sleep(rounds)
    stop.set()
    await running


def setup(monkeypatch: pytest.MonkeyPatch, verdict: Any) -> tuple[Clock, Cluster, FailureDetector, list[int]]:
    clock = Clock()
    cluster = Cluster(0.2, AssignorConfig(), clock=clock, wall_ms=lambda: int(clock.now * 1000))
    dead: list[int] = []
    detector = FailureDetector(cluster, Channels(), 1.0, 3.0, lambda: dead.append(1))  # type: ignore[arg-type]

    async def alive(self: FailureDetector, member: Member) -> bool | None:
        self._probes.setdefault(member.endpoint, self.channels.open(member.endpoint))
        return await verdict(member)

    monkeypatch.setattr(FailureDetector, "_alive", alive)
    return clock, cluster, detector, dead


async def test_an_endpoint_that_answers_keeps_a_silent_worker_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    async def answers(member: Member) -> bool:
        return True

    clock, cluster, detector, dead = setup(monkeypatch, answers)
    cluster.beat("ghost", "h:1", [], [])
    clock.now += 10.0  # silent, but something answers at its endpoint: vouched for
    await detect(detector)
    assert "ghost" in cluster.membership.members and not dead
    clock.now += failure_detector.ANSWERED_LIMIT_FACTOR * 3.0  # no beat for longer than the limit
    await detect(detector)
    assert "ghost" not in cluster.membership.members and dead


async def test_a_worker_that_beats_while_it_is_probed_is_judged_on_that_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused_after_a_beat(member: Member) -> bool:
        cluster.beat(member.worker_id, member.endpoint, [], [])  # its beat arrives meanwhile
        return False  # (the probe's connection was refused: a restart in between, say)

    clock, cluster, detector, dead = setup(monkeypatch, refused_after_a_beat)
    cluster.beat("w1", "h:1", [], [])
    clock.now += 1.0
    await detect(detector, rounds=0.01)
    assert "w1" in cluster.membership.members and not dead


async def test_probe_channels_of_endpoints_no_member_has_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def answers(member: Member) -> bool:
        return True

    clock, cluster, detector, _ = setup(monkeypatch, answers)
    cluster.beat("w1", "h:1", [], [])
    clock.now += 1.0
    await detect(detector, rounds=0.05)
    channel = detector._probes["h:1"]
    cluster.beat("w1", "h:2", [], [])  # restarted elsewhere
    await detect(detector, rounds=0.1)
    assert channel.closed and "h:1" not in detector._probes  # type: ignore[attr-defined]
