"""Deletes a terminated query's internal topics once no worker runs the query.

A TERMINATE is appended before any worker has heard of it; deleting the query's
repartition and changelog topics then pulls them from under a batch still committing to
them (in a fresh-clone CI, that worker's Spark query then took its whole 30 s bound to
stop). So the topics go once no live worker reports a task of the query (running or still
stopping) or a store copy of it, or after ``wait_s`` whatever the reports say: a worker's
stop is bounded by less, and a worker cut off from the coordinator does not keep them
forever. A coordinator that stops deletes what is still waiting at once; one that starts
deletes what a coordinator gone before it left (``StatementExecutor.delete_left_topics``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

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
"""The longest a DROP ... DELETE TOPIC waits for its query's workers before it deletes the
topic all the same (it deletes the topic before it answers: a CREATE right after it may name
the same topic; a statement has 60 s in all)."""
REPORTS_GRACE_S = 5.0
"""How long a coordinator that starts hears its workers' reports before it deletes a terminated
query's topics that were left (the workers beat every coordinator every 100 ms)."""


class QueryTopicCleanup:
    """The terminated queries' internal topics waiting for their workers to stop."""

    def __init__(self, delete: Callable[[list[str]], Awaitable[None]], runs: Callable[[str], bool],
                 wait_s: float = WAIT_S, poll_s: float = POLL_S):
        self.delete = delete
        self.runs = runs
        """Whether a live worker still reports the query (``Cluster.runs``)."""
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._waiting: dict[str, tuple[list[str], asyncio.Task[None]]] = {}

    @property
    def waiting(self) -> dict[str, list[str]]:
        """Query id -> its topics not deleted yet."""
        return {query_id: topics for query_id, (topics, _) in self._waiting.items()}

    def after_stopped(self, query_id: str, topics: list[str], not_before_s: float = REPORTS_IN_FLIGHT_S) -> None:
        """Delete ``topics`` once no worker runs ``query_id``, looking first after ``not_before_s``
        (a coordinator that just started has not heard from every worker yet)."""
        if not topics or query_id in self._waiting:
            return
        task = asyncio.create_task(self._delete_when_stopped(query_id, topics, not_before_s),
                                   name=f"delete-topics-{query_id}")
        self._waiting[query_id] = topics, task
        task.add_done_callback(lambda done: self._forget(query_id, done))

    def _forget(self, query_id: str, done: asyncio.Task[None]) -> None:
        current = self._waiting.get(query_id)
        if current is not None and current[1] is done:
            del self._waiting[query_id]

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

    async def _delete_when_stopped(self, query_id: str, topics: list[str], not_before_s: float) -> None:
        if not await self.stopped([query_id], self.wait_s, not_before_s):
            log.warning("a terminated query's workers still report it; deleting its topics all the same",
                        extra={"query": query_id, "waited_s": self.wait_s, "topics": topics})
        await self._delete(query_id, topics)

    async def _delete(self, query_id: str, topics: list[str]) -> None:
        try:
            await self.delete(topics)
        except Exception:
            log.exception("could not delete a terminated query's topics", extra={"query": query_id, "topics": topics})
        else:
            log.info("deleted a terminated query's topics", extra={"query": query_id, "topics": topics})

    async def close(self) -> None:
        """Delete every waiting query's topics now (the coordinator is stopping)."""
        waiting, self._waiting = self._waiting, {}
        for _, task in waiting.values():
            task.cancel()
        await asyncio.gather(*(task for _, task in waiting.values()), return_exceptions=True)
        for query_id, (topics, _) in waiting.items():
            await self._delete(query_id, topics)
