"""``CommandReader.end_offset``: callers who come while an end-offset request is out share the
next one, never an answer to a request sent before they came."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.kafka.command_log import Command, CommandReader
from millpond.shared.kafka.connection import KafkaConnection


class FakeEnds:
    """The end-offsets client: each request answers when the test releases it, with the
    topic's end as it was when the request was sent; requests are counted as they are sent."""

    def __init__(self) -> None:
        self.end = 10
        self.sent = 0
        self.released: list[asyncio.Event] = []

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.sent += 1
        end, release = self.end, asyncio.Event()
        self.released.append(release)
        await release.wait()
        return {partitions[0]: end}

    async def stop(self) -> None:
        pass


@pytest.fixture
async def reader() -> AsyncIterator[tuple[CommandReader, FakeEnds]]:
    command_reader = CommandReader(KafkaConnection("unused:9092"), "commands", Metastore())
    ends = FakeEnds()
    await command_reader._ends.stop()  # (never started) replaced by the fake
    command_reader._ends = ends  # type: ignore[assignment]
    yield command_reader, ends
    await command_reader.stop()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_during_a_request_share_the_next_one_sent_after_it(reader: tuple[CommandReader, FakeEnds]) -> None:
    command_reader, ends = reader
    first = asyncio.ensure_future(command_reader.end_offset())
    await settle()
    assert ends.sent == 1
    ends.end = 12  # a command committed after the first request went out
    later = [asyncio.ensure_future(command_reader.end_offset()) for _ in range(5)]
    await settle()
    assert ends.sent == 1, "a caller who came while a request was out sent one of its own"
    ends.released[0].set()
    assert await first == 10
    await settle()
    assert ends.sent == 2, "the callers who waited did not get a request of their own"
    assert not any(call.done() for call in later), "a caller was answered by the request sent before it came"
    ends.released[1].set()
    assert await asyncio.gather(*later) == [12] * 5
    third = asyncio.ensure_future(command_reader.end_offset())
    await settle()
    assert ends.sent == 3, "a caller after every request was answered sent none"
    ends.released[2].set()
    assert await third == 12


async def test_a_caller_that_goes_does_not_cancel_the_request_the_others_wait_for(
        reader: tuple[CommandReader, FakeEnds]) -> None:
    command_reader, ends = reader
    first = asyncio.ensure_future(command_reader.end_offset())
    await settle()
    leaving, staying = (asyncio.ensure_future(command_reader.end_offset()) for _ in range(2))
    await settle()
    leaving.cancel()
    ends.released[0].set()
    assert await first == 10
    await settle()
    assert ends.sent == 2
    ends.released[1].set()
    assert await staying == 10
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_a_failed_request_fails_each_of_its_callers(reader: tuple[CommandReader, FakeEnds]) -> None:
    command_reader, ends = reader

    async def unreachable(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise ConnectionError("no broker")

    ends.end_offsets = unreachable  # type: ignore[method-assign]
    calls = [asyncio.ensure_future(command_reader.end_offset()) for _ in range(3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(result, ConnectionError) for result in results)


class OneCommand:
    """The command topic's consumer: one CREATE STREAM at offset 0, then nothing."""

    def __init__(self) -> None:
        self.given = False

    async def getmany(self, partition: TopicPartition, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        if self.given:
            return {}
        self.given = True
        value = Command("CREATE STREAM s (a INT) WITH (kafka_topic='s', partitions=1, value_format='json')").encode()
        return {partition: [SimpleNamespace(offset=0, value=value)]}

    async def position(self, partition: TopicPartition) -> int:
        return 1 if self.given else 0

    async def stop(self) -> None:
        pass


class SlowAdmin:
    """Lists the topics only when released (never, here)."""

    async def list_topics(self) -> list[str]:
        await asyncio.Event().wait()
        return []

    async def close(self) -> None:
        pass


async def test_a_poll_cancelled_after_it_applied_commands_still_tells_the_listeners(
        reader: tuple[CommandReader, FakeEnds]) -> None:
    """What a poll applied is heard of (a worker's tasks reconcile on it) even when its caller
    is cancelled meanwhile, while it checks the topics (a router's bounded catch-up)."""
    command_reader, _ = reader
    await command_reader.consumer.stop()
    await command_reader.admin.close()
    command_reader.consumer, command_reader.admin = OneCommand(), SlowAdmin()  # type: ignore[assignment]
    heard: list[int] = []
    command_reader.listeners.append(lambda: heard.append(command_reader.metastore.command_offset))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(command_reader.poll(timeout_ms=10), 0.2)
    assert "S" in command_reader.metastore.sources and heard == [0]
