"""Where the router's and the worker's CPU goes while they answer pull queries: py-spy
samples both processes during key lookups at a fixed concurrency, and the busy samples
are summed per function (self time, the frame that was running) and per area (our code,
gRPC, protobuf, asyncio, ...; inclusive time of our own modules).

py-spy cannot see inside C extensions: a thread blocked in epoll or in gRPC's C poller
looks busy to it, so samples whose innermost Python frame is a selector's ``select`` or a
bare ``Thread.run`` count as waiting, and the shares are of the other (busy) samples.
Samples that end in ``Handle._run`` are callbacks running in C: gRPC's Cython layer and
asyncio's C tasks.

``python -m bench.profile_pulls [--seconds 15 --concurrency 16]``; writes the folded
stacks (for a flame graph) next to the JSON when ``--out`` names a folder.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc

from bench.common import arguments, cluster, create_average, create_readings, emit, key_name, produce_readings, wait_caught_up
from bench.pull_queries import closed_loop
from shared.kafka import end_offsets

PARTITIONS = 4
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
WAITING = ("EpollSelector.select", "_PollLikeSelector.select", "Thread.run")
AREAS = (("millpond", re.compile(r"^(services|shared|cli)/")), ("grpc", re.compile(r"grpc")),
         ("protobuf", re.compile(r"protobuf")), ("asyncio", re.compile(r"asyncio/")),
         ("logging", re.compile(r"logging/")), ("prometheus", re.compile(r"prometheus")))


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: `make install` installs the dev extras")
    return found


def fold(path: Path) -> tuple[int, int, Counter[str], Counter[str], Counter[str]]:
    """From py-spy's raw (folded) output: the sample count, the busy ones, and of those the
    self samples per function, inclusive samples per Millpond function, and self samples
    per area."""
    total, busy, own, inclusive, areas = 0, 0, Counter[str](), Counter[str](), Counter[str]()
    root = str(Path(__file__).resolve().parent.parent) + "/"
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = []
        for raw in stack.split(";"):
            match = FRAME.match(raw)
            function, file = (match["function"], match["file"]) if match else (raw, "")
            frames.append((function, file.replace(root, "")))
        function, file = frames[-1]
        if function in WAITING:
            continue
        busy += n
        own[f"{function} ({file})"] += n
        if function == "Handle._run":
            areas["C callbacks (gRPC Cython, asyncio)"] += n
        else:
            areas[next((name for name, pattern in AREAS if pattern.search(file)), "other")] += n
        for function, file in {f for f in frames if AREAS[0][1].match(f[1])}:
            inclusive[f"{function} ({file})"] += n
    return total, busy, own, inclusive, areas


def share(counter: Counter[str], total: int, top: int) -> dict[str, float]:
    return {name: round(100 * n / max(total, 1), 1) for name, n in counter.most_common(top)}


async def load(router: str, keys: int, concurrency: int, seconds: float) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(router) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        statements = [f"SELECT * FROM avg_readings WHERE sensor = '{key_name(k)}';" for k in range(keys)]

        async def lookup(i: int) -> None:
            await stub.Execute(router_pb2.ExecuteRequest(sql=statements[i % keys]), timeout=10)

        await closed_loop(lookup, 4, 2)  # warm the plan cache and the channels
        return await closed_loop(lookup, concurrency, seconds)


def main() -> None:
    args = arguments(__doc__, seconds=15.0, concurrency=16, keys=1000, out="")
    if args.smoke:
        args.seconds, args.keys = 2.0, 50
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="millpond-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with cluster(workers=1, worker_env={"MILLPOND_TRIGGER_INTERVAL_MS": "100"}) as local:
        create_readings(local, "readings", PARTITIONS)
        asyncio.run(produce_readings(local.bootstrap, "readings", args.keys, args.keys, PARTITIONS))
        ends = asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS))
        wait_caught_up(local, create_average(local, "readings", "avg_readings"), ends)
        services = {c.name: c.process.pid for c in local.children if c.name in ("router", "worker-1")}
        samplers = {name: subprocess.Popen(
            [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--rate", "250", "--nonblocking",
             "--duration", str(int(args.seconds) + 3), "--output", str(out / f"{name}.folded")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in services.items()}
        try:
            pulls = asyncio.run(load(local.router, args.keys, args.concurrency, args.seconds))
            for sampler in samplers.values():
                sampler.wait(timeout=60)
        finally:
            for sampler in samplers.values():
                if sampler.poll() is None:
                    sampler.kill()
    result: dict[str, Any] = {"benchmark": "profile_pulls", "smoke": args.smoke, "pulls": pulls}
    for name, sampler in samplers.items():
        folded = out / f"{name}.folded"
        if not folded.exists():
            err = sampler.stderr.read().decode(errors="replace") if sampler.stderr else ""
            raise SystemExit(f"py-spy wrote no profile of {name}: {err.strip()[-500:]}")
        total, busy, own, inclusive, areas = fold(folded)
        result[name] = {"samples": total, "busy_samples": busy, "self_pct_by_area": share(areas, busy, 10),
                        "self_pct_top_functions": share(own, busy, 12),
                        "inclusive_pct_millpond_functions": share(inclusive, busy, 12)}
        if args.out:
            result[name]["folded"] = str(folded)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    emit(result)


if __name__ == "__main__":
    main()
