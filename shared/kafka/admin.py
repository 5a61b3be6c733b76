"""Kafka admin helpers shared by the services: idempotent topic creation and deletion, offsets.

The names of Millpond's own topics and groups come from ``millpond.shared.catalog.names``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import GroupIdNotFound, KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError, for_code
from aiokafka.protocol.admin import DeleteGroupsRequest
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from millpond.shared.errors import StatementError, UnavailableError
from millpond.shared.kafka.connection import KafkaConnection, start_client, started
from millpond.shared.teardown import run_to_end

log = logging.getLogger(__name__)


def _retriable(error: BaseException) -> bool:
    return isinstance(error, KafkaError) and error.retriable


async def committed_offsets(kafka: KafkaConnection, group: str, partitions: list[TopicPartition],
                            timeout_s: float = 60.0) -> dict[TopicPartition, int]:
    """The offsets ``group`` committed for ``partitions`` (absent: none committed). Retries
    while the broker is still electing the group's coordinator, as on a fresh cluster."""
    positions = await committed_positions(kafka, group, partitions, timeout_s)
    return {tp: offset for tp, (offset, _) in positions.items()}


async def committed_positions(kafka: KafkaConnection, group: str, partitions: list[TopicPartition],
                              timeout_s: float = 60.0) -> dict[TopicPartition, tuple[int, str]]:
    """The offsets ``group`` committed for ``partitions`` with each commit's metadata (absent:
    none committed), as ``committed_offsets``; asked through the ``GroupOffsets`` set in this
    context for ``kafka`` (``GROUP_OFFSETS``), else through an admin client of the call's own."""
    async with _admin_reader(kafka) as reader:
        return await reader.positions(group, partitions, timeout_s)


@asynccontextmanager
async def _admin_reader(kafka: KafkaConnection) -> AsyncIterator[GroupOffsets]:
    """The ``GroupOffsets`` set in this context for ``kafka`` (``GROUP_OFFSETS``), else one of the
    call's own, closed after it."""
    shared = GROUP_OFFSETS.get()
    if shared is not None and shared.kafka == kafka:
        yield shared
        return
    async with GroupOffsets(kafka) as own:
        yield own


class GroupOffsets:
    """An admin client kept open to read consumer groups' committed positions.

    A task reads its group's committed position as it starts, and once before its fence so that
    its Spark query's plan is made meanwhile: both on a moved partition's way back to
    processing. An admin client opened for each read first connects and asks the cluster's
    metadata, then finds the group's coordinator and connects to it: 5.8-6.9 ms a read against
    1.3-1.4 ms through a client kept open, on an idle broker. The worker opens one and sets it
    in ``GROUP_OFFSETS`` for the tasks it runs. A lost connection is mended by the
    client; a read that fails otherwise drops it, and the next read opens another."""

    def __init__(self, kafka: KafkaConnection):
        self.kafka = kafka
        self._admin: AIOKafkaAdminClient | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> GroupOffsets:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def positions(self, group: str, partitions: list[TopicPartition],
                        timeout_s: float = 60.0) -> dict[TopicPartition, tuple[int, str]]:
        """As ``committed_positions``. Retries while the broker is still electing the group's
        coordinator, as on a fresh cluster."""
        async for attempt in AsyncRetrying(retry=retry_if_exception(_retriable), stop=stop_after_delay(timeout_s),
                                           wait=wait_exponential(multiplier=0.1, max=2), reraise=True):
            with attempt:
                async with self._lease() as admin:
                    offsets = await admin.list_consumer_group_offsets(group, partitions=partitions)
        return {tp: (meta.offset, meta.metadata or "") for tp, meta in offsets.items() if meta.offset >= 0}

    @asynccontextmanager
    async def _lease(self) -> AsyncIterator[AIOKafkaAdminClient]:
        """The open client (opened now if none is), or once closed a client of the read's own."""
        async with self._opening:
            if self._admin is None and not self._closed:
                self._admin = await started_admin(self.kafka)
            shared = self._admin
        if shared is None:
            own = await started_admin(self.kafka)
            try:
                yield own
            finally:
                await run_to_end(own.close())
        else:
            try:
                yield shared
            except Exception as error:
                if not _retriable(error):  # a client in a state not known is not asked again
                    if self._admin is shared:
                        self._admin = None
                    await run_to_end(shared.close())
                raise

    async def topic_configs(self, topic: str, timeout_s: float = 30.0) -> dict[str, str]:
        """``topic``'s configuration as the broker applies it (its own settings and the defaults)."""
        async for attempt in AsyncRetrying(retry=retry_if_exception(_retriable), stop=stop_after_delay(timeout_s),
                                           wait=wait_exponential(multiplier=0.1, max=2), reraise=True):
            with attempt:
                async with self._lease() as admin:
                    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
                    _raise_for_errors(response.resources)
        return {entry[0]: entry[1] for resource in response.resources for entry in resource[4] if entry[1] is not None}

    async def close(self) -> None:
        """Close the client; a read after it uses a client of its own."""
        async with self._opening:
            self._closed = True
            admin, self._admin = self._admin, None
        if admin is not None:
            await run_to_end(admin.close())


