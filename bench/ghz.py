"""ghz, the compiled gRPC load generator, for the pull benchmarks: a Python client saturates
before the router does, so QPS measured with one says more about the client than the server.

``ghz_binary()`` installs it once with ``go install`` (through the Go module proxy) into the
cache; ``load()`` runs it against one method for a while at a concurrency and reads its JSON
report, with the CPU time ghz used (on a small machine it shares the cores with the servers).
Methods are described to it by a protoset made from the generated modules.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from millpond.deploy.jars import build_once, cache_root
from millpond.shared.errors import SetupError

MODULE = "github.com/bojand/ghz/cmd/ghz"
VERSION = "v0.121.0"
"""Pinned; the module proxy's @latest answers v0.93.0 (the list stops where go.mod appeared)."""


_CUT_AT_END = ("use of closed network connection", "transport is closing", "context canceled",
               "the client connection is closing")


def ghz_binary(cache: Path | None = None) -> Path:
    """The ghz executable, built once into the cache."""
    def install(staging: Path) -> None:
        go = shutil.which("go")
        if go is None:
            raise SetupError("Go is not on PATH; the pull benchmarks install ghz with `go install` (Go 1.22 or newer)")
        result = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], capture_output=True, text=True, check=False,
                                env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"}, timeout=900)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise SetupError(f"go install {MODULE}@{VERSION} failed:\n{tail}")

    return build_once((cache or cache_root()) / "tools" / f"ghz-{VERSION}", install) / "ghz"


def protoset(*files: FileDescriptor) -> bytes:
    """A FileDescriptorSet of ``files`` and everything they import, dependencies first (what
    ``protoc --include_imports --descriptor_set_out`` writes)."""
    out, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(file: FileDescriptor) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(out.file.add())

    for file in files:
        add(file)
    return bytes(out.SerializeToString())


def load(target: str, method: str, service: FileDescriptor, data: list[dict[str, Any]] | dict[str, Any],
         concurrency: int, seconds: float) -> dict[str, Any]:
    """``concurrency`` workers calling ``method`` (``package.Service/Method``, defined in
    ``service``) of ``target`` back to back for ``seconds`` over one connection; a list of
    requests is sent round robin. QPS, latency percentiles in ms and the status codes."""
    with tempfile.TemporaryDirectory(prefix="ghz-") as workdir:
        data_file, protos = Path(workdir) / "data.json", Path(workdir) / "service.protoset"
        data_file.write_text(json.dumps(data))
        protos.write_bytes(protoset(service))
        command = [str(ghz_binary()), "--insecure", "--protoset", str(protos), "--call", method, "-D", str(data_file),
                   "-c", str(concurrency), "-z", f"{seconds}s", "--connections", "1", "--timeout", "10s",
                   "--format", "json", target]
        before = children_cpu_seconds()
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=seconds + 120)
        used = children_cpu_seconds() - before
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"ghz against {method} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return {**summary(json.loads(result.stdout), concurrency), "ghz_cpu_s": round(used, 3)}


def children_cpu_seconds() -> float:
    """CPU seconds (user and system) of this process's ended and reaped children so far: around
    one ghz run, what ghz used (the cluster's processes end only when it stops)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summary(report: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """What a ghz JSON report says about throughput, latency and errors."""
    percentiles = {entry["percentage"]: entry["latency"] / 1e6 for entry in report.get("latencyDistribution") or []}
    codes = report.get("statusCodeDistribution") or {}
    # When the duration ends ghz closes its connection under the calls in flight (at most one
    # per worker): those are its own, not the server's.
    cut = min(concurrency, sum(n for message, n in (report.get("errorDistribution") or {}).items()
                               if any(sign in message for sign in _CUT_AT_END)))
    return {"concurrency": concurrency, "qps": round(report["rps"], 1), "count": report["count"],
            "errors": sum(n for code, n in codes.items() if code != "OK") - cut, "cut_at_end": cut,
            "status_codes": codes, "error_messages": report.get("errorDistribution") or {},
            "p50_ms": round(percentiles.get(50, 0.0), 3), "p99_ms": round(percentiles.get(99, 0.0), 3),
            "mean_ms": round(report.get("average", 0) / 1e6, 3), "max_ms": round(report.get("slowest", 0) / 1e6, 3)}
