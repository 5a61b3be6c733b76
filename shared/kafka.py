"""Kafka helpers shared by the services: topic names and idempotent topic creation."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

log = logging.getLogger(__name__)


def changelog_topic(service_id: str, query_id: str) -> str:
    """The compacted changelog of a persistent query's state store."""
    return f"_millpond-{service_id}-{query_id}-changelog"


def consumer_group(service_id: str, query_id: str) -> str:
    """The consumer group a persistent query commits its input offsets to."""
    return f"_millpond-{service_id}-{query_id}"


def task_transactional_id(service_id: str, query_id: str, partition: int) -> str:
    """Stable per task, so a new owner of the task fences the old one."""
    return f"_millpond-{service_id}-{query_id}-{partition}"


async def ensure_topic(
    admin: AIOKafkaAdminClient, name: str, partitions: int, *, compacted: bool = False
) -> bool:
    """Create ``name`` unless it exists; True when it was created now."""
    existing = await admin.list_topics()
    if name in existing:
        return False
    configs = {"cleanup.policy": "compact"} if compacted else {}
    try:
        await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, topic_configs=configs)]
        )
    except TopicAlreadyExistsError:
        return False
    log.info("created topic", extra={"topic": name, "partitions": partitions, "compacted": compacted})
    return True


async def topic_partitions(admin: AIOKafkaAdminClient, name: str) -> int | None:
    """How many partitions ``name`` has, or None when it does not exist."""
    described = await admin.describe_topics([name])
    for topic in described:
        if topic.get("topic") == name and not topic.get("error_code"):
            return len(topic.get("partitions", []))
    return None
