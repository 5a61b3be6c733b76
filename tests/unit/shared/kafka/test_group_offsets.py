"""``GroupOffsets``: one admin client kept open for the reads of committed positions, dropped
when a read fails in a way it does not retry, and none kept once closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError
from aiokafka.structs import OffsetAndMetadata

from millpond.shared.kafka import admin as admin_module
from millpond.shared.kafka.admin import GROUP_OFFSETS, GroupOffsets, committed_positions
from millpond.shared.kafka.connection import KafkaConnection

KAFKA = KafkaConnection("broker:9092")
TP = TopicPartition("events", 0)


class FakeAdmin:
    """An admin client answering each read with the next of ``answers`` (an error is raised)."""

    def __init__(self, answers: list[Any]):
        self.answers = answers
        self.reads = 0
        self.closed = False

    async def list_consumer_group_offsets(self, group: str, partitions: list[TopicPartition]) -> dict[Any, Any]:
        assert not self.closed, "a closed client was asked"
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return {tp: OffsetAndMetadata(answer, f"{group}@{answer}") for tp in partitions}

    async def close(self) -> None:
        self.closed = True


class Admins:
    """The fake admin clients opened, in order, and the answers the next ones will give."""

    def __init__(self) -> None:
        self.made: list[FakeAdmin] = []
        self.connections: list[KafkaConnection] = []
        self.answers: list[list[Any]] = []

    async def start(self, kafka: KafkaConnection) -> FakeAdmin:
        self.connections.append(kafka)
        self.made.append(FakeAdmin(self.answers.pop(0) if self.answers else list(range(7, 20))))
        return self.made[-1]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Admins:
    """The admin clients opened; each answers 7, then 8, ... unless given answers."""
    admins = Admins()
    monkeypatch.setattr(admin_module, "started_admin", admins.start)
    return admins


async def test_reads_share_one_client_until_it_is_closed(opened: Admins) -> None:
    reader = GroupOffsets(KAFKA)
    assert await reader.positions("g", [TP]) == {TP: (7, "g@7")}
    assert await asyncio.gather(reader.positions("g", [TP]), reader.positions("h", [TP])) == [
        {TP: (8, "g@8")}, {TP: (9, "h@9")}]
    assert len(opened.made) == 1 and opened.made[0].reads == 3 and not opened.made[0].closed
    await reader.close()
    assert opened.made[0].closed
    # Closed: a read still answers, through a client of its own that it closes.
    assert await reader.positions("g", [TP]) == {TP: (7, "g@7")}
    assert len(opened.made) == 2 and opened.made[1].closed and opened.made[0].reads == 3


async def test_a_retried_error_keeps_the_client_and_any_other_drops_it(opened: Admins) -> None:
    opened.answers.append([KafkaConnectionError("lost"), 7, GroupAuthorizationFailedError("no")])
    reader = GroupOffsets(KAFKA)
    assert await reader.positions("g", [TP]) == {TP: (7, "g@7")}  # the lost connection retried on the same client
    assert len(opened.made) == 1 and opened.made[0].reads == 2
    with pytest.raises(GroupAuthorizationFailedError):
        await reader.positions("g", [TP])
    assert opened.made[0].closed
    assert await reader.positions("g", [TP]) == {TP: (7, "g@7")}  # the next read opens another
    assert len(opened.made) == 2 and not opened.made[1].closed
    await reader.close()
    assert opened.made[1].closed


async def test_committed_positions_reads_through_the_context_s_reader_for_its_connection(opened: Admins) -> None:
    reader = GroupOffsets(KAFKA)
    token = GROUP_OFFSETS.set(reader)
    try:
        assert await committed_positions(KAFKA, "g", [TP]) == {TP: (7, "g@7")}
        assert await committed_positions(KAFKA, "g", [TP]) == {TP: (8, "g@8")}
        assert len(opened.made) == 1 and not opened.made[0].closed
        # Another cluster's connection is not read through it.
        assert await committed_positions(KafkaConnection("elsewhere:9092"), "g", [TP]) == {TP: (7, "g@7")}
        assert opened.connections == [KAFKA, KafkaConnection("elsewhere:9092")] and opened.made[1].closed
    finally:
        GROUP_OFFSETS.reset(token)
        await reader.close()
    # With none set, each read opens and closes a client of its own.
    assert await committed_positions(KAFKA, "g", [TP]) == {TP: (7, "g@7")}
    assert len(opened.made) == 3 and opened.made[2].closed and opened.made[0].closed


async def test_a_close_while_a_client_starts_leaves_none_open(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakeAdmin] = []
    release = asyncio.Event()

    async def started_admin(kafka: KafkaConnection) -> FakeAdmin:
        made.append(FakeAdmin([7]))
        await release.wait()
        return made[-1]
    monkeypatch.setattr(admin_module, "started_admin", started_admin)
    reader = GroupOffsets(KAFKA)
    read = asyncio.create_task(reader.positions("g", [TP]))
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(reader.close())
    await asyncio.sleep(0.01)
    release.set()
    assert await read == {TP: (7, "g@7")}
    await closing
    assert all(admin.closed for admin in made)
