"""The router carries a consistency token through a query's stages before its table: each
stage's active tasks asked with WorkerService/StagePositions (real gRPC servers on free
ports, answering as scripted), answers merged and reused, moves and errors handled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull import PullPlan, Replica
from millpond.services.router.pull_routing import PullRouter
from millpond.shared.config import RouterSettings
from millpond.shared.errors import UnavailableError
from millpond.shared.rpc.tls import ChannelFactory
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

Answer = Callable[[worker_pb2.StagePositionsRequest], dict[int, int] | grpc.StatusCode]
"""A worker's script: the output positions for a request, or the status to fail it with."""


class ScriptedWorker(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, answer: Answer):
        self.answer = answer
        self.asked: list[tuple[str, dict[int, int]]] = []

    async def StagePositions(self, request: worker_pb2.StagePositionsRequest,
                             context: grpc.aio.ServicerContext) -> worker_pb2.StagePositionsResponse:
        self.asked.append((request.stage, dict(request.input_offsets)))
        found = self.answer(request)
        if isinstance(found, grpc.StatusCode):
            await context.abort(found, f"scripted {found.name}")
        return worker_pb2.StagePositionsResponse(output_topic="out", output_offsets=found)


@asynccontextmanager
async def workers(*answers: Answer) -> AsyncIterator[tuple[PullRouter, list[ScriptedWorker], list[str]]]:
    """A router (no coordinator) and a scripted worker server per answer."""
    servers, scripted, endpoints = [], [], []
    for answer in answers:
        server = grpc.aio.server()
        worker = ScriptedWorker(answer)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
        endpoints.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        await server.start()
        servers.append(server)
        scripted.append(worker)
    settings = RouterSettings(coordinator="127.0.0.1:1")
    channels = ChannelFactory(None)
    router = PullRouter(settings, None, None, channels, Coordinators(settings, channels),  # type: ignore[arg-type]
                        HostTable(1.0))
    try:
        yield router, scripted, endpoints
    finally:
        await channels.close()
        for server in servers:
            await server.stop(None)


def plan(*upstream: tuple[str, str, str]) -> PullPlan:
    return PullPlan(None, None, [], (), None, None, "table-input", upstream=upstream)  # type: ignore[arg-type]


def ends_of(table: dict[int, dict[int, int]]) -> Answer:
    """Each asked partition's output positions from ``table`` (the worker merges them)."""
    def answer(request: worker_pb2.StagePositionsRequest) -> dict[int, int]:
        out: dict[int, int] = {}
        for partition in request.input_offsets:
            for p, end in table[partition].items():
                out[p] = max(out.get(p, 0), end)
        return out
    return answer


async def test_a_token_is_carried_through_each_stage_to_the_tables_input_and_answers_are_reused() -> None:
    # Partition 0 of every stage on the first worker, partition 1 on the second; the re-key
    # stage writes both partitions of its topic, the join stage partition for partition.
    rekey, join = {0: {0: 10, 1: 4}, 1: {1: 7}}, {0: {0: 30}, 1: {1: 40}}

    def answer(request: worker_pb2.StagePositionsRequest) -> dict[int, int] | grpc.StatusCode:
        return ends_of(rekey if request.stage == "rekey" else join)(request)

    async with workers(answer, answer) as (router, (first, second), (a, b)):
        router.replicas = {"Q": {0: [Replica(a, False), Replica(b, True)], 1: [Replica(b, False)]}}  # standbys: never asked
        stages = plan(("rekey", "src", "rep"), ("join", "rep", "joined"))
        token = {("src", 0): 5, ("src", 1): 9, ("other", 0): 3}
        carried = await router._carry("Q", stages, token, time.monotonic() + 5)
        assert carried == {**token, ("rep", 0): 10, ("rep", 1): 7, ("joined", 0): 30, ("joined", 1): 40}
        assert sorted(first.asked) == [("join", {0: 10}), ("rekey", {0: 5})]
        assert sorted(second.asked) == [("join", {1: 7}), ("rekey", {1: 9})]
        # An offset at or below one asked before is answered by that answer, without a call.
        again = await router._carry("Q", stages, {("src", 0): 4, ("src", 1): 9}, time.monotonic() + 5)
        assert again[("joined", 0)] == 30 and again[("joined", 1)] == 40
        assert len(first.asked) == len(second.asked) == 2
        # A higher one asks again; what it gives is within what the join stage answered before.
        await router._carry("Q", stages, {("src", 0): 6}, time.monotonic() + 5)
        assert first.asked[2:] == [("rekey", {0: 6})] and len(second.asked) == 2


async def test_a_task_not_there_yet_is_asked_again_until_the_deadline() -> None:
    calls: list[float] = []

    def starting(request: worker_pb2.StagePositionsRequest) -> dict[int, int] | grpc.StatusCode:
        calls.append(time.monotonic())
        return grpc.StatusCode.UNAVAILABLE if len(calls) < 3 else {0: 12}

    async with workers(starting, lambda r: grpc.StatusCode.UNAVAILABLE) as (router, _, (a, b)):
        router.replicas = {"Q": {0: [Replica(a, False)], 1: [Replica(b, False)]}}
        stages = plan(("side-0", "left", "joined"))
        assert await router._carry("Q", stages, {("left", 0): 3}, time.monotonic() + 5) == {
            ("left", 0): 3, ("joined", 0): 12}
        assert len(calls) == 3
        with pytest.raises(UnavailableError, match=r"not reached in time by stage 'side-0' of query Q: .*scripted"):
            await router._carry("Q", stages, {("left", 1): 3}, time.monotonic() + 0.5)
        router.replicas = {"Q": {1: [Replica(b, True)]}}
        with pytest.raises(UnavailableError, match="partition 1 has no active task"):
            await router._carry("Q", stages, {("left", 1): 3}, time.monotonic() + 0.3)


@pytest.mark.parametrize(("code", "carried"), [(grpc.StatusCode.UNIMPLEMENTED, True),
                                               (grpc.StatusCode.INVALID_ARGUMENT, False)])
async def test_a_worker_without_the_call_leaves_the_token_as_it_is_and_other_errors_fail(
        code: grpc.StatusCode, carried: bool) -> None:
    async with workers(lambda r: code) as (router, (worker,), (a,)):
        router.replicas = {"Q": {0: [Replica(a, False)]}}
        token: dict[Any, int] = {("left", 0): 3}
        if carried:
            assert await router._carry("Q", plan(("side-0", "left", "joined")), token, time.monotonic() + 5) == token
        else:
            with pytest.raises(UnavailableError, match="answered INVALID_ARGUMENT: scripted INVALID_ARGUMENT"):
                await router._carry("Q", plan(("side-0", "left", "joined")), token, time.monotonic() + 5)
        assert len(worker.asked) == 1


async def test_nothing_is_asked_when_the_token_names_no_stage_input() -> None:
    async with workers(lambda r: {0: 1}) as (router, (worker,), (a,)):
        router.replicas = {"Q": {0: [Replica(a, False)]}}
        token = {("table-input", 0): 8}
        assert await router._carry("Q", plan(("side-0", "left", "joined")), token, time.monotonic() + 5) == token
        await asyncio.sleep(0)
        assert worker.asked == []
