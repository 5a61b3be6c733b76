"""A small client of the router's gRPC API, with a session's properties (as ksqlDB's CLI:
``SET`` and ``UNSET`` change the properties sent with every later statement)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from millpond.common.v1 import metastore_pb2, metastore_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc

from shared.results import Outcome
from shared.session import apply_session_statement
from shared.sql.parser import parse_script


class RouterClient:
    """Runs statements through the router."""

    def __init__(self, server: str, timeout: float = 60.0):
        self.channel = grpc.insecure_channel(server)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.timeout = timeout
        self.properties: dict[str, str] = {}

    def execute(self, sql: str) -> list[Outcome]:
        """Execute statements with the session's properties; raises ``grpc.RpcError`` with the
        server's status on failure."""
        response = self.stub.Execute(router_pb2.ExecuteRequest(sql=sql, properties=self.properties),
                                     timeout=self.timeout)
        return [Outcome.from_proto(r) for r in response.results]

    def run_script(self, text: str) -> Iterator[Outcome]:
        """Run statements one at a time; SET and UNSET change this session only."""
        for stmt in parse_script(text):
            changed = apply_session_statement(self.properties, stmt)
            if changed is not None:
                yield Outcome(stmt.text, f"{changed} for this session")
            else:
                yield from self.execute(stmt.text)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def metastore_digest(endpoint: str, timeout: float = 30.0) -> metastore_pb2.GetMetastoreDigestResponse:
    """Any node's metastore digest, after it caught up with the command topic."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = metastore_pb2_grpc.MetastoreServiceStub(channel)
        response: metastore_pb2.GetMetastoreDigestResponse = stub.GetMetastoreDigest(
            metastore_pb2.GetMetastoreDigestRequest(catch_up=True), timeout=timeout)
        return response
