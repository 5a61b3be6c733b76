"""Deletes topics that queries used once no worker runs those queries any more.

A TERMINATE (or a DROP ... DELETE TOPIC) is appended before any worker has heard of it;
deleting the query's repartition and changelog topics, or the dropped source's, then pulls
them from under a batch still committing to them (in a fresh-clone CI, that worker's Spark
query then took its whole 30 s bound to stop). So each topic goes, in the background, once no
live worker reports a task (running, stopping, or assigned and not started yet) or a store
copy of the queries that used it, or after a bound whatever the reports say: a worker's stop
is bounded by less, and a worker cut off from the coordinator does not keep them forever.

A statement that names a topic still waiting (a CREATE right after a DROP ... DELETE TOPIC)
waits for it to go first (``settled``). A coordinator that stops, or crashes, leaves the topics
still waiting to the next one to start (``StatementExecutor.delete_left_topics``, from the
metastore's terminated queries and dropped topics): the workers may still be stopping the
queries that used them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

WAIT_S = 45.0
"""The longest a terminated query's topics wait for its workers (their stops are bounded at 30 s)."""
POLL_S = 0.1
"""How often the workers' reports are looked at again (they beat every 100 ms)."""
REPORTS_IN_FLIGHT_S = 0.5
"""How long after a TERMINATE the reports are first looked at: a worker that started the query
just before reports it in its next beat, up to 100 ms later, and is told to stop it in the answer
to a beat after the leader reassigned."""
DROP_WAIT_S = 20.0
"""The longest a dropped source's topic waits for the queries that used it."""
REPORTS_GRACE_S = 5.0
"""How long a coordinator that starts hears its workers' reports before it deletes a terminated
query's topics that were left (the workers beat every coordinator every 100 ms)."""


@dataclass
class _Deletion:
    queries: list[str]
    topics: list[str]
    groups: list[str]
    task: asyncio.Task[None] | None = None


class QueryTopicCleanup:
    """The topics waiting for the queries that used them to stop."""

    def __init__(self, delete: Callable[[list[str], list[str]], Awaitable[None]], runs: Callable[[str], bool],
                 wait_s: float = WAIT_S, poll_s: float = POLL_S):
        self.delete = delete
        """Deletes topics and consumer groups."""
        self.runs = runs
        """Whether a live worker still reports the query (``Cluster.runs``)."""
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._waiting: dict[str, _Deletion] = {}
        """Each topic waiting -> its deletion."""
        self._waiting_groups: set[str] = set()
        """The consumer groups waiting."""
        self._tasks: set[asyncio.Task[None]] = set()
        """The deletions under way."""

    @property
    def waiting(self) -> set[str]:
        """The topics not deleted yet."""
        return set(self._waiting)

    def after_stopped(self, query_id: str, topics: list[str], not_before_s: float = REPORTS_IN_FLIGHT_S,
                      groups: list[str] | None = None) -> None:
        """Delete a terminated query's internal ``topics`` and consumer ``groups`` once no worker
        runs it, looking first after ``not_before_s`` (a coordinator that just started has not
        heard from every worker yet)."""
        self.delete_after([query_id], topics, self.wait_s, not_before_s, groups)

    def delete_after(self, query_ids: list[str], topics: list[str], wait_s: float,
                     not_before_s: float = REPORTS_IN_FLIGHT_S, groups: list[str] | None = None) -> None:
        """Delete ``topics`` (and consumer ``groups``) once no worker runs any of ``query_ids``
        (none: at once), or after ``wait_s`` all the same; a topic or group already waiting
        keeps its first deletion."""
        topics = [t for t in topics if t not in self._waiting]
        groups = [g for g in groups or () if g not in self._waiting_groups]
        if not topics and not groups:
            return
        deletion = _Deletion(list(query_ids), topics, groups)
        deletion.task = asyncio.create_task(self._delete_when_stopped(deletion, wait_s, not_before_s if query_ids else 0.0),
                                            name=f"delete-{(topics or groups)[0]}")
        for topic in topics:
            self._waiting[topic] = deletion
        self._waiting_groups.update(groups)
        self._tasks.add(deletion.task)
        deletion.task.add_done_callback(lambda _: self._forget(deletion))

    def _forget(self, deletion: _Deletion) -> None:
        for topic in deletion.topics:
            if self._waiting.get(topic) is deletion:
                del self._waiting[topic]
        self._waiting_groups.difference_update(deletion.groups)
        if deletion.task is not None:
            self._tasks.discard(deletion.task)

    async def stopped(self, query_ids: list[str], wait_s: float, not_before_s: float = REPORTS_IN_FLIGHT_S) -> bool:
        """Whether, within ``wait_s``, no worker runs any of ``query_ids`` (looking first after ``not_before_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        await asyncio.sleep(not_before_s)
        while any(self.runs(query_id) for query_id in query_ids):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
        return True

    async def settled(self, topic: str) -> bool:
        """Once ``topic`` is not waiting to be deleted (each deletion is bounded); whether it was."""
        deletion = self._waiting.get(topic)
        if deletion is not None and deletion.task is not None:
            await asyncio.wait([deletion.task])
            return True
        return False

    async def _delete_when_stopped(self, deletion: _Deletion, wait_s: float, not_before_s: float) -> None:
        if not await self.stopped(deletion.queries, wait_s, not_before_s):
            log.warning("the queries that used these topics still run; deleting them all the same",
                        extra={"queries": deletion.queries, "waited_s": wait_s, "topics": deletion.topics})
        await self._delete(deletion)

    async def _delete(self, deletion: _Deletion) -> None:
        try:
            await self.delete(deletion.topics, deletion.groups)
        except Exception:
            log.exception("could not delete topics of stopped queries",
                          extra={"queries": deletion.queries, "topics": deletion.topics, "groups": deletion.groups})
        else:
            log.info("deleted topics of stopped queries",
                     extra={"queries": deletion.queries, "topics": deletion.topics, "groups": deletion.groups})

    async def close(self) -> None:
        """Stop waiting (the coordinator is stopping): the topics still waiting are left to the
        next coordinator to start, as a crash leaves them."""
        tasks, self._tasks = self._tasks, set()
        self._waiting, self._waiting_groups = {}, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
