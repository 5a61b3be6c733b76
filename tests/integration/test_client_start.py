"""A Kafka client whose start is cancelled leaves no connection open: aiokafka's bootstrap
closes the connection it opened only when it ends, so a cancel that lands in it left that
socket to the garbage collector (an "Unclosed AIOKafkaConnection" warning; in a test run, a
CPython 3.11.7 parser error when that warning fired inside an import)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
from aiokafka import AIOKafkaProducer

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.shared.kafka.connection import started
from millpond.shared.teardown import outlast_for

pytestmark = pytest.mark.kafka


async def test_a_start_cancelled_at_any_point_leaves_no_connection_open(kafka: EmbeddedKafka) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for step in range(100):
            async def enter() -> None:
                async with started(AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)):
                    await asyncio.sleep(10)

            job = asyncio.create_task(enter())
            await asyncio.sleep(step * 0.0001)  # a start takes about 5 ms here: cancelled at each of its awaits
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job
            del job
            gc.collect()
    assert [str(w.message) for w in caught if "Unclosed" in str(w.message)] == []


async def test_a_start_let_end_after_a_cancel_is_cancelled_past_its_bound_whatever_cancels_come() -> None:
    """``outlast_for`` waits for the job, cancels it past its bound, and waits for it to unwind
    even when more cancels come meanwhile: the caller's cancel is what it raises, never an
    InvalidStateError from a job read before it ended."""
    async def slow_to_unwind() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.shield(asyncio.sleep(0.3))

    job = asyncio.ensure_future(slow_to_unwind())

    async def caller() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await outlast_for(job, 0.2)
            raise

    waiting = asyncio.create_task(caller())
    await asyncio.sleep(0.05)
    waiting.cancel()
    await asyncio.sleep(0.3)  # past the bound: the job is cancelled and unwinding
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert job.done()
