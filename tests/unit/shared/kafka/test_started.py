"""``started``: a Kafka client is stopped however its block ends, its start included."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from millpond.shared.kafka.connection import started, stop_client


class FakeClient:
    def __init__(self, start_s: float = 0.0, fail: bool = False, stop_s: float = 0.0):
        self.start_s, self.fail, self.stop_s = start_s, fail, stop_s
        self.stopped = False

    async def start(self) -> None:
        await asyncio.sleep(self.start_s)
        if self.fail:
            raise ConnectionError("no broker")

    async def stop(self) -> None:
        await asyncio.sleep(self.stop_s)
        self.stopped = True


async def test_a_failed_start_is_stopped() -> None:
    client = FakeClient(fail=True)
    with pytest.raises(ConnectionError):
        async with started(client):
            raise AssertionError("the block ran without a started client")
    assert client.stopped


async def test_a_start_cancelled_by_the_callers_deadline_is_stopped() -> None:
    client = FakeClient(start_s=10)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), started(client):
            pass
    assert client.stopped


async def test_a_cancel_does_not_cut_the_stop_short() -> None:
    client = FakeClient(stop_s=0.2)

    async def use() -> None:
        async with started(client):
            await asyncio.sleep(10)

    job = asyncio.create_task(use())
    await asyncio.sleep(0.05)
    job.cancel()
    await asyncio.sleep(0.05)
    job.cancel()  # a second cancel while stopping
    with pytest.raises(asyncio.CancelledError):
        await job
    assert client.stopped


@pytest.mark.parametrize("options", [{}, {"enable_idempotence": True}, {"transactional_id": "t"}])
async def test_a_producer_that_never_began_a_transaction_stops_cleanly(options: dict[str, object]) -> None:
    """``stop_client`` takes a stopped producer's failed futures as seen; an idempotent or
    transactional producer whose first transaction never began has none (nor a waiter yet)."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", **options)  # never started: no broker is asked
    await stop_client(producer)
    await stop_client(AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1"))
