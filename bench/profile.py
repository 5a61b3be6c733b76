"""Where a service's CPU goes, from py-spy samples of its process: the busy samples summed
per function (self time, the frame that was running) and per area (our code, gRPC,
protobuf, asyncio, ...; inclusive time of our own modules). bench/pull_queries uses it
on the router and the worker during a pull load.

py-spy cannot see inside C extensions: a thread blocked in epoll or in gRPC's C poller
looks busy to it, so samples whose innermost Python frame is a selector's ``select`` or a
bare ``Thread.run`` count as waiting, and the shares are of the other (busy) samples.
Samples that end in ``Handle._run`` are callbacks running in C: gRPC's Cython layer and
asyncio's C tasks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def _repository_path(file: str, root: str) -> str:
    """A frame's file as a path in the repository: Millpond's modules load through
    src/millpond (the namespace's links), and py-spy shortens a file under a sys.path entry to
    the module path (``millpond/services/router/app.py``)."""
    return file.replace(root, "").removeprefix("src/").removeprefix("millpond/")


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
            frames.append((function, _repository_path(file, root)))
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


@contextmanager
def sampled(pids: dict[str, int], seconds: float) -> Iterator[dict[str, Any]]:
    """py-spy records each named process for ``seconds`` from entry; on exit (after the
    recording ends) the dict holds each one's summary."""
    out = Path(tempfile.mkdtemp(prefix="millpond-profile-"))
    samplers = {name: subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--rate", "250", "--nonblocking",
         "--duration", str(max(int(seconds), 1)), "--output", str(out / f"{name}.folded")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in pids.items()}
    summaries: dict[str, Any] = {}
    try:
        yield summaries
        for name, sampler in samplers.items():
            _, err = sampler.communicate(timeout=seconds + 60)
            folded = out / f"{name}.folded"
            if not folded.exists():
                raise SystemExit(f"py-spy wrote no profile of {name}: {err.decode(errors='replace').strip()[-500:]}")
            total, busy, own, inclusive, areas = fold(folded)
            summaries[name] = {"samples": total, "busy_samples": busy, "self_pct_by_area": share(areas, busy, 10),
                               "self_pct_top_functions": share(own, busy, 12),
                               "inclusive_pct_millpond_functions": share(inclusive, busy, 12)}
    finally:
        for sampler in samplers.values():
            if sampler.poll() is None:
                sampler.kill()
        shutil.rmtree(out, ignore_errors=True)
