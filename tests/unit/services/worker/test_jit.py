"""The JIT warm-up a worker's Spark session runs before it takes a query: when it runs, and what
a failed or stopped one costs (tests/integration/test_jit_warm_up.py runs it for real)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from millpond.services.worker import spark as spark_module
from millpond.services.worker.jit import warm_up_jit
from millpond.shared.config import WorkerSettings


async def test_the_session_is_handed_out_warmed_up_and_a_failed_warm_up_costs_only_speed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, dead_drivers: set[object]) -> None:
    # Not ready while it warms up: the worker then offers no copy to take an active over.
    seen: list[tuple[Any, bool]] = []
    monkeypatch.setattr(spark_module, "create_session", lambda settings: "session")
    monkeypatch.setattr(spark_module, "warm_up_jit", lambda session, settings: seen.append((session, lazy.ready)))
    lazy = spark_module.LazySession(WorkerSettings())
    assert await asyncio.wait_for(lazy.get(), timeout=10) == "session"
    assert seen == [("session", False)] and lazy.ready
    assert await asyncio.wait_for(lazy.get(), timeout=10) == "session" and len(seen) == 1  # once

    def fail(session: Any, settings: WorkerSettings) -> None:
        raise RuntimeError("no memory")

    monkeypatch.setattr(spark_module, "warm_up_jit", fail)
    lazy = spark_module.LazySession(WorkerSettings())
    assert await asyncio.wait_for(lazy.get(), timeout=10) == "session"
    assert lazy.ready and "warm-up failed" in caplog.text


async def test_a_stop_while_the_jit_warms_up_stops_the_session(monkeypatch: pytest.MonkeyPatch,
                                                                dead_drivers: set[object]) -> None:
    # Else the warm-up's thread would run on, and the process could not exit before it ends.
    stopped, warming = threading.Event(), threading.Event()

    class Session:
        def stop(self) -> None:
            stopped.set()

    def warm(session: Any, settings: WorkerSettings) -> None:
        warming.set()
        if not stopped.wait(timeout=10):
            raise AssertionError("the session was not stopped")
        raise RuntimeError("SparkContext was shut down")  # what its job then raises

    monkeypatch.setattr(spark_module, "create_session", lambda settings: Session())
    monkeypatch.setattr(spark_module, "warm_up_jit", warm)
    lazy = spark_module.LazySession(WorkerSettings())
    getting = asyncio.create_task(lazy.get())
    assert await asyncio.to_thread(warming.wait, 10)
    await asyncio.wait_for(lazy.stop(), timeout=10)
    assert stopped.is_set()
    await asyncio.wait_for(getting, timeout=10)


def test_a_cluster_masters_session_is_not_warmed_up() -> None:
    # Its batches run in the executors' JVMs; and a cluster without a free core would hold it.
    settings = WorkerSettings(spark_master="spark://h:7077", spark_warm_up_batches=5, spark_warm_up_triggers=60)
    assert warm_up_jit(object(), settings) == 0  # type: ignore[arg-type]