async def tombstones_kept_ms(kafka: KafkaConnection, topic: str) -> int | None:
    """How long ``topic``'s log cleaner keeps a tombstone once it could go (``delete.retention.ms``)
    when the topic is compacted; None when it is not (its tombstones go only with the records
    before them, by retention: a store's position below the first offset shows that,
    ``changelog.wiped_if_behind``). Asked as ``committed_positions`` asks."""
    async with _admin_reader(kafka) as reader:
        configs = await reader.topic_configs(topic)
    if "compact" not in configs.get("cleanup.policy", "delete"):
        return None
    return int(configs.get("delete.retention.ms", DEFAULT_TOMBSTONES_KEPT_MS))


DEFAULT_TOMBSTONES_KEPT_MS = 24 * 3_600_000
"""The broker's default ``delete.retention.ms`` (``log.cleaner.delete.retention.ms``): a day."""


GROUP_OFFSETS: ContextVar[GroupOffsets | None] = ContextVar("GROUP_OFFSETS", default=None)
"""The ``GroupOffsets`` that ``committed_positions`` reads through in this context (none: an
admin client of each read's own)."""


async def started_admin(kafka: KafkaConnection) -> AIOKafkaAdminClient:
    """An admin client, connected (closed again if it could not connect)."""
    admin = AIOKafkaAdminClient(**kafka.client_args())
    try:
        await start_client(admin)
    except BaseException:
        await run_to_end(admin.close())
        raise
    return admin


async def end_offsets(bootstrap: str, topic: str, partitions: int,
                      isolation_level: str = "read_uncommitted") -> dict[int, int]:
    """Each partition's end offset now (the last stable offset with ``read_committed``)."""
    async with started(AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level)) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}


async def internal_replicas(admin: AIOKafkaAdminClient, configured: int) -> int:
    """The replication factor of internal topics: ``configured``, or when that is 0,
    min(3, brokers in the cluster) (so one lost broker loses neither metastore nor state)."""
    if configured > 0:
        return configured
    brokers = (await admin.describe_cluster()).get("brokers") or []
    return max(1, min(3, len(brokers)))


def min_insync(replicas: int) -> int:
    """``min.insync.replicas`` for an internal topic of ``replicas`` copies: 2 from 3 copies
    on (an acknowledged write survives a lost broker), else 1 (writes go on with one down)."""
    return max(1, min(2, replicas - 1))


def command_topic_configs(replicas: int) -> dict[str, str]:
    """The command topic is the metastore: it is never deleted by time or size."""
    return {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
            "min.insync.replicas": str(min_insync(replicas))}


async def ensure_command_topic(admin: AIOKafkaAdminClient, name: str, replicas: int) -> None:
    """Create the one-partition command topic with infinite retention, or, when it exists
    with a finite one (made by hand or by an older version), correct its retention as
    ksqlDB does; the records already deleted cannot come back (``CommandReader`` refuses)."""
    configs = command_topic_configs(replicas)
    if await ensure_topic(admin, name, 1, replicas=replicas, configs=configs):
        return
    # A topic created a moment ago may be unknown yet to the broker asked: its answer is an
    # error code in the response (aiokafka raises none), retried until the alter is taken.
    async for attempt in AsyncRetrying(retry=retry_if_exception(_retriable), stop=stop_after_delay(30),
                                       wait=wait_exponential(multiplier=0.1, max=2), reraise=True):
        with attempt:
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            _raise_for_errors(response.resources)
            current = {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
            if current.get("retention.ms") == "-1" and current.get("retention.bytes") == "-1":
                return
            (altered,) = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, {
                **configs, "min.insync.replicas": current.get("min.insync.replicas",
                                                              configs["min.insync.replicas"])})])
            _raise_for_errors(altered.resources)
    log.warning("corrected the command topic's retention to infinite",
                extra={"topic": name, "retention.ms": current.get("retention.ms"),
                       "retention.bytes": current.get("retention.bytes")})


