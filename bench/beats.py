"""What one heartbeat stream costs: the CPU of a gRPC aio client (as a worker) and of its
server (as a coordinator or a router, in a process of its own) over one long-lived
stream-stream call carrying a heartbeat (a ``HeartbeatsRequest`` with 12 store lags) every
``--interval-ms``, against the same stream open and quiet, and against HTTP/2 keepalive
pings from the server at that interval instead of messages (gRPC's C core answers those
without Python: the cheaper liveness signal, if it were one).

A worker keeps one such stream to every coordinator and one to every router, so its idle
CPU has this floor per peer; the figures tell how much of ``bench.idle``'s per-worker
figure the heartbeats are, and what a longer interval or a transport ping would save.
Two more modes beat two servers from the one client, as a worker beats a coordinator and a
router: ``pair_apart``, each stream pausing an interval after its own beat, the second's
beats half an interval after the first's (a worker's streams before the fifty-third session,
at the worst offset); ``pair_grid``, both pausing until the next tick of one grid (a worker's
now): the servers' figure is their mean.

``python -m bench.beats [--seconds 30 --interval-ms 100]``
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import grpc
import psutil

from bench.common import arguments, emit, ratio
from millpond.coordinator.v1 import coordinator_pb2
from millpond.shared.events import until_next_tick, wait_at_most
from millpond.shared.net import free_port

METHOD = "/bench.Beats/Beats"
MODES = ("quiet", "beats", "pings", "pair_apart", "pair_grid")


def beat() -> coordinator_pb2.HeartbeatsRequest:
    """About an idle worker's beat of the benchmarks' clusters: 6 active and 6 standby copies."""
    lags = [coordinator_pb2.StoreLag(active=i < 6, current_offset=250_000 + i, end_offset=250_000 + i,
                                     last_applied_ms=1_764_000_000_000 + i, input_offset=500_000 + i) for i in range(12)]
    return coordinator_pb2.HeartbeatsRequest(beat=coordinator_pb2.HeartbeatRequest(
        worker_id="worker-1", endpoint="127.0.0.1:50051", known_generation=12, lags=lags))


async def serve(port: int, ping_ms: int) -> None:
    """A server that takes beat streams (and pings its clients every ``ping_ms``, if set)."""

    async def beats(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            pass
        return
        yield  # a stream-stream handler that answers nothing

    options = [("grpc.keepalive_time_ms", ping_ms), ("grpc.keepalive_timeout_ms", 1000),
               ("grpc.http2.max_pings_without_data", 0)] if ping_ms else []
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Beats", {
        "Beats": grpc.stream_stream_rpc_method_handler(beats, request_deserializer=coordinator_pb2.HeartbeatsRequest.FromString)})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def cpu(process: psutil.Process) -> float:
    return float(sum(process.cpu_times()[:2]))


def measured(mode: str, interval_ms: int, seconds: float, settle_s: float = 3.0) -> dict[str, Any]:
    """A server of its own for each stream of ``mode``, and this process as their client for ``seconds``."""
    ports = [free_port() for _ in range(2 if mode.startswith("pair") else 1)]
    ping_ms = interval_ms if mode == "pings" else 0
    servers = [subprocess.Popen([sys.executable, "-m", "bench.beats", "--serve", str(port), "--ping-ms", str(ping_ms)])
               for port in ports]
    try:
        return asyncio.run(measure(mode, ports, [psutil.Process(s.pid) for s in servers], interval_ms, seconds, settle_s))
    finally:
        for server in servers:
            server.kill()
            server.wait(10)


async def measure(mode: str, ports: list[int], servers: list[psutil.Process], interval_ms: int,
                  seconds: float, settle_s: float) -> dict[str, Any]:
    """This process as a client of ``servers`` (a stream to each) for ``seconds``."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.max_pings_without_data", 0)])
                for port in ports]
    stop = asyncio.Event()
    message = beat()
    interval = interval_ms / 1000

    async def beats(index: int) -> Any:
        if mode == "pair_apart":
            await asyncio.sleep(index * interval / 2)
        while mode in ("beats", "pair_apart", "pair_grid") and not stop.is_set():
            yield message
            # As a worker's beat loop pauses: on one grid (now), or an interval after its beat (before).
            await wait_at_most(stop, until_next_tick(interval) if mode == "pair_grid" else interval)
        await stop.wait()  # quiet: the stream stays open, and nothing wakes this side

    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), 30)
        calls = [channel.stream_stream(METHOD, request_serializer=coordinator_pb2.HeartbeatsRequest.SerializeToString)(
            beats(index)) for index, channel in enumerate(channels)]
        answers = [asyncio.ensure_future(call.read()) for call in calls]
        await asyncio.sleep(settle_s)  # the streams set up, the servers' imports done
        client = psutil.Process()
        at, client_at, servers_at = time.monotonic(), cpu(client), [cpu(server) for server in servers]
        await asyncio.sleep(seconds)
        span = time.monotonic() - at
        for answer in answers:  # the streams must have stayed open throughout (the servers took every beat)
            if answer.done():
                raise SystemExit(f"a {mode} stream ended early: {answer.exception()!r}")
        server_cpu = statistics.mean(cpu(server) - before for server, before in zip(servers, servers_at, strict=True))
        result = {"mode": mode, "client_cpu_core_fraction": round((cpu(client) - client_at) / span, 4),
                  "server_cpu_core_fraction": round(server_cpu / span, 4)}
        stop.set()
        for answer, call in zip(answers, calls, strict=True):
            answer.cancel()
            call.cancel()
    finally:
        for channel in channels:
            await channel.close()
    return result


def main() -> None:
    args = arguments(__doc__, seconds=30.0, interval_ms=100, rounds=2, serve=0, ping_ms=0)
    if args.serve:
        asyncio.run(serve(args.serve, args.ping_ms))
        return
    seconds, rounds, settle_s = (2.0, 1, 0.5) if args.smoke else (args.seconds, args.rounds, 3.0)
    runs = [measured(mode, args.interval_ms, seconds, settle_s) for _ in range(rounds) for mode in MODES]

    def median(mode: str, side: str) -> float:
        return round(float(statistics.median(r[f"{side}_cpu_core_fraction"] for r in runs if r["mode"] == mode)), 5)

    emit({"benchmark": "beats", "smoke": args.smoke, "interval_ms": args.interval_ms, "seconds": seconds, "runs": runs,
          **{f"{mode}_{side}_cpu_core_fraction": median(mode, side) for mode in MODES for side in ("client", "server")},
          # What the beats (or the pings) add to an open, quiet stream, per side:
          **{f"{mode}_added_{side}_cpu_core_fraction": round(median(mode, side) - median("quiet", side), 4)
             for mode in ("beats", "pings") for side in ("client", "server")},
          "pings_vs_beats_client": ratio(median("pings", "client") - median("quiet", "client"),
                                         median("beats", "client") - median("quiet", "client")),
          "pings_vs_beats_server": ratio(median("pings", "server") - median("quiet", "server"),
                                         median("beats", "server") - median("quiet", "server")),
          # Two streams on one grid against two apart (a worker's beats to a coordinator and a router):
          "pair_grid_vs_apart_client": ratio(median("pair_grid", "client"), median("pair_apart", "client")),
          "pair_grid_vs_apart_server": ratio(median("pair_grid", "server"), median("pair_apart", "server"))})


if __name__ == "__main__":
    main()
