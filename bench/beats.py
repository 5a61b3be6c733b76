"""What one heartbeat stream costs: the CPU of a gRPC aio client (as a worker) and of its
server (as a coordinator or a router, in a process of its own) over one long-lived
stream-stream call carrying a heartbeat (a ``HeartbeatsRequest`` with 12 store lags) every
``--interval-ms``, against the same stream open and quiet, and against HTTP/2 keepalive
pings from the server at that interval instead of messages (gRPC's C core answers those
without Python: the cheaper liveness signal, if it were one).

A worker keeps one such stream to every coordinator and one to every router, so its idle
CPU has this floor per peer; the figures tell how much of ``bench.idle``'s per-worker
figure the heartbeats are, and what a longer interval or a transport ping would save.

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
from millpond.shared.events import wait_at_most
from millpond.shared.net import free_port

METHOD = "/bench.Beats/Beats"
MODES = ("quiet", "beats", "pings")


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


def measured(mode: str, interval_ms: int, seconds: float) -> dict[str, Any]:
    """A server of its own for ``mode``, and this process as its client for ``seconds``."""
    port = free_port()
    ping_ms = interval_ms if mode == "pings" else 0
    server = subprocess.Popen([sys.executable, "-m", "bench.beats", "--serve", str(port), "--ping-ms", str(ping_ms)])
    try:
        return asyncio.run(measure(mode, port, psutil.Process(server.pid), interval_ms, seconds))
    finally:
        server.kill()
        server.wait(10)


async def measure(mode: str, port: int, server: psutil.Process, interval_ms: int, seconds: float) -> dict[str, Any]:
    """This process as a client of ``server`` for ``seconds``."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.max_pings_without_data", 0)])
    stop = asyncio.Event()
    message = beat()

    async def beats() -> Any:
        while mode == "beats" and not stop.is_set():
            yield message
            await wait_at_most(stop, interval_ms / 1000)  # as a worker's beat loop pauses
        await stop.wait()  # quiet: the stream stays open, and nothing wakes this side

    try:
        await asyncio.wait_for(channel.channel_ready(), 30)
        call = channel.stream_stream(METHOD, request_serializer=coordinator_pb2.HeartbeatsRequest.SerializeToString)(beats())
        answers = asyncio.ensure_future(call.read())
        await asyncio.sleep(3)  # the stream set up, the server's imports done
        client = psutil.Process()
        at, client_at, server_at = time.monotonic(), cpu(client), cpu(server)
        await asyncio.sleep(seconds)
        span = time.monotonic() - at
        if answers.done():  # the stream must have stayed open throughout (the server took every beat)
            raise SystemExit(f"the {mode} stream ended early: {answers.exception()!r}")
        result = {"mode": mode, "client_cpu_core_fraction": round((cpu(client) - client_at) / span, 4),
                  "server_cpu_core_fraction": round((cpu(server) - server_at) / span, 4)}
        stop.set()
        answers.cancel()
        call.cancel()
    finally:
        await channel.close()
    return result


def main() -> None:
    args = arguments(__doc__, seconds=30.0, interval_ms=100, rounds=2, serve=0, ping_ms=0)
    if args.serve:
        asyncio.run(serve(args.serve, args.ping_ms))
        return
    seconds, rounds = (2.0, 1) if args.smoke else (args.seconds, args.rounds)
    runs = [measured(mode, args.interval_ms, seconds) for _ in range(rounds) for mode in MODES]

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
                                         median("beats", "server") - median("quiet", "server"))})


if __name__ == "__main__":
    main()
