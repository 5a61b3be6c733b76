"""Every Kafka name Millpond makes: internal topics, consumer groups and transactional ids.

All of them start with ``_millpond-<service id>-``, so clusters sharing a broker stay apart
and an operator can tell Millpond's topics from their own. The strings are part of the
on-disk contract (a renamed changelog would be a lost changelog): change none of them.
Pure functions, no I/O.
"""

from __future__ import annotations

import re

from millpond.shared.errors import StatementError

NOT_IN_TOPICS = re.compile(r"[^a-zA-Z0-9._-]")
"""What Kafka does not allow in a topic's name."""


INTERNAL_PREFIX = "_millpond-"
"""How every internal topic's name begins, whichever cluster made it."""


def _prefix(service_id: str) -> str:
    return f"{INTERNAL_PREFIX}{service_id}-"


def check_not_internal(topic: str, what: str) -> None:
    """Refuse ``what`` (a write or a delete) of an internal topic: a stream declared over one
    (to read the processing log, or to debug) may read it, never change it; a record written
    to the command topic would be replayed as a statement, a deleted one loses the metastore."""
    if topic.startswith(INTERNAL_PREFIX):
        raise StatementError(f"{topic} is one of Millpond's internal topics (their names begin with "
                             f"{INTERNAL_PREFIX!r}): they can be read, not {what}")


def command_topic(service_id: str) -> str:
    """The cluster's command topic (one partition, every metastore change in order)."""
    return _prefix(service_id) + "command_topic"


def command_transactional_id(service_id: str) -> str:
    """The transactional id every coordinator appends to the command topic with: one for the
    cluster, so a coordinator that starts appending fences any other."""
    return service_id


def processing_log_topic(service_id: str) -> str:
    """Where records that cannot be processed are written, with the reason."""
    return _prefix(service_id) + "processing_log"


def leader_topic(service_id: str) -> str:
    """The one-partition topic whose consumer group elects the leading coordinator."""
    return _prefix(service_id) + "coordinator_leader"


def leader_group(service_id: str) -> str:
    """The consumer group the coordinators join to elect their leader."""
    return _prefix(service_id) + "coordinators"


def warm_up_topic_prefix(service_id: str, worker_id: str) -> str:
    """What every warm-up topic of a worker's Spark session starts with (a worker deletes
    those a crash left behind before it makes its next). A character of the worker id that
    Kafka does not allow in a topic's name becomes '_'."""
    return f"{_prefix(service_id)}warm-up-{NOT_IN_TOPICS.sub('_', worker_id)}-"


def changelog_topic(service_id: str, query_id: str) -> str:
    """The compacted changelog of a persistent query's state store."""
    return f"{_prefix(service_id)}{query_id}-changelog"


def regroup_changelog_topic(service_id: str, query_id: str) -> str:
    """The changelog of a table aggregation's regroup stage: the row each table key last added."""
    return f"{_prefix(service_id)}{query_id}-regroup-changelog"


def repartition_topic(service_id: str, query_id: str) -> str:
    """The internal topic a query re-keys its input through before aggregating it."""
    return f"{_prefix(service_id)}{query_id}-repartition"


def joined_topic(service_id: str, query_id: str) -> str:
    """The compacted topic a table-table join gathers both tables' records in, keyed by side and key."""
    return f"{_prefix(service_id)}{query_id}-joined"


def grouped_topic(service_id: str, query_id: str) -> str:
    """The topic a GROUP BY over a stream-stream join aggregates: the joined rows keyed by the
    GROUP BY (the join's own stages gather both streams in ``joined_topic``)."""
    return f"{joined_topic(service_id, query_id)}-grouped"


def joined_rows_topic(service_id: str, query_id: str) -> str:
    """The joined rows of a GROUP BY over tables joined with tables, keyed by the join key: a
    table the aggregation regroups (``chained_rows_topic`` adds a chain's earlier stages')."""
    return f"{joined_topic(service_id, query_id)}-rows"


def chained_rows_topic(service_id: str, query_id: str, step: int) -> str:
    """The rows a chain of table-table joins joined up to stage ``step`` (not the last), keyed
    by the first table's key: the next stage's left table."""
    return f"{joined_rows_topic(service_id, query_id)}-{step}"


def chained_topic(service_id: str, query_id: str, step: int) -> str:
    """The topic a multi-way join's stage ``step`` reads: the joined rows of the stages before
    it, re-keyed by the expression its JOINs match."""
    return f"{joined_topic(service_id, query_id)}-{step}"


def streams_topic(service_id: str, query_id: str, step: int) -> str:
    """The topic a stream-stream join stage gathers both sides in, keyed by side and key: the
    ``joined_topic`` for a query's first stage, one of its own for a stream joined later."""
    return joined_topic(service_id, query_id) if step == 0 else f"{joined_topic(service_id, query_id)}-{step}-streams"


def consumer_group(service_id: str, query_id: str) -> str:
    """The consumer group a persistent query commits its input offsets to."""
    return f"{_prefix(service_id)}{query_id}"


def task_transactional_id(service_id: str, query_id: str, partition: int, stage: str = "") -> str:
    """Stable per task (and stage of a two-stage query), so a new owner of the task fences the old one."""
    return f"{_prefix(service_id)}{query_id}-{partition}" + (f"-{stage}" if stage else "")
