"""The leader claim, with a fake producer (no Kafka): it is retried until it wins or the
partition is revoked, never given up, and the election's state is there for status."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import wait_fixed

from millpond.services.coordinator.leadership import ElectionState, Leadership
from millpond.shared.kafka.connection import KafkaConnection


@dataclass
class Metadata:
    offset: int


class Fakes:
    """A producer that fails the first ``failures`` appends, then writes at offsets 40, 41,
    ... (epochs 41, 42, ...), and the election's callbacks; ``until`` waits on either."""

    def __init__(self, failures: int, hang: bool = False):
        self.failures = failures
        self.hang = hang
        self.calls = 0
        self.elected: list[int] = []
        self.deposed = 0
        self.changed = asyncio.Condition()

    async def send_and_wait(self, topic: str, value: bytes, *, partition: int) -> Metadata:
        async with self.changed:
            self.calls += 1
            self.changed.notify_all()
        if self.calls <= self.failures:
            if self.hang:
                await asyncio.sleep(3600)
            raise ConnectionError(f"broker unreachable ({self.calls})")
        return Metadata(39 + self.calls - self.failures)

    def on_elected(self, epoch: int) -> None:
        self.elected.append(epoch)
        asyncio.get_running_loop().create_task(self._notify())

    def on_deposed(self) -> None:
        self.deposed += 1

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(condition)

    def leadership(self, claim_timeout: float = 5.0) -> Leadership:
        return Leadership(KafkaConnection("unused:9092"), "leader", "group", "coord-1", 6000, self.on_elected,
                          self.on_deposed, claim_wait=wait_fixed(0.001), claim_timeout=claim_timeout)


async def test_a_claim_that_fails_15_times_then_succeeds_ends_with_a_leader() -> None:
    fakes = Fakes(failures=15)
    leadership = fakes.leadership()
    leadership.assigned(fakes)
    await fakes.until(lambda: bool(fakes.elected))
    assert fakes.calls == 16 and fakes.elected == [41] and leadership.epoch == 41
    assert leadership.status.state is ElectionState.LEADING


async def test_a_claim_that_hangs_is_bounded_and_tried_again() -> None:
    fakes = Fakes(failures=2, hang=True)
    leadership = fakes.leadership(claim_timeout=0.01)
    leadership.assigned(fakes)
    await fakes.until(lambda: bool(fakes.elected))
    assert fakes.elected == [41] and fakes.calls == 3


async def test_status_shows_a_coordinator_electing_without_a_leader() -> None:
    fakes = Fakes(failures=10**9)
    leadership = fakes.leadership()
    leadership.assigned(fakes)
    await fakes.until(lambda: fakes.calls >= 4)
    status = leadership.status
    assert status.state is ElectionState.ELECTING and leadership.epoch == 0 and status.failed_claims >= 3
    assert status.last_error.startswith("ConnectionError: broker unreachable")
    await leadership.revoked()


async def test_a_revoke_during_the_retries_stops_them() -> None:
    fakes = Fakes(failures=10**9)
    leadership = fakes.leadership()
    leadership.assigned(fakes)
    await fakes.until(lambda: fakes.calls >= 5)
    await leadership.revoked()
    calls = fakes.calls
    await asyncio.sleep(0.05)
    assert fakes.calls == calls and not fakes.elected and not fakes.deposed
    assert leadership.status.state is ElectionState.FOLLOWING and leadership.status.failed_claims == 0


async def test_a_leader_revoked_is_deposed_and_claims_again_when_reassigned() -> None:
    fakes = Fakes(failures=0)
    leadership = fakes.leadership()
    leadership.assigned(fakes)
    await fakes.until(lambda: bool(fakes.elected))
    await leadership.revoked()
    assert fakes.deposed == 1 and leadership.epoch == 0
    leadership.assigned(fakes)
    await fakes.until(lambda: len(fakes.elected) == 2)
    assert fakes.elected == [41, 42]
