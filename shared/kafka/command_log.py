"""The command topic: the ordered log of every statement that changed the metastore.

Writers append inside a Kafka transaction whose transactional id is the service id. Each
append starts a fresh transactional producer, and starting it fences every other producer
with that id (aborting its open transaction), so of two coordinators racing, only one can
commit, and the other's retry validates against what the first wrote. Every node replays
the topic with read_committed; a command that fails on replay keeps its place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.queries import Resolved
from millpond.shared.errors import SetupError, StatementError, UnavailableError
from millpond.shared.kafka.connection import KafkaConnection, idle_wake_ms, start_client, started
from millpond.shared.sql.parser import parse_statement
from millpond.shared.teardown import run_to_end

log = logging.getLogger(__name__)
COMMAND_FETCH_WAIT_MS = 500
"""How long the broker holds a reader's fetch when no committed command is new. A commit
answers a held fetch at once, its records and its marker together (read_committed fetches
stop at the last stable offset, which a commit moves past its marker), so ``catch_up`` after
a statement waits for no fetch to time out (bench.command_log: a median 4.6-5.6 ms from the
commit, 4.1-8.3 ms at a 25 ms wait), and an idle node makes 2 fetches a second instead of
the 40 a 25 ms wait made (0.35-0.45% of a core against 2.8-3.5%)."""

EXECUTED_REQUESTS_KEPT = 100_000
"""Request ids a node remembers the outcome of (a resend comes within seconds)."""


def request_reused(request_id: str, statement: str) -> StatementError:
    """The refusal of another statement under a request id already used for ``statement`` (a
    DDL statement's or an INSERT's): answered as a resend, it would be acknowledged and never run."""
    shown = statement if len(statement) <= 80 else statement[:80] + "..."
    return StatementError(f"request id {request_id.rpartition('/')[0] or request_id} was already used for another "
                          f"statement ({shown}); give each request its own id")


@dataclass(frozen=True)
class Command:
    """One command-topic record: the statement, its session properties, and what the
    coordinator resolved for it (so every node replays it the same way)."""

    statement: str
    properties: dict[str, str] = field(default_factory=dict)
    resolved: Resolved = field(default_factory=Resolved)
    request_id: str = ""
    """The client request that executed it (empty: none named), so a resend is recognised."""
    deleted_topics: tuple[str, ...] = ()
    """A note instead of a statement (``statement`` empty): these topics of dropped sources
    were deleted, so no coordinator that starts deletes them again (a topic made anew since,
    outside Millpond, under the same name is someone's else)."""

    def encode(self) -> bytes:
        """The record value."""
        if self.deleted_topics:
            return json.dumps({"deleted_topics": list(self.deleted_topics)}).encode()
        body: dict[str, Any] = {"statement": self.statement, "properties": self.properties}
        if self.request_id:
            body["request_id"] = self.request_id
        if self.resolved.start_offsets is not None:
            body["start_offsets"] = list(self.resolved.start_offsets)
        if self.resolved.partitions is not None:
            body["partitions"] = self.resolved.partitions
        return json.dumps(body).encode()

    @classmethod
    def decode(cls, data: bytes) -> Command:
        """Parse a record value."""
        body: dict[str, Any] = json.loads(data)
        offsets = body.get("start_offsets")
        resolved = Resolved(tuple(offsets) if offsets is not None else None, body.get("partitions"))
        if "deleted_topics" in body:
            return cls("", deleted_topics=tuple(str(t) for t in body["deleted_topics"]))
        return cls(body["statement"], body.get("properties", {}), resolved, body.get("request_id", ""))


def _retrieved(ask: asyncio.Task[int]) -> None:
    """A shared request's failure, retrieved (its callers may all have gone)."""
    if not ask.cancelled():
        ask.exception()


class CommandReader:
    """Replays the command topic into a metastore, in order, read_committed."""

    def __init__(self, kafka: KafkaConnection, topic: str, metastore: Metastore, *,
                 errors_recheck_s: float = 1.0, topics_recheck_s: float = 10.0,
                 fetch_max_wait_ms: int = COMMAND_FETCH_WAIT_MS):
        self.topic = topic
        self.metastore = metastore
        self.partition = TopicPartition(topic, 0)
        self.consumer = AIOKafkaConsumer(
            **kafka.client_args(),
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=fetch_max_wait_ms,
            consumer_timeout_ms=idle_wake_ms(fetch_max_wait_ms),
        )
        self._ends = kafka.end_offsets_consumer()
        """Asks the topic's end offset for ``catch_up`` (on the reading consumer, every
        catch-up, so every INSERT and DDL at a coordinator, waited 20-30 ms for its fetch)."""
        self.admin = AIOKafkaAdminClient(**kafka.client_args())
        self.listeners: list[Callable[[], None]] = []
        """Called after commands were applied, or when the sources' errors changed."""
        self.recheck_s = (errors_recheck_s, topics_recheck_s)
        """How often ``run`` lists the topics again: while some source is in error (its topic
        may only now be listed), and while none is (one may be deleted outside Millpond)."""
        self._checked_at = 0.0
        self.executed: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """The statement and outcome message of each command that named its request id, by
        that id (the latest ``EXECUTED_REQUESTS_KEPT``): what a resent statement is answered
        with, and what tells a resend from an id used again for another statement."""
        self._asking: asyncio.Task[int] | None = None
        """The end-offset request out now (``end_offset``)."""
        self._next_ask: asyncio.Task[int] | None = None
        """The one not sent yet (it goes once ``_asking`` is answered), shared by whoever comes
        meanwhile."""
        self._lock = asyncio.Lock()
        self.read_to = 0
        """The consumer's position after the last poll: every command before it is applied."""

    async def start(self) -> None:
        """Connect and position at the next command the metastore has not applied.

        Raises ``SetupError`` when that command is no longer in the topic (retention or a
        record deletion removed the start of the log): replaying only the later commands
        would build a different metastore than the other nodes', so the node must not serve.
        """
        try:
            await start_client(self.admin)
            await start_client(self.consumer)
            await start_client(self._ends)
        except BaseException:
            await self.stop()  # a client started (or half started) is not left open
            raise
        self.consumer.assign([self.partition])
        needed = self.metastore.command_offset + 1
        first = (await self.consumer.beginning_offsets([self.partition]))[self.partition]
        if first > needed:
            await self.stop()
            raise SetupError(
                f"the command topic {self.topic} starts at offset {first}, but this node needs it from offset "
                f"{needed}: commands were deleted (by retention.ms or a record deletion), so replaying the rest "
                "would build a metastore that differs from the cluster's, and this node refuses to serve. Restore "
                "the command topic from a backup (it must keep retention.ms=-1), or start a new cluster with a new "
                "service_id and run the statements again.")
        self.consumer.seek(self.partition, needed)

    async def stop(self) -> None:
        """Disconnect every client, even when the caller is cancelled meanwhile."""
        for ask in (self._next_ask, self._asking):
            if ask is not None:
                ask.cancel()
        await run_to_end(asyncio.gather(self.consumer.stop(), self._ends.stop(), self.admin.close()))

    async def end_offset(self) -> int:
        """The command topic's end offset, from a request sent after this call began (so it
        counts every command committed before). Callers that come while a request is out share
        the next one, sent once it is answered: a router taking many INSERTs at once asks
        Kafka once per round trip, not once per INSERT."""
        ask = self._next_ask  # not sent yet: it leaves after this caller came
        if ask is None:
            ask = self._next_ask = asyncio.ensure_future(self._ask_end(after=self._asking))
            ask.add_done_callback(_retrieved)
        return await asyncio.shield(ask)  # a caller that goes does not cancel the others' request

    async def _ask_end(self, after: asyncio.Task[int] | None) -> int:
        """Ask for the end offset, once ``after`` (the request out, if any) was answered."""
        if after is not None and not after.done():
            await asyncio.wait({after})
        self._asking, self._next_ask = self._next_ask, None  # out now: later callers wait for the next
        end: int = (await self._ends.end_offsets([self.partition]))[self.partition]
        return end

    async def catch_up(self, position: int | None = None, timeout_s: float = 30.0) -> None:
        """Apply every committed command up to ``position`` (default: the current end)."""
        if position is None:
            position = await self.end_offset()
        if self.read_to >= position:
            return  # already read: no waiting for the lock, which a follower's idle poll holds up to 200 ms
        deadline = time.monotonic() + timeout_s
        while True:
            async with self._lock:
                # Compare positions, not record offsets: transaction markers take offsets too.
                if await self.consumer.position(self.partition) >= position:
                    return
                await self._poll(timeout_ms=200)
            if time.monotonic() > deadline:
                raise UnavailableError(f"could not read the command topic {self.topic} up to offset {position} "
                                       f"within {timeout_s:.0f} s; is Kafka reachable?")

    async def poll(self, timeout_ms: int) -> int:
        """Apply whatever arrives within ``timeout_ms``; returns how many commands."""
        async with self._lock:
            return await self._poll(timeout_ms)

    async def _poll(self, timeout_ms: int) -> int:
        batches = await self.consumer.getmany(self.partition, timeout_ms=timeout_ms)
        records = batches.get(self.partition, [])
        for record in records:
            self._apply(record.offset, record.value)
        try:
            self.read_to = await self.consumer.position(self.partition)
            if records:
                await self.refresh_errors()
        finally:  # the listeners hear of what was applied however the poll ends (a caller's cancel)
            if records:
                self._notify()
        return len(records)

    def _notify(self) -> None:
        for listener in self.listeners:
            listener()

    async def refresh_errors(self) -> bool:
        """Mark sources whose topics are gone (and queries over them) in the metastore; True
        when that changed what is in error."""
        self._checked_at = time.monotonic()
        try:
            existing = set(await self.admin.list_topics())
        except Exception as err:  # an unreachable broker must not stop replay
            log.warning("could not list topics to check sources", extra={"error": str(err)})
            return False
        before = self.metastore.errors
        self.metastore.check_topics(existing)
        if self.metastore.errors == before:
            return False
        for name, error in sorted(self.metastore.errors.items()):
            log.warning("in error", extra={"entity": name, "error": error})
        for name in sorted(before.keys() - self.metastore.errors.keys()):
            log.info("no longer in error", extra={"entity": name})
        return True

    async def _recheck_topics(self) -> None:
        """List the topics again when due; tell the listeners when the errors changed."""
        interval = self.recheck_s[0] if self.metastore.errors else self.recheck_s[1]
        if time.monotonic() - self._checked_at >= interval and await self.refresh_errors():
            self._notify()

    def _apply(self, offset: int, value: bytes | None) -> None:
        if offset <= self.metastore.command_offset:
            return
        try:
            command = Command.decode(value or b"{}")
            if command.deleted_topics:
                self.metastore.forget_dropped(command.deleted_topics, offset)
                log.info("applied command", extra={"offset": offset, "deleted_topics": list(command.deleted_topics)})
                return
            message = self.metastore.apply(parse_statement(command.statement), offset, command.properties,
                                           command.resolved)
            log.info("applied command", extra={"offset": offset, "result": message})
            if command.request_id:
                self.executed[command.request_id] = (command.statement, message)
                while len(self.executed) > EXECUTED_REQUESTS_KEPT:
                    self.executed.popitem(last=False)
        except Exception as err:  # never skip: the command keeps its place, with its error
            self.metastore.record_failure(offset, f"{type(err).__name__}: {err}")
            log.error("command failed on replay", extra={"offset": offset, "error": str(err)})

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the topic until ``stop`` is set."""
        while not stop.is_set():
            await self.poll(timeout_ms=200)
            await self._recheck_topics()


class CommandWriter:
    """Appends commands, one transaction (and one freshly fenced producer) per statement."""

    def __init__(self, kafka: KafkaConnection, topic: str, transactional_id: str):
        self.kafka = kafka
        self.topic = topic
        self.transactional_id = transactional_id

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[CommandAppender]:
        """Fence other writers, open a transaction, and commit it when the block ends.

        Raises ``aiokafka.errors.ProducerFenced`` (or another Kafka error) when another
        writer with the same transactional id took over meanwhile; nothing is then appended.
        """
        producer = AIOKafkaProducer(**self.kafka.transactional_args(self.transactional_id))
        # start() runs InitProducerId: it bumps the epoch (fencing older producers) and
        # waits until any transaction they left open is aborted or committed.
        async with started(producer), producer.transaction():
            yield CommandAppender(producer, self.topic)


@dataclass
class CommandAppender:
    """Appends to the command topic inside an open transaction."""

    producer: AIOKafkaProducer
    topic: str

    async def append(self, command: Command) -> int:
        """Send one command; returns its offset (visible to readers once committed)."""
        meta = await self.producer.send_and_wait(self.topic, command.encode(), partition=0)
        return int(meta.offset)
