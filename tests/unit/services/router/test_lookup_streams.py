"""Key lookups over a worker's LookupStream, router and worker over real gRPC on a loopback
port: concurrent lookups share messages and each gets its own answer (also when the worker
splits the answers); a lookup's error is its own; one not answered in time is an
UnavailableError and gives its stream up, the next lookup opening another; a stream that
fails, with whatever status, fails what it carried over to the next copy; a lookup given up
before it left is not sent; lookups that come while a message is unanswered leave together;
a worker of an earlier version is asked its unary Lookup; closing fails what waits and
refuses what comes; a stopping worker ends its streams at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from millpond.services.router import lookup_streams
from millpond.services.router.lookup_streams import LookupStreams
from millpond.services.worker import servicer as worker_servicer
from millpond.services.worker.servicer import WorkerServicer
from millpond.services.worker.serving import LocalCopy
from millpond.shared.errors import ErrorKind, MillpondError, NotFoundError, UnavailableError
from millpond.shared.kafka.serde import from_proto
from millpond.shared.rpc.tls import ChannelFactory
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

SERVICE = "millpond.worker.v1.WorkerService"


class Store:
    def __init__(self, rows: dict[bytes, bytes]):
        self.rows = rows

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)


class Tables:
    """Table T: keys k0..k999 in every partition, each row [key, its number]; partition 9
    is not here, table GONE does not exist."""

    def __init__(self) -> None:
        self.store = Store({f"k{i}".encode(): str(i).encode() for i in range(1000)})

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        if table != "T":
            raise NotFoundError(f"{table} does not exist")
        if partition == 9:
            raise UnavailableError(f"partition 9 of {table} is not active on worker w")
        return LocalCopy(self.store, row, 40 + partition)  # type: ignore[arg-type]


def row(key: bytes, state: Any) -> list[Any]:
    return [key.decode(), int(state)]


def request(key: str, partition: int = 0, table: str = "T") -> worker_pb2.LookupRequest:
    return worker_pb2.LookupRequest(table=table, partition=partition, key=key.encode())


def values(response: worker_pb2.LookupResponse) -> list[Any]:
    return [from_proto(v) for v in response.row.values]


async def serving(handlers: list[grpc.GenericRpcHandler] | None = None, servicer: WorkerServicer | None = None
                  ) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    if servicer is not None:
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers(handlers or ())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def with_worker(servicer: WorkerServicer | None, handlers: list[grpc.GenericRpcHandler] | None,
                      body: Callable[[LookupStreams, str], Awaitable[None]],
                      servers: list[grpc.aio.Server] | None = None) -> None:
    """``body`` with a router's lookup streams and a worker's endpoint (its server appended to ``servers``)."""
    server, endpoint = await serving(handlers, servicer)
    if servers is not None:
        servers.append(server)
    streams = LookupStreams(ChannelFactory(None))
    try:
        await body(streams, endpoint)
    finally:
        await streams.close()
        await streams.channels.close()
        await server.stop(None)


def stream_handler(handle: Callable[[AsyncIterator[worker_pb2.LookupStreamRequest], Any], AsyncIterator[Any]]
                   ) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(SERVICE, {"LookupStream": grpc.stream_stream_rpc_method_handler(
        handle, request_deserializer=worker_pb2.LookupStreamRequest.FromString,
        response_serializer=worker_pb2.LookupStreamResponse.SerializeToString)})


def counted_batches(servicer: WorkerServicer) -> list[int]:
    """How many lookups each LookupStream message to ``servicer`` carried, as they come."""
    batches: list[int] = []
    answers = servicer.answers

    def counted(batch: worker_pb2.LookupStreamRequest) -> Any:
        batches.append(len(batch.lookups))
        return answers(batch)

    servicer.answers = counted  # type: ignore[method-assign]
    return batches


@pytest.mark.parametrize("answers_bytes", [worker_servicer.ANSWERS_BYTES, 200])
def test_concurrent_lookups_share_messages_and_each_gets_its_own_answer(answers_bytes: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_servicer, "ANSWERS_BYTES", answers_bytes)  # 200: answers split across messages
    servicer = WorkerServicer(Tables(), 100)  # type: ignore[arg-type]
    batches = counted_batches(servicer)

    async def body(streams: LookupStreams, endpoint: str) -> None:
        found = await asyncio.gather(*(streams.lookup(endpoint, request(f"k{i}", i % 4), 5) for i in range(500)))
        assert [values(r) for r in found] == [[f"k{i}", i] for i in range(500)]
        assert [r.input_offset for r in found] == [40 + i % 4 for i in range(500)]
        missing = await streams.lookup(endpoint, request("nope"), 5)
        assert not missing.found and missing.input_offset == 40

    asyncio.run(with_worker(servicer, None, body))
    assert sum(batches) == 501
    assert len(batches) < 20, batches  # many to a message, not a message each


def test_each_lookup_has_its_own_error() -> None:
    async def body(streams: LookupStreams, endpoint: str) -> None:
        ok, unavailable, missing = await asyncio.gather(
            streams.lookup(endpoint, request("k7"), 5), streams.lookup(endpoint, request("k7", 9), 5),
            streams.lookup(endpoint, request("k7", table="GONE"), 5), return_exceptions=True)
        assert isinstance(ok, worker_pb2.LookupResponse) and values(ok) == ["k7", 7]
        assert isinstance(unavailable, UnavailableError) and "not active on worker w" in unavailable.message
        assert isinstance(missing, MillpondError) and missing.kind == ErrorKind.NOT_FOUND
        assert missing.message == "GONE does not exist"

    asyncio.run(with_worker(WorkerServicer(Tables(), 100), None, body))  # type: ignore[arg-type]


def test_a_late_answer_finds_no_one_and_the_next_lookup_gets_its_own() -> None:
    async def slow_first(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for batch in batches:
            if batch.lookups[0].key == b"k1":
                await asyncio.sleep(0.3)
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(found=True, input_offset=int(r.key[1:])))
                for r in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        with pytest.raises(UnavailableError, match=r"no answer from .* within 100 ms"):
            await streams.lookup(endpoint, request("k1"), 0.1)
        assert (await streams.lookup(endpoint, request("k2"), 5)).input_offset == 2
        await asyncio.sleep(0.3)  # k1's answer has come and gone
        assert (await streams.lookup(endpoint, request("k3"), 5)).input_offset == 3

    asyncio.run(with_worker(None, [stream_handler(slow_first)], body))


def test_a_lookup_with_little_time_left_fails_alone_and_the_stream_serves_the_others() -> None:
    """One client's short deadline is not the stream's: its lookup fails as UnavailableError,
    the others on the same stream are answered, and the stream is not opened again."""
    calls = 0

    async def answers_in_30_ms(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        nonlocal calls
        calls += 1
        await context.send_initial_metadata(())
        async for batch in batches:
            await asyncio.sleep(0.03)
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(found=True, input_offset=int(r.key[1:])))
                for r in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        assert (await streams.lookup(endpoint, request("k0"), 1.0, 1.0)).input_offset == 0  # the stream is open
        patient = [asyncio.ensure_future(streams.lookup(endpoint, request(f"k{i}"), 1.0, 1.0)) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(UnavailableError, match="within 5 ms"):
            await streams.lookup(endpoint, request("k3"), 0.005, 1.0)
        assert [r.input_offset for r in await asyncio.gather(*patient)] == [1, 2]
        assert calls == 1

    asyncio.run(with_worker(None, [stream_handler(answers_in_30_ms)], body))


def test_a_failed_stream_fails_what_it_carried_and_the_next_lookup_opens_another() -> None:
    calls = 0

    async def fails_first(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        nonlocal calls
        calls += 1
        async for batch in batches:
            if calls == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "worker going away")
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(input_offset=7)) for _ in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        started = time.monotonic()
        failed = await asyncio.gather(*(streams.lookup(endpoint, request("k1"), 5) for _ in range(3)),
                                      return_exceptions=True)
        assert all(isinstance(f, UnavailableError) and "worker going away" in f.message for f in failed), failed
        assert time.monotonic() - started < 2  # at once, not at their timeout
        assert (await streams.lookup(endpoint, request("k1"), 5)).input_offset == 7
        assert calls == 2

    asyncio.run(with_worker(None, [stream_handler(fails_first)], body))


def test_a_worker_without_lookup_streams_is_asked_its_unary_lookup() -> None:
    asked: list[bytes] = []

    async def lookup(req: worker_pb2.LookupRequest, context: Any) -> worker_pb2.LookupResponse:
        asked.append(req.key)
        return worker_pb2.LookupResponse(found=True, input_offset=5)

    earlier = grpc.method_handlers_generic_handler(SERVICE, {"Lookup": grpc.unary_unary_rpc_method_handler(
        lookup, request_deserializer=worker_pb2.LookupRequest.FromString,
        response_serializer=worker_pb2.LookupResponse.SerializeToString)})

    async def body(streams: LookupStreams, endpoint: str) -> None:
        first = await asyncio.gather(*(streams.lookup(endpoint, request(f"k{i}"), 5) for i in range(3)))
        assert [r.input_offset for r in first] == [5, 5, 5]
        assert (await streams.lookup(endpoint, request("k9"), 5)).found

    asyncio.run(with_worker(None, [earlier], body))
    assert sorted(asked) == [b"k0", b"k1", b"k2", b"k9"]


def test_large_answers_are_split_across_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_servicer, "ANSWERS_BYTES", 40)
    servicer = WorkerServicer(Tables(), 100)  # type: ignore[arg-type]
    batch = worker_pb2.LookupStreamRequest(ids=range(100, 110), lookups=[request(f"k{i}", 9 if i == 3 else 0) for i in range(10)])
    messages = list(servicer.answers(batch))
    assert len(messages) > 2
    numbered = [(i, a) for m in messages for i, a in zip(m.ids, m.answers, strict=True)]
    assert [n for n, _ in numbered] == list(range(100, 110))
    assert [a.code for _, a in numbered] == [0, 0, 0, 14, 0, 0, 0, 0, 0, 0]
    assert [from_proto(a.response.row.values[1]) for n, a in numbered if n != 103] == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_a_stopping_worker_ends_its_lookup_streams_at_once() -> None:
    servicer = WorkerServicer(Tables(), 100)  # type: ignore[arg-type]

    async def body(streams: LookupStreams, endpoint: str) -> None:
        assert values(await streams.lookup(endpoint, request("k1"), 5)) == ["k1", 1]
        server = servers[0]
        servicer.end_lookup_streams()
        started = time.monotonic()
        await server.stop(10)  # would wait all 10 s for a stream still open
        assert time.monotonic() - started < 2
        with pytest.raises(UnavailableError):
            await streams.lookup(endpoint, request("k1"), 5)

    servers: list[grpc.aio.Server] = []
    asyncio.run(with_worker(servicer, None, body, servers))


def test_max_batch_bounds_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup_streams, "MAX_BATCH", 7)
    sizes: list[int] = []

    async def echo(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for batch in batches:
            sizes.append(len(batch.lookups))
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(input_offset=int(r.key[1:])))
                for r in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        found = await asyncio.gather(*(streams.lookup(endpoint, request(f"k{i}"), 5) for i in range(50)))
        assert [r.input_offset for r in found] == list(range(50))

    asyncio.run(with_worker(None, [stream_handler(echo)], body))
    assert sum(sizes) == 50 and max(sizes) <= 7


def test_lookups_that_come_while_a_message_is_unanswered_leave_together() -> None:
    sizes: list[int] = []

    async def slow(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for batch in batches:
            sizes.append(len(batch.lookups))
            await asyncio.sleep(0.2)
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(input_offset=int(r.key[1:])))
                for r in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        first = asyncio.create_task(streams.lookup(endpoint, request("k0"), 5))
        await asyncio.sleep(0.02)  # k0 is sent and not yet answered
        later = []
        for i in range(1, 11):  # one by one, while k0's answer is awaited
            later.append(asyncio.create_task(streams.lookup(endpoint, request(f"k{i}"), 5)))
            await asyncio.sleep(0.005)
        rest = await asyncio.gather(*later)
        assert (await first).input_offset == 0
        assert [r.input_offset for r in rest] == list(range(1, 11))

    asyncio.run(with_worker(None, [stream_handler(slow)], body))
    assert sizes == [1, 10]


def test_a_stream_failing_with_any_status_fails_over() -> None:
    async def broken(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for _ in batches:
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        yield worker_pb2.LookupStreamResponse()

    async def body(streams: LookupStreams, endpoint: str) -> None:
        with pytest.raises(UnavailableError, match="Internal error from Core"):
            await streams.lookup(endpoint, request("k1"), 5)

    asyncio.run(with_worker(None, [stream_handler(broken)], body))


def test_a_stream_whose_message_goes_unanswered_past_the_timeout_is_given_up() -> None:
    calls = 0

    async def hangs_first(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        nonlocal calls
        calls += 1
        call = calls
        await context.send_initial_metadata(())
        async for batch in batches:
            if call == 1:
                await asyncio.sleep(30)  # a worker that has stopped answering on a live connection
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(input_offset=9)) for _ in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        with pytest.raises(UnavailableError, match="within 100 ms"):
            await streams.lookup(endpoint, request("k1"), 0.1)
        assert (await streams.lookup(endpoint, request("k2"), 5)).input_offset == 9
        assert calls == 2

    asyncio.run(with_worker(None, [stream_handler(hangs_first)], body))


def test_a_lookup_abandoned_before_it_left_is_not_sent() -> None:
    sent: list[list[bytes]] = []

    async def slow(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for batch in batches:
            sent.append([r.key for r in batch.lookups])
            await asyncio.sleep(0.3 if len(sent) == 1 else 0)
            yield worker_pb2.LookupStreamResponse(ids=batch.ids, answers=[
                worker_pb2.LookupAnswer(response=worker_pb2.LookupResponse(input_offset=int(r.key[1:])))
                for r in batch.lookups])

    async def body(streams: LookupStreams, endpoint: str) -> None:
        first = asyncio.create_task(streams.lookup(endpoint, request("k0"), 5))
        await asyncio.sleep(0.05)
        k1 = asyncio.create_task(streams.lookup(endpoint, request("k1"), 5))
        await asyncio.sleep(0.05)
        k1.cancel()  # its caller gives up while k0 is unanswered
        with pytest.raises(asyncio.CancelledError):
            await k1
        assert (await streams.lookup(endpoint, request("k2"), 5)).input_offset == 2
        assert (await first).input_offset == 0

    asyncio.run(with_worker(None, [stream_handler(slow)], body))
    assert sent == [[b"k0"], [b"k2"]]


def test_closing_fails_what_waits_and_refuses_what_comes() -> None:
    async def silent(batches: AsyncIterator[worker_pb2.LookupStreamRequest], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for _ in batches:
            await asyncio.sleep(30)
        yield worker_pb2.LookupStreamResponse()

    async def body(streams: LookupStreams, endpoint: str) -> None:
        waiting = asyncio.create_task(streams.lookup(endpoint, request("k1"), 5))
        await asyncio.sleep(0.1)
        await streams.close()
        with pytest.raises(UnavailableError, match="given up"):
            await waiting
        with pytest.raises(UnavailableError, match="stopping"):
            await streams.lookup(endpoint, request("k1"), 5)

    asyncio.run(with_worker(None, [stream_handler(silent)], body))


class WaitingTables(Tables):
    """Tables whose copies reach any token they are given time to wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[tuple[int, float]] = []

    async def reached_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int,
                            wait_s: float) -> LocalCopy:
        self.waited.append((min_input_offset, wait_s))
        copy = self.local_table(table, partition, allow_standby)
        return LocalCopy(copy.store, copy.row, max(copy.input_offset, min_input_offset))


def test_a_lookup_that_may_wait_for_its_token_goes_alone_as_a_unary_lookup() -> None:
    """A stream answers its lookups in order, at once, so a lookup that may wait goes as a
    unary Lookup of its own (which waits for it), not over the stream."""
    tables = WaitingTables()
    servicer = WorkerServicer(tables, 100)  # type: ignore[arg-type]
    streamed = counted_batches(servicer)

    async def body(streams: LookupStreams, endpoint: str) -> None:
        plain = await streams.lookup(endpoint, request("k1"), 5)
        waited = await streams.lookup(endpoint, worker_pb2.LookupRequest(
            table="T", partition=0, key=b"k2", min_input_offset=70, wait_ms=800), 5)
        assert values(plain) == ["k1", 1] and values(waited) == ["k2", 2] and waited.input_offset == 70

    asyncio.run(with_worker(servicer, None, body))
    assert streamed == [1] and tables.waited == [(70, 0.8)]
