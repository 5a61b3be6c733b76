"""The worker's task gauges: each task's input lag (its partition's end offset minus the
next offset it will process), restore progress and every table copy's lag."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer

from millpond.services.worker.assignment import TaskAssignment
from millpond.shared import metrics
from millpond.shared.events import wait_at_most
from millpond.shared.kafka.connection import KafkaConnection, start_client

log = logging.getLogger(__name__)


async def refresh_loop(kafka: KafkaConnection, tasks: TaskAssignment, stop: asyncio.Event) -> None:
    """Refresh the gauges every second until ``stop``."""
    consumer = kafka.end_offsets_consumer()
    try:
        await start_client(consumer)
        while not stop.is_set():
            try:
                await _refresh(consumer, tasks)
            except Exception as error:  # a metric must never take the worker down
                log.debug("metrics refresh failed", extra={"error": repr(error)})
            await wait_at_most(stop, 1.0)
    finally:
        await consumer.stop()


async def _refresh(consumer: AIOKafkaConsumer, assignment: TaskAssignment) -> None:
    tasks = assignment.active_tasks()
    ends = await consumer.end_offsets([t.input for t in tasks]) if tasks else {}
    for gauge in (metrics.CONSUMER_LAG, metrics.RESTORED, metrics.TO_RESTORE, metrics.STORE_LAG):
        gauge.clear()
    for task in tasks:
        labels = (task.query.query_id, str(task.partition))
        if task.next_input_offset is not None and task.input in ends:
            metrics.CONSUMER_LAG.labels(*labels).set(max(ends[task.input] - task.next_input_offset, 0))
        metrics.RESTORED.labels(*labels).set(task.restored_records)
        metrics.TO_RESTORE.labels(*labels).set(task.records_to_restore)
    for lag in assignment.store_lags():
        metrics.STORE_LAG.labels(lag.query_id, str(lag.partition), "active" if lag.active else "standby").set(lag.lag)
