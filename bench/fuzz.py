"""Fuzz every public RPC of a local cluster: fuzzed SQL through the router's ``Execute`` and
``StreamQuery`` (bench/fuzz_sql), then malformed protobuf requests, as raw bytes, at every
method of every service the router and the coordinator serve (bench/fuzz_proto), health
and reflection included. Every answer must be a gRPC status, in time; at the end every
service must still be running, answer a health check and a simple statement, and no
service log may hold an unhandled exception.

The cluster has no workers (no Spark): the coordinator, the router and Kafka. Seeded: the
same ``--seed`` sends the same inputs.

``python -m bench.fuzz [--statements 100000 --messages 10000 --seed 0 --concurrency 16]``
(``--messages`` per RPC; ``--smoke``: 500 statements, 50 messages per RPC). On two cores
statements went at 55 a second (the coordinator runs DDL and INSERTs one at a time, and
pulls of tables without workers wait out the router's timeout) and messages at 190: the
full sizes took 49 minutes (2026-11-25).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from bench.common import arguments, cluster, emit, execute
from bench.fuzz_proto import MessageFuzzer
from bench.fuzz_sql import SOURCES, StatementFuzzer, load_corpus
from millpond.common.v1 import metastore_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.deploy.local.launcher import LocalCluster
from millpond.router.v1 import router_internal_pb2, router_pb2
from millpond.shared.sql.parser import parse_script
from millpond.worker.v1 import worker_pb2

CALL_TIMEOUT_S = 20.0
"""Each call's deadline: an answer later than this is a hung call."""
CLIENT_DEADLINE = "Deadline Exceeded"
"""The details of a DEADLINE_EXCEEDED the client raised itself (a service's own says more)."""
SUSPECT_CODES = ("UNKNOWN", "INTERNAL", "DATA_LOSS", "HUNG")
"""Answers to bad input that are defects: bad input gets a status saying what to fix."""
SAMPLED_CODES = (*SUSPECT_CODES, "DEADLINE_EXCEEDED")
SAMPLES = 3
ROUTER_ENV = {"MILLPOND_REQUEST_TIMEOUT_MS": "3000"}
"""The router gives up on a coordinator call or a pull after 3 s (10 s by default): pulls of
tables with no worker (the cluster has none) wait that long, and would hold every caller."""
SHARED = (metastore_pb2.DESCRIPTOR.services_by_name["MetastoreService"],
          health_pb2.DESCRIPTOR.services_by_name["Health"],
          reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"])
SERVICES: dict[str, tuple[ServiceDescriptor, ...]] = {
    "router": (router_pb2.DESCRIPTOR.services_by_name["RouterService"],
               router_internal_pb2.DESCRIPTOR.services_by_name["RouterInternalService"], *SHARED),
    "coordinator": (coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"], *SHARED),
    "worker": (worker_pb2.DESCRIPTOR.services_by_name["WorkerService"], *SHARED),
}
"""The services each kind of node serves, by the launcher's child names (``worker-N``: worker)."""


@dataclass
class Tally:
    """Answers per RPC: status code counts and a few samples of each suspect code."""

    codes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    samples: dict[str, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, rpc: str, code: str, details: str, sent: str, seconds: float) -> None:
        self.codes[rpc][code] += 1
        self.seconds[rpc].append(seconds)
        if code in SAMPLED_CODES and len(self.samples[rpc]) < SAMPLES:
            self.samples[rpc].append({"code": code, "details": details[:300], "sent": sent[:300]})

    def count(self, *codes: str) -> int:
        return sum(counts[c] for counts in self.codes.values() for c in codes)

    def summary(self) -> dict[str, Any]:
        return {"codes": {rpc: dict(sorted(c.items())) for rpc, c in sorted(self.codes.items())},
                "latency_ms": {rpc: _percentiles(s) for rpc, s in sorted(self.seconds.items())},
                "samples": dict(self.samples)}


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {f"p{p}": round(ordered[min(len(ordered) - 1, len(ordered) * p // 100)] * 1000, 1) for p in (50, 99)} | {
        "max": round(ordered[-1] * 1000, 1)}


async def _once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def call(channel: grpc.aio.Channel, path: str, method: MethodDescriptor, payload: bytes,
               timeout: float = CALL_TIMEOUT_S) -> tuple[str, str]:  # noqa: ASYNC109 (the call's gRPC deadline)
    """Send raw request bytes to ``path``; the status code's name (HUNG for a call that ran
    into the client's own deadline) and details. A server stream that sends a first message
    has answered: it is cancelled and counts as OK."""
    try:
        if method.server_streaming:
            stream: Any = (channel.stream_stream(path)(_once(payload), timeout=timeout) if method.client_streaming
                           else channel.unary_stream(path)(payload, timeout=timeout))
            first = await stream.read()
            if first is not grpc.aio.EOF:
                stream.cancel()
                return "OK", ""
            return (await stream.code()).name, await stream.details() or ""
        if method.client_streaming:
            await channel.stream_unary(path)(_once(payload), timeout=timeout)
        else:
            await channel.unary_unary(path)(payload, timeout=timeout)
        return "OK", ""
    except grpc.aio.AioRpcError as err:
        details = err.details() or ""
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and details == CLIENT_DEADLINE:
            return "HUNG", details
        return err.code().name, details


async def pool(jobs: Iterator[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    """Run ``jobs`` with at most ``concurrency`` at a time."""
    async def runner() -> None:
        for job in jobs:
            await job()
    await asyncio.gather(*(runner() for _ in range(concurrency)))


def _channel(endpoint: str) -> grpc.aio.Channel:
    # The client sends what the services must refuse (messages past their 4 MiB limit).
    return grpc.aio.insecure_channel(endpoint, options=[("grpc.max_send_message_length", -1),
                                                        ("grpc.max_receive_message_length", -1)])


def _properties(fuzzer: StatementFuzzer) -> dict[str, str]:
    """Mostly none; sometimes a known property with an odd value, or an unknown one."""
    rng = fuzzer.rng
    roll = rng.random()
    if roll < 0.85:
        return {}
    if roll < 0.95:
        return {"auto.offset.reset": rng.choice(("earliest", "latest", "", "EARLIEST", "middle", "\x00"))}
    return {fuzzer.statement()[:40]: fuzzer.statement()[:40]}


def _token(fuzzer: StatementFuzzer) -> str:
    rng = fuzzer.rng
    return "" if rng.random() < 0.9 else rng.choice(("x", "!!", "e30=", "eyJ4IjogMX0=", "A" * 1000,
                                                      fuzzer.statement()[:200]))


async def fuzz_statements(router: str, count: int, seed: int, concurrency: int, tally: Tally) -> dict[str, int]:
    """``count`` fuzzed statements through ``Execute`` (most) and ``StreamQuery``; the mutation counts."""
    fuzzer = StatementFuzzer(load_corpus(), seed)
    execute = router_pb2.DESCRIPTOR.services_by_name["RouterService"].methods_by_name["Execute"]
    push = router_pb2.DESCRIPTOR.services_by_name["RouterService"].methods_by_name["StreamQuery"]
    async with _channel(router) as channel:
        def jobs() -> Iterator[Callable[[], Awaitable[None]]]:
            for _ in range(count):
                sql = fuzzer.statement()
                streamed = fuzzer.rng.random() < 0.15
                if streamed and fuzzer.rng.random() < 0.5:
                    sql = sql.rstrip("; ") + " EMIT CHANGES;"
                properties = _properties(fuzzer)
                if streamed:
                    method, payload = push, router_pb2.StreamQueryRequest(sql=sql, properties=properties)
                else:
                    method, payload = execute, router_pb2.ExecuteRequest(sql=sql, properties=properties,
                                                                          consistency_token=_token(fuzzer))
                yield _job(channel, method, payload.SerializeToString(), tally, f"router {method.name}", repr(sql))
        await pool(jobs(), concurrency)
    return dict(sorted(fuzzer.kinds.items()))


def _job(channel: grpc.aio.Channel, method: MethodDescriptor, payload: bytes, tally: Tally, rpc: str,
         sent: str) -> Callable[[], Awaitable[None]]:
    async def job() -> None:
        started = time.monotonic()
        code, details = await call(channel, f"/{method.containing_service.full_name}/{method.name}", method, payload)
        tally.add(rpc, code, details, sent, time.monotonic() - started)
    return job


def targets(local: LocalCluster) -> list[tuple[str, str, MethodDescriptor]]:
    """(node, endpoint, method) for every public method of every running service."""
    out = []
    for child in local.children:
        kind = "worker" if child.name.startswith("worker-") else child.name.rstrip("-0123456789")
        for service in SERVICES.get(kind, ()):
            out += [(child.name, child.endpoint, method) for method in service.methods]
    return out


async def fuzz_messages(local: LocalCluster, per_rpc: int, seed: int, concurrency: int, tally: Tally,
                        oversized: bool = True) -> dict[str, int]:
    """``per_rpc`` malformed requests at every public method, interleaved; the kinds sent."""
    methods = targets(local)
    channels = {endpoint: _channel(endpoint) for _, endpoint, _ in methods}
    fuzzers = [MessageFuzzer(method, seed, oversized) for _, _, method in methods]
    try:
        def jobs() -> Iterator[Callable[[], Awaitable[None]]]:
            for _ in range(per_rpc):
                for (node, endpoint, method), fuzzer in zip(methods, fuzzers, strict=True):
                    kind, payload = fuzzer.message()
                    yield _job(channels[endpoint], method, payload, tally, f"{node} {method.full_name}",
                               f"{kind}: {payload[:120]!r} ({len(payload)} bytes)")
        await pool(jobs(), concurrency)
    finally:
        for channel in channels.values():
            await channel.close()
    kinds: Counter[str] = Counter()
    for fuzzer in fuzzers:
        kinds.update(fuzzer.kinds)
    return dict(sorted(kinds.items()))


async def still_serving(local: LocalCluster) -> dict[str, Any]:
    """Each service's process, health check, and a simple statement through the router and
    at the coordinator."""
    out: dict[str, Any] = {}
    for child in local.children:
        answer: dict[str, Any] = {"running": child.process.poll() is None, "exit_code": child.process.returncode}
        async with _channel(child.endpoint) as channel:
            try:
                health = await channel.unary_unary(
                    "/grpc.health.v1.Health/Check", request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString)(
                        health_pb2.HealthCheckRequest(), timeout=10)
                answer["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
            except grpc.aio.AioRpcError as err:
                answer["health"] = err.code().name
            statement: dict[str, tuple[str, bytes]] = {
                "router": ("/millpond.router.v1.RouterService/Execute",
                           router_pb2.ExecuteRequest(sql="SHOW STREAMS;").SerializeToString()),
                "coordinator": ("/millpond.coordinator.v1.CoordinatorService/ExecuteStatement",
                                coordinator_pb2.ExecuteStatementRequest(sql="SHOW STREAMS;").SerializeToString())}
            if child.name in statement:
                try:
                    await channel.unary_unary(statement[child.name][0])(statement[child.name][1], timeout=30)
                    answer["statement"] = "OK"
                except grpc.aio.AioRpcError as err:
                    answer["statement"] = f"{err.code().name}: {err.details()}"
        answer["ok"] = answer["running"] and answer["health"] == "SERVING" and answer.get("statement", "OK") == "OK"
        out[child.name] = answer
    return out


def logged_exceptions(local: LocalCluster) -> dict[str, Any]:
    """Per service: log entries with a traceback (JSON ``exc``, or a raw ``Traceback`` on
    stderr), and how many entries are at ERROR or above; a few samples."""
    out: dict[str, Any] = {}
    for child in local.children:
        tracebacks, errors, samples = 0, 0, Counter[str]()
        for line in child.log.read_text(errors="replace").splitlines():
            entry: dict[str, Any] = {}
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = {}
            errors += entry.get("level") in ("ERROR", "CRITICAL")
            if "exc" in entry or "Traceback (most recent call last)" in line:
                tracebacks += 1
                last = str(entry.get("exc", line)).strip().splitlines()[-1:]
                samples[f"{str(entry.get('msg', ''))[:200]}: {last[0][:300] if last else ''}"] += 1
        out[child.name] = {"tracebacks": tracebacks, "error_entries": errors, "distinct": dict(samples.most_common(10))}
    return out


def run(local: LocalCluster, statements: int, messages: int, seed: int = 0, concurrency: int = 16,
        oversized: bool = True) -> dict[str, Any]:
    """Fuzz ``local`` (statements first, then ``messages`` per RPC) and check what is left standing."""
    started = time.monotonic()
    statement_tally, message_tally = Tally(), Tally()
    mutations = asyncio.run(fuzz_statements(local.router, statements, seed, concurrency, statement_tally))
    statements_s = time.monotonic() - started
    kinds = asyncio.run(fuzz_messages(local, messages, seed, concurrency, message_tally, oversized))
    messages_s = time.monotonic() - started - statements_s
    serving = asyncio.run(still_serving(local))
    logs = logged_exceptions(local)
    rpcs = len(message_tally.codes)
    return {
        "crashes": sum(not s["running"] for s in serving.values()),
        "hung_calls": statement_tally.count("HUNG") + message_tally.count("HUNG"),
        "suspect_answers": statement_tally.count(*SUSPECT_CODES[:-1]) + message_tally.count(*SUSPECT_CODES[:-1]),
        "unhandled_exceptions_in_logs": sum(entry["tracebacks"] for entry in logs.values()),
        "all_serving": all(s["ok"] for s in serving.values()),
        "statements": {"sent": statements, "seed": seed, "mutations": mutations, "seconds": round(statements_s, 1),
                       **statement_tally.summary()},
        "messages": {"per_rpc": messages, "rpcs": rpcs, "sent": messages * rpcs, "kinds": kinds,
                     "seconds": round(messages_s, 1), **message_tally.summary()},
        "services": serving,
        "logs": logs,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def prepare(local: LocalCluster) -> None:
    """The readings example's stream, inserts and table, so fuzzed statements find real sources."""
    for statement in parse_script(SOURCES[1].read_text()):  # one per request: each has the router's timeout
        execute(local, statement.text)


def main() -> None:
    args = arguments(__doc__, statements=100_000, messages=10_000, seed=0, concurrency=16)
    if args.smoke:
        args.statements, args.messages = 500, 50
    started = time.monotonic()
    with cluster(workers=0, router_env=ROUTER_ENV) as local:
        prepare(local)
        result = run(local, args.statements, args.messages, args.seed, args.concurrency)
    emit({"benchmark": "fuzz", "smoke": args.smoke, "router_env": ROUTER_ENV, **result,
          "wall_s_with_cluster": round(time.monotonic() - started, 1)})


if __name__ == "__main__":
    main()
