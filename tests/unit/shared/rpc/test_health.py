"""The health service answers ``List`` with every service's status (the library's asyncio
servicer leaves it unimplemented), and a graceful shutdown lists them NOT_SERVING."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millpond.shared.rpc.health import HealthServicer

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def test_list_answers_every_services_status_through_a_shutdown() -> None:
    servicer = HealthServicer()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await servicer.set("", SERVING)
            await servicer.set("millpond.router.v1.RouterService", NOT_SERVING)
            listed = await stub.List(health_pb2.HealthListRequest(), timeout=5)
            assert {n: s.status for n, s in listed.statuses.items()} == {
                "": SERVING, "millpond.router.v1.RouterService": NOT_SERVING}
            await servicer.enter_graceful_shutdown()
            await servicer.set("", SERVING)  # ignored from now on
            listed = await stub.List(health_pb2.HealthListRequest(), timeout=5)
            assert {s.status for s in listed.statuses.values()} == {NOT_SERVING}
            assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == NOT_SERVING
    finally:
        await server.stop(None)
