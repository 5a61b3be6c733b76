"""The command topic: the ordered log of every statement that changed the metastore.

The coordinator appends inside a Kafka transaction whose transactional id is the service
id (a second coordinator fences the first); every node replays it with read_committed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.metastore import Metastore
from shared.sql.parser import parse_statement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Command:
    """One command-topic record."""

    statement: str
    properties: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The record value."""
        return json.dumps({"statement": self.statement, "properties": self.properties}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Command:
        """Parse a record value."""
        body: dict[str, Any] = json.loads(data)
        return cls(body["statement"], body.get("properties", {}))


class CommandReader:
    """Replays the command topic into a metastore, in order, read_committed."""

    def __init__(self, bootstrap: str, topic: str, metastore: Metastore):
        self.topic = topic
        self.metastore = metastore
        self.partition = TopicPartition(topic, 0)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.listeners: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Connect and position at the next command the metastore has not applied."""
        await self.consumer.start()
        self.consumer.assign([self.partition])
        self.consumer.seek(self.partition, self.metastore.command_offset + 1)

    async def stop(self) -> None:
        """Disconnect."""
        await self.consumer.stop()

    async def catch_up(self) -> None:
        """Apply every committed command up to the current end of the topic."""
        end = (await self.consumer.end_offsets([self.partition]))[self.partition]
        # Compare positions, not record offsets: transaction markers take offsets too.
        while await self.consumer.position(self.partition) < end:
            await self.poll(timeout_ms=500)

    async def poll(self, timeout_ms: int) -> int:
        """Apply whatever arrives within ``timeout_ms``; returns how many commands."""
        batches = await self.consumer.getmany(self.partition, timeout_ms=timeout_ms)
        applied = 0
        for record in batches.get(self.partition, []):
            self._apply(record.offset, record.value)
            applied += 1
        if applied:
            for listener in self.listeners:
                listener()
        return applied

    def _apply(self, offset: int, value: bytes | None) -> None:
        if offset <= self.metastore.command_offset:
            return
        try:
            command = Command.decode(value or b"{}")
            message = self.metastore.apply(parse_statement(command.statement), offset)
            log.info("applied command", extra={"offset": offset, "result": message})
        except Exception as err:  # replay must go on; the statement keeps its place
            self.metastore.command_offset = offset
            log.error("command failed on replay", extra={"offset": offset, "error": str(err)})

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the topic until ``stop`` is set."""
        while not stop.is_set():
            await self.poll(timeout_ms=200)


class CommandWriter:
    """Appends commands transactionally; the transactional id fences older coordinators."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str):
        self.topic = topic
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=transactional_id, enable_idempotence=True
        )

    async def start(self) -> None:
        """Connect and fence any previous producer with the same transactional id."""
        await self.producer.start()

    async def stop(self) -> None:
        """Disconnect."""
        await self.producer.stop()
