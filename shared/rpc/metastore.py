"""The ``MetastoreService`` every node serves: the digest of its replayed metastore."""

from __future__ import annotations

import grpc

from millpond.common.v1 import metastore_pb2, metastore_pb2_grpc
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.rpc.server import Registrar
from millpond.shared.rpc.status import grpc_errors

SERVICE_NAME = metastore_pb2.DESCRIPTOR.services_by_name["MetastoreService"].full_name


class MetastoreServicer(metastore_pb2_grpc.MetastoreServiceServicer):
    """Answers with the node's metastore digest, optionally after catching up."""

    def __init__(self, reader: CommandReader, node: str):
        self.reader = reader
        self.node = node

    @grpc_errors
    async def GetMetastoreDigest(self, request: metastore_pb2.GetMetastoreDigestRequest,
                                 context: grpc.aio.ServicerContext) -> metastore_pb2.GetMetastoreDigestResponse:
        if request.catch_up:
            await self.reader.catch_up()
        metastore = self.reader.metastore
        return metastore_pb2.GetMetastoreDigestResponse(
            digest=metastore.digest(), command_offset=metastore.command_offset, node=self.node,
            sources=len(metastore.sources), queries=len(metastore.queries),
            failed_commands=len(metastore.failed_commands),
            errors=[f"{name}: {error}" for name, error in sorted(metastore.errors.items())],
        )


def metastore_registrar(reader: CommandReader, node: str) -> Registrar:
    """Adds the ``MetastoreService`` for ``reader``'s metastore to a server."""
    return lambda server: metastore_pb2_grpc.add_MetastoreServiceServicer_to_server(
        MetastoreServicer(reader, node), server)