def _raise_for_errors(resources: list[Any]) -> None:
    """Raise the error a describe or alter of configs answered for a resource (its first field)."""
    for resource in resources:
        if resource[0]:
            raise for_code(resource[0])(f"{resource[1] or ''} ({resource[3]})")


async def ensure_topic(
    admin: AIOKafkaAdminClient, name: str, partitions: int, *, compacted: bool = False, replicas: int = 1,
    configs: dict[str, str] | None = None,
) -> bool:
    """Create ``name`` unless it exists; True when it was created now."""
    existing = await admin.list_topics()
    if name in existing:
        return False
    configs = {**({"cleanup.policy": "compact"} if compacted else {}), **(configs or {})}
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=replicas, topic_configs=configs)]
        )
    except TopicAlreadyExistsError:
        return False
    # aiokafka returns the broker's answer as it is: a topic it refused carries an error code.
    for topic, code, *message in response.topic_errors:
        if code == TopicAlreadyExistsError.errno:  # made meanwhile (another coordinator, a worker)
            return False
        if code:
            error = for_code(code)
            said = f": {message[0]}" if message and message[0] else ""
            text = (f"Kafka refused to create topic {topic!r} ({partitions} partitions, replication factor {replicas}"
                    f"{', ' + ', '.join(f'{k}={v}' for k, v in configs.items()) if configs else ''}): "
                    f"{error.__name__}{said}")
            raise UnavailableError(text + "; retry") if error.retriable else StatementError(text)
    log.info("created topic", extra={"topic": name, "partitions": partitions, "replicas": replicas, "configs": configs})
    return True


async def partition_counts(admin: AIOKafkaAdminClient, names: list[str], chunk: int = 500) -> dict[str, int]:
    """How many partitions each of ``names`` has (one left out that does not exist), asked
    ``chunk`` topics at a time rather than one request each."""
    counts: dict[str, int] = {}
    for at in range(0, len(names), chunk):
        for topic in await admin.describe_topics(names[at:at + chunk]):
            if topic.get("topic") in names and not topic.get("error_code"):
                counts[topic["topic"]] = len(topic.get("partitions", []))
    return counts


async def topic_partitions(admin: AIOKafkaAdminClient, name: str) -> int | None:
    """How many partitions ``name`` has, or None when it does not exist."""
    described = await admin.describe_topics([name])
    for topic in described:
        if topic.get("topic") == name and not topic.get("error_code"):
            return len(topic.get("partitions", []))
    return None


async def until_gone(admin: AIOKafkaAdminClient, name: str, within_s: float = 10.0) -> bool:
    """Whether ``name`` is gone from the broker's metadata within ``within_s``: a topic just
    deleted shows there a moment longer (longer on a busy broker)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while await topic_partitions(admin, name) is not None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def delete_topics(admin: AIOKafkaAdminClient, names: list[str]) -> list[str]:
    """Delete topics; ones already gone are fine. Returns those gone now (all but the ones
    Kafka refused to delete, which are logged)."""
    existing = set(await admin.list_topics())
    present = [n for n in names if n in existing]
    if not present:
        return list(names)
    try:
        response = await admin.delete_topics(present)
    except UnknownTopicOrPartitionError:
        return list(names)
    # As for create_topics: a topic the broker did not delete carries an error code.
    refused = {topic: for_code(code).__name__ for topic, code, *_ in response.topic_error_codes
               if code and code != UnknownTopicOrPartitionError.errno}
    if refused:
        log.error("Kafka refused to delete topics", extra={"refused": refused})
    if deleted := [n for n in present if n not in refused]:
        log.info("deleted topics", extra={"topics": deleted})
    return [n for n in names if n not in refused]


async def delete_groups(admin: AIOKafkaAdminClient, groups: list[str]) -> list[str]:
    """Delete consumer groups (their committed offsets), as ksqlDB's cleanup does for a
    terminated query's; ones already gone are fine. Returns those gone now (a refusal, such as
    a group that still has members, is logged). aiokafka's admin has no call for it, so the
    DeleteGroups request of its protocol goes to each group's coordinator as its own
    describe_consumer_groups sends requests."""
    gone: list[str] = []
    for group in groups:
        node = await admin.find_coordinator(group)
        response = await admin._send_request(DeleteGroupsRequest([group]), node)
        codes = {name: code for name, code in response.results}
        code = codes.get(group, 0)
        if code in (0, GroupIdNotFound.errno):
            gone.append(group)
        else:
            log.error("Kafka refused to delete a consumer group", extra={"group": group, "error": for_code(code).__name__})
    if gone:
        log.info("deleted consumer groups", extra={"groups": gone})
    return gone
