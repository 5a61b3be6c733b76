"""Topics go once no worker reports the queries that used them, after a bound whatever the
reports say; a statement naming a topic still waiting waits for it; a coordinator that stops
leaves the topics still waiting to the next one to start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from millpond.services.coordinator.topic_cleanup import QueryTopicCleanup


class Topics:
    """The broker's topics, as a delete sees them."""

    def __init__(self, *names: str, fail: bool = False) -> None:
        self.present = set(names)
        self.fail = fail

    async def delete(self, names: list[str], groups: list[str]) -> None:
        if self.fail:
            raise OSError("broker gone")
        self.present -= {*names, *groups}


async def eventually(check: Callable[[], bool], within_s: float = 2.0) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 (the cleanup's background tasks change what it checks)
            await asyncio.sleep(0.01)


async def test_the_topics_stay_while_a_worker_reports_the_query_and_go_once_none_does() -> None:
    topics = Topics("q1-repartition", "q1-changelog", "q2-changelog")
    running = {"Q1", "Q2"}
    cleanup = QueryTopicCleanup(topics.delete, lambda query_id: query_id in running, poll_s=0.01)
    cleanup.after_stopped("Q1", ["q1-repartition", "q1-changelog"])
    cleanup.after_stopped("Q2", ["q2-changelog"])
    await asyncio.sleep(0.6)
    assert topics.present == cleanup.waiting == {"q1-repartition", "q1-changelog", "q2-changelog"}
    running.discard("Q2")
    await eventually(lambda: topics.present == {"q1-repartition", "q1-changelog"})
    running.discard("Q1")
    await eventually(lambda: not topics.present and not cleanup.waiting)


async def test_the_reports_are_first_looked_at_after_a_beat_or_so() -> None:
    """A worker that started the query just before the TERMINATE reports it in its next beat."""
    topics = Topics("q1-changelog")
    cleanup = QueryTopicCleanup(topics.delete, lambda _: False, poll_s=0.01)
    cleanup.after_stopped("Q1", ["q1-changelog"], not_before_s=0.3)
    await asyncio.sleep(0.15)
    assert topics.present == {"q1-changelog"}
    await eventually(lambda: not topics.present)


async def test_after_the_bound_the_topics_go_whatever_the_reports_say(caplog: pytest.LogCaptureFixture) -> None:
    topics = Topics("q1-changelog")
    cleanup = QueryTopicCleanup(topics.delete, lambda _: True, wait_s=0.2, poll_s=0.01)
    with caplog.at_level(logging.WARNING):
        cleanup.after_stopped("Q1", ["q1-changelog"], not_before_s=0.0)
        await asyncio.sleep(0.1)
        assert topics.present == {"q1-changelog"}
        await eventually(lambda: not topics.present)
    assert "still run; deleting them all the same" in caplog.text


async def test_a_topic_no_query_used_goes_at_once_and_one_named_again_is_waited_for() -> None:
    topics = Topics("dropped", "t")
    running = {"Q1"}
    cleanup = QueryTopicCleanup(topics.delete, lambda query_id: query_id in running, poll_s=0.01)
    cleanup.delete_after([], ["dropped"], wait_s=10)
    await eventually(lambda: topics.present == {"t"}, within_s=0.3)
    cleanup.delete_after(["Q1"], ["t"], wait_s=10)
    cleanup.delete_after([], ["t"], wait_s=10)  # already waiting: its first deletion stands
    settled = asyncio.create_task(cleanup.settled("t"))
    await asyncio.sleep(0.7)
    assert not settled.done() and topics.present == {"t"}
    running.clear()
    async with asyncio.timeout(2):
        await settled
    assert not topics.present and not cleanup.waiting
    await cleanup.settled("t")  # nothing waiting: at once


async def test_a_stopping_coordinator_leaves_the_topics_still_waiting_to_the_next_to_start() -> None:
    topics = Topics("q1-changelog", "dropped")
    cleanup = QueryTopicCleanup(topics.delete, lambda _: True, poll_s=0.01)
    cleanup.after_stopped("Q1", ["q1-changelog"])
    cleanup.delete_after(["Q1"], ["dropped"], wait_s=20)
    await asyncio.sleep(0.05)
    async with asyncio.timeout(1):  # not the 20-45 s the query's workers get
        await cleanup.close()
    assert topics.present == {"q1-changelog", "dropped"} and not cleanup.waiting


async def test_a_failed_delete_is_logged_and_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    cleanup = QueryTopicCleanup(Topics("q1-changelog", fail=True).delete, lambda _: False, poll_s=0.01)
    with caplog.at_level(logging.ERROR):
        cleanup.after_stopped("Q1", ["q1-changelog"])
        await eventually(lambda: not cleanup.waiting)
    assert "could not delete topics of stopped queries" in caplog.text


async def test_a_terminated_querys_consumer_group_goes_with_its_topics_or_alone() -> None:
    """Its committed offsets are deleted once no worker runs it, as ksqlDB's cleanup does; a
    query whose topics are gone already may leave its group alone to delete."""
    topics = Topics("q1-changelog", "group-q1", "group-q2")
    running = {"Q1", "Q2"}
    cleanup = QueryTopicCleanup(topics.delete, lambda query_id: query_id in running, poll_s=0.01)
    cleanup.after_stopped("Q1", ["q1-changelog"], not_before_s=0.0, groups=["group-q1"])
    cleanup.after_stopped("Q2", [], not_before_s=0.0, groups=["group-q2"])
    cleanup.after_stopped("Q2", [], not_before_s=0.0, groups=["group-q2"])  # already waiting
    await asyncio.sleep(0.1)
    assert topics.present == {"q1-changelog", "group-q1", "group-q2"}
    running.clear()
    await eventually(lambda: not topics.present)
    await cleanup.close()
