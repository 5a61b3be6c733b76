"""A small client of the router's gRPC API, with a session's properties (as ksqlDB's CLI:
``SET`` and ``UNSET`` change the properties sent with every later statement)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from millpond.common.v1 import metastore_pb2, metastore_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.shared.kafka.serde import from_proto
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import outcome_from_proto
from millpond.shared.rpc.tls import ClientCredentials
from millpond.shared.session import apply_session_statement
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_script

PLAINTEXT = ClientCredentials()


class RouterClient:
    """Runs statements through the router."""

    def __init__(self, server: str, timeout: float = 60.0, credentials: ClientCredentials = PLAINTEXT):
        self.channel = credentials.channel(server)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.timeout = timeout
        self.properties: dict[str, str] = {}
        self.token = ""
        """The newest consistency token: sent with every request, so the session reads its own
        writes and never sees older state than it saw before."""

    def execute(self, sql: str) -> list[Outcome]:
        """Execute statements with the session's properties and token; raises
        ``grpc.RpcError`` with the server's status on failure."""
        response = self.stub.Execute(router_pb2.ExecuteRequest(sql=sql, properties=self.properties,
                                                               consistency_token=self.token), timeout=self.timeout)
        outcomes = [outcome_from_proto(r) for r in response.results]
        for outcome in outcomes:
            self.token = outcome.consistency_token or self.token
        return outcomes

    def stream(self, sql: str, timeout: float | None = None) -> PushStream:
        """Start a push query; iterate the result for rows, ``cancel`` to stop it."""
        call = self.stub.StreamQuery(router_pb2.StreamQueryRequest(sql=sql, properties=self.properties),
                                     timeout=timeout)
        return PushStream(call)

    def run_script(self, text: str) -> Iterator[Outcome | PushStream]:
        """Run statements one at a time; SET and UNSET change this session only; a push
        query (or PRINT) yields its stream."""
        for stmt in parse_script(text):
            changed = apply_session_statement(self.properties, stmt)
            if changed is not None:
                yield Outcome(stmt.text, f"{changed} for this session")
            elif (isinstance(stmt, ast.Query) and stmt.emit_changes) or isinstance(stmt, ast.PrintTopic):
                yield self.stream(stmt.text)
            else:
                yield from self.execute(stmt.text)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


class PushStream:
    """A running push query: its columns, then rows as they arrive."""

    def __init__(self, call: Any):
        self.call = call
        header = next(call).header
        self.query_id: str = header.query_id
        self.columns = [(c.name, c.type) for c in header.columns]

    def __iter__(self) -> Iterator[list[Any]]:
        for message in self.call:
            yield [from_proto(v) for v in message.row.values]

    def cancel(self) -> None:
        """Stop the query (the router stops reading for it)."""
        self.call.cancel()


def metastore_digest(endpoint: str, timeout: float = 30.0,
                     credentials: ClientCredentials = PLAINTEXT) -> metastore_pb2.GetMetastoreDigestResponse:
    """Any node's metastore digest, after it caught up with the command topic."""
    with credentials.channel(endpoint) as channel:
        stub = metastore_pb2_grpc.MetastoreServiceStub(channel)
        response: metastore_pb2.GetMetastoreDigestResponse = stub.GetMetastoreDigest(
            metastore_pb2.GetMetastoreDigestRequest(catch_up=True), timeout=timeout)
        return response
