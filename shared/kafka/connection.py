"""How a service's Kafka clients connect: bootstrap servers and the standard client
security settings (SSL, SASL), as aiokafka arguments and as Spark Kafka source options."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import InvalidProducerEpoch, InvalidTxnState, ProducerFenced
from aiokafka.helpers import create_ssl_context

from millpond.shared.teardown import outlast_for, run_to_end

TRANSACTION_RETRY_BACKOFF_MS = 20
"""How long a transactional producer waits before it retries a retriable error (aiokafka's
default is 100 ms, never backed off further). Right after a transaction commits, the
transaction coordinator is still writing its markers: the next transaction's first produce
is refused for a moment (CONCURRENT_TRANSACTIONS, which the broker's transaction
verification reports as NOT_ENOUGH_REPLICAS) and the InitProducerId of a new owner waits
while the old owner's open transaction aborts. Back-to-back transactions on an idle broker:
p99 per commit 113-148 ms with 100 ms, 37-56 ms with 20 ms (20-48 ms with 10 ms, but a
broker down would then see a hundred retries a second from each task, each logged)."""
FENCED = (ProducerFenced, InvalidProducerEpoch, InvalidTxnState)
"""What a transactional producer sees once another producer with its transactional id started
(the new owner of its partition, or of the command topic)."""
IDLE_WAKE_MIN_MS = 200
"""aiokafka's default ``consumer_timeout_ms``."""

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class KafkaConnection:
    """Where the brokers are and how to authenticate to them."""

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_ca_file: str | None = None
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None

    @property
    def _sasl(self) -> bool:
        return self.security_protocol.startswith("SASL")

    @property
    def _ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (producer, consumer, admin)."""
        args: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers,
                                "security_protocol": self.security_protocol}
        if self._sasl:
            args |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.sasl_username,
                     "sasl_plain_password": self.sasl_password}
        if self._ssl:
            args["ssl_context"] = create_ssl_context(cafile=self.ssl_ca_file, certfile=self.ssl_cert_file,
                                                     keyfile=self.ssl_key_file)
        return args

    def end_offsets_consumer(self) -> AIOKafkaConsumer:
        """A consumer that is never assigned, to ask the end offsets (last stable offsets:
        read_committed) of partitions another consumer fetches. Asked on the fetching
        consumer, the request waits behind its fetch (aiokafka keeps one in flight), which the
        broker holds for ``fetch_max_wait_ms`` while nothing new comes: 15-25 ms of every
        question at a 25 ms wait, 300 ms at 500."""
        return AIOKafkaConsumer(**self.client_args(), isolation_level="read_committed", enable_auto_commit=False)

    def transactional_args(self, transactional_id: str) -> dict[str, Any]:
        """Keyword arguments for an idempotent, transactional aiokafka producer."""
        return self.client_args() | {"transactional_id": transactional_id, "enable_idempotence": True,
                                     "retry_backoff_ms": TRANSACTION_RETRY_BACKOFF_MS}

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (``kafka.`` + the Java client's settings)."""
        options = {"kafka.bootstrap.servers": self.bootstrap_servers, "kafka.security.protocol": self.security_protocol}
        if self._sasl:
            options["kafka.sasl.mechanism"] = self.sasl_mechanism
            options["kafka.sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.sasl_mechanism]} required username={json.dumps(self.sasl_username or '')} "
                f"password={json.dumps(self.sasl_password or '')};")
        if self._ssl:
            if self.ssl_ca_file:
                options |= {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": self.ssl_ca_file}
            if self.ssl_cert_file and self.ssl_key_file:
                options |= {"kafka.ssl.keystore.type": "PEM",
                            "kafka.ssl.keystore.certificate.chain": Path(self.ssl_cert_file).read_text(),
                            "kafka.ssl.keystore.key": Path(self.ssl_key_file).read_text()}
        return options


def idle_wake_ms(fetch_max_wait_ms: int) -> int:
    """``consumer_timeout_ms`` for a consumer that stays assigned: how often aiokafka's
    background fetch routine wakes when nothing happened. Its default (200) woke every
    long-lived consumer of a worker five times a second; each event the routine acts on (a
    fetch answered, records taken, a partition resumed or unassigned) wakes it anyway, so it
    need not wake more often than its fetches return."""
    return max(IDLE_WAKE_MIN_MS, fetch_max_wait_ms)


class Client(Protocol):
    """An aiokafka producer or consumer."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=Client)


START_AFTER_CANCEL_S = 1.0
"""How long a client's start goes on once its caller is cancelled (it takes about 5 ms on a
healthy broker): aiokafka's bootstrap closes the connection it opened only when it ends, so
one cancelled there left it open for the garbage collector. Past this, it is cancelled."""


@asynccontextmanager
async def started(client: C) -> AsyncIterator[C]:
    """``client`` started, and stopped when the block ends however it ends: a start that fails
    or is cancelled included (aiokafka leaves a half-started client's connections open, and
    logs them unclosed; a cancelled start is let end first: ``start_client``), and a cancel
    does not cut the stop short."""
    try:
        await start_client(client)
        yield client
    finally:
        await run_to_end(stop_client(client))


async def stop_client(client: Client) -> None:
    """``client.stop()``; a producer's failures are then taken as seen. aiokafka sets a fenced
    producer's error (ProducerFenced, say) on its transaction's waiter and on each failed batch's
    drain waiter, futures no caller awaits once the send or the transaction has failed with it;
    asyncio would log each as "Future exception was never retrieved" when collected, and the
    traceback it formats runs ``ast.parse`` inside the garbage collector: on Python 3.11 that
    breaks whatever ``ast.parse`` the collection interrupted ("AST constructor recursion depth
    mismatch": CPython's AST state is not re-entrant), pytest's reports and assertion rewriting
    included."""
    try:
        await client.stop()
    finally:
        for waiter in _failure_waiters(client):
            if waiter.done() and not waiter.cancelled():
                waiter.exception()


def _failure_waiters(client: Client) -> Iterator[asyncio.Future[Any]]:
    """The futures aiokafka's producer fails and leaves unawaited (its own attributes: none on a
    consumer)."""
    manager = getattr(client, "_txn_manager", None)  # an idempotent producer's (a transactional one's too)
    waiter = manager.wait_for_transaction_end() if manager is not None else None
    if waiter is not None:  # (None until a first transaction began)
        yield waiter
    accumulator = getattr(client, "_message_accumulator", None)
    if accumulator is not None:
        for batch in itertools.chain(*accumulator._batches.values(), accumulator._pending_batches):
            yield batch._drain_waiter


async def start_client(client: Client) -> None:
    """``client.start()``; a caller cancelled meanwhile lets it end first, for
    ``START_AFTER_CANCEL_S`` at most, so that the stop its owner runs next finds no connection
    the start still held (aiokafka's clients, its admin client too)."""
    starting = asyncio.ensure_future(client.start())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        await outlast_for(starting, START_AFTER_CANCEL_S)
        raise
