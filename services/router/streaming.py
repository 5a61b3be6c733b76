"""The push queries this router streams, with the per-router and per-client limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from millpond.services.router.push import PRINT_COLUMNS, PushHeader, PushQuery, TopicPrint
from millpond.shared import metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import LimitError, StatementError, UnavailableError
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.session import AUTO_OFFSET_RESET, check_properties, effective
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.guard import StatementParser
from millpond.shared.sql.planner import plan_select


class PushQueries:
    """Starts, streams and stops push queries."""

    def __init__(self, settings: RouterSettings, metastore: Metastore, reader: CommandReader,
                 parser: StatementParser):
        self.settings = settings
        self.parser = parser
        self.metastore = metastore
        self.reader = reader
        self.pushes: dict[str, PushQuery | TopicPrint] = {}
        """The push queries (and PRINTs) this router streams now, by id."""
        self._clients: dict[str, str] = {}
        """Push query id -> the client streaming it."""

    async def stream(self, sql: str, properties: dict[str, str], client: str) -> AsyncIterator[PushHeader | list[Any]]:
        """Run one push query, or one PRINT, for ``client`` (who asks, for the per-client limit): a
        header, then its rows as they happen."""
        session = dict(properties)
        check_properties(session)
        statements = await self.parser.parse(sql)
        if len(statements) != 1 or not (isinstance(statements[0], ast.PrintTopic) or (
                isinstance(statements[0], ast.Query) and statements[0].emit_changes)):
            raise StatementError("StreamQuery takes exactly one push query, SELECT ... FROM ... EMIT CHANGES, or one PRINT "
                                 "'topic'")
        stmt = statements[0]
        if not isinstance(stmt, ast.PrintTopic):
            if stmt.source not in self.metastore.sources or custom_types.missing(stmt, self.metastore.types):
                await self.reader.catch_up()  # made just before
            source = self.metastore.source(stmt.source)
            stmt = custom_types.resolved(stmt, self.metastore.types)
        if len(self.pushes) >= self.settings.max_push_queries:
            raise UnavailableError(f"this router already streams {len(self.pushes)} push queries (its limit, "
                                   "max_push_queries); try another router or later")
        mine = sum(c == client for c in self._clients.values())
        if mine >= self.settings.max_push_queries_per_client:
            raise LimitError(f"{client} already runs {mine} push queries on this router, the most one client may "
                             "(max_push_queries_per_client); cancel one first")
        push: PushQuery | TopicPrint
        if isinstance(stmt, ast.PrintTopic):
            push = TopicPrint(stmt, self.settings.kafka)
            header, limit = PushHeader(push.query_id, PRINT_COLUMNS), stmt.limit
        else:
            push = PushQuery(plan_select(stmt, source), self.settings.kafka,
                             from_beginning=effective(session).get(AUTO_OFFSET_RESET) == "earliest")
            header, limit = PushHeader(push.query_id, [(n, str(t)) for n, t in push.plan.columns]), push.plan.limit
        self.pushes[push.query_id] = push
        self._clients[push.query_id] = client
        metrics.PUSH_QUERIES.set(len(self.pushes))
        try:
            if limit == 0:  # the header, then the end: no reader to open
                yield header
                return
            await push.start()
            yield header
            async for row in push.rows():
                yield row
                metrics.PUSH_ROWS.inc()
        finally:
            del self.pushes[push.query_id]
            del self._clients[push.query_id]
            metrics.PUSH_QUERIES.set(len(self.pushes))
            await push.stop()
