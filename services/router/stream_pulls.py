"""Pull queries over streams (ksqlDB's) at the router: each reads its stream's records as a push
query does (``PushQuery.rows_to_end``), from the beginning of each partition to where it ends
when the pull begins, and answers with the rows, bounded as a table's scan is."""

from __future__ import annotations

import asyncio
import itertools
import time

from millpond.services.router.pull import HeldRows
from millpond.services.router.push import PushQuery
from millpond.shared import consistency
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import RouterSettings
from millpond.shared.errors import ErrorKind, LimitError, MillpondError, UnavailableError
from millpond.shared.results import Outcome, row_bytes
from millpond.shared.sql import ast
from millpond.shared.sql.planner import plan_select

_ids = itertools.count(1)


class StreamPulls:
    """Answers pull queries over streams; at most ``max_push_queries`` read at once (each holds a
    Kafka reader while it runs, as a push query does)."""

    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.running = 0

    async def answer(self, stmt: ast.Query, source: DataSource, positions: consistency.Positions,
                     deadline: float) -> Outcome:
        """The rows of ``stmt`` over the stream ``source``: its records up to each partition's end
        when the pull begins, once that end has reached the token's ``positions`` on its topic
        (waited for as long as a table pull's copy waits: an INSERT acknowledged before is read).
        Its rows are bounded as a table's scan's (``max_rows_per_response``) and by the
        response's size (``max_message_bytes``), the read by ``deadline``."""
        plan = plan_select(stmt, source)
        outcome = Outcome(stmt.text, status="", columns=[(n, str(t)) for n, t in plan.columns])
        if plan.limit == 0:
            return outcome
        if self.running >= self.settings.max_push_queries:
            raise UnavailableError(f"this router already reads {self.running} streams for pull queries (its limit, "
                                   "max_push_queries); try another router or later")
        scan = PushQuery(plan, self.settings.kafka, from_beginning=True, query_id=f"PULL_{next(_ids)}")
        at_least = {partition: offset for (topic, partition), offset in positions.items() if topic == source.topic}
        wait_s = min(deadline - time.monotonic(), self.settings.pull_host_timeout_ms / 1000)  # as a table pull's copies
        rows, held = HeldRows(self.settings.max_rows_per_response), 0

        async def read() -> None:
            nonlocal held
            await scan.start()
            async for row in scan.rows_to_end(at_least, wait_s):
                rows.add(1)
                held += row_bytes(row)
                if held > self.settings.max_message_bytes:
                    raise LimitError(f"the rows of {source.name} pass {self.settings.max_message_bytes} bytes, the most "
                                     "one response may carry (max_message_bytes): add a LIMIT or a WHERE, or stream "
                                     "them with a push query (EMIT CHANGES)")
                outcome.rows.append(row)

        self.running += 1
        try:
            await asyncio.wait_for(read(), timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise MillpondError(f"{source.name}'s records could not all be read within the request's time: add a "
                                "LIMIT, give the request a longer deadline, or stream them with a push query "
                                "(EMIT CHANGES)", kind=ErrorKind.DEADLINE) from None
        finally:
            self.running -= 1
            await scan.stop()
        return outcome
