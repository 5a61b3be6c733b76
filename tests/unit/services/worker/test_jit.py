"""The JIT warm-up a worker's Spark session runs before it takes a query."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from millpond.services.worker import jit
from millpond.services.worker import spark as spark_module
from millpond.services.worker.jit import STREAM, TABLE, made_up_records, reduction_runner, warm_up_jit
from millpond.shared.config import WorkerSettings


def test_made_up_records_are_good_records_of_every_partition_and_key(spark: SparkSession, tmp_path: Path) -> None:
    # A warm-up of bad records would compile the processing log's path, not the batches'.
    loop = asyncio.new_event_loop()
    try:
        runner = reduction_runner(spark, WorkerSettings(state_dir=tmp_path), (STREAM, TABLE), loop)
        slices = runner._reduce(made_up_records(spark, 4_000))
    finally:
        loop.close()
    assert sorted(slices) == [0, 1, 2, 3]
    assert sum(piece.count for piece in slices.values()) == 4_000
    assert not any(piece.bad for piece in slices.values())
    keys = {key for piece in slices.values() for key, _ in piece.partials}
    assert len(keys) == 1_000
    # sensor-7's records are ids 7, 1007, 2007 and 3007, all of partition 3: COUNT, AVG(reading), SUM(total), MAX(level)
    (state,) = [state for key, state in slices[3].partials if key == b"sensor-7"]
    assert state[0] == [4] and state[2] == [6_028] and state[3] == [7]
    assert state[1][0] == pytest.approx((7 + 1_007 + 2_007 + 3_007) * 0.25)


def test_warm_up_reduces_its_batches_and_keeps_nothing_cached(spark: SparkSession, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(jit, "BATCH_RECORDS", 2_000)
    monkeypatch.setattr(jit, "TRIGGER_RECORDS", 100)
    settings = WorkerSettings(state_dir=tmp_path, spark_warm_up_batches=3, spark_warm_up_triggers=4)
    with caplog.at_level(logging.INFO, logger=jit.__name__):
        assert warm_up_jit(spark, settings) == 3 * 2_000 + 4 * 100
    assert "Spark warmed up" in caplog.text
    assert spark.sparkContext._jsc.getPersistentRDDs().isEmpty()  # type: ignore[union-attr]
    assert not spark.streams.active  # its streaming query stopped
    assert not any((tmp_path / "worker-1" / "checkpoints").iterdir())  # and its checkpoint went with it
    assert warm_up_jit(spark, WorkerSettings(state_dir=tmp_path, spark_warm_up_batches=0, spark_warm_up_triggers=2)) == 200
    assert warm_up_jit(spark, WorkerSettings(state_dir=tmp_path, spark_warm_up_batches=2,
                                             spark_warm_up_triggers=0)) == 4_000
    assert warm_up_jit(spark, WorkerSettings(state_dir=tmp_path, spark_warm_up_batches=0,
                                             spark_warm_up_triggers=0)) == 0


async def test_the_session_is_handed_out_warmed_up_and_a_failed_warm_up_costs_only_speed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
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


async def test_a_stop_while_the_jit_warms_up_stops_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_a_warm_up_whose_triggers_overrun_fails_and_stops_its_query(spark: SparkSession, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit, "TRIGGERS_TIMEOUT_S", 0)
    settings = WorkerSettings(state_dir=tmp_path, spark_warm_up_batches=0, spark_warm_up_triggers=1_000_000)
    with pytest.raises(TimeoutError, match="of its 1000000 micro-batches"):
        warm_up_jit(spark, settings)
    assert not spark.streams.active


def test_a_cluster_masters_session_is_not_warmed_up() -> None:
    # Its batches run in the executors' JVMs; and a cluster without a free core would hold it.
    settings = WorkerSettings(spark_master="spark://h:7077", spark_warm_up_batches=5, spark_warm_up_triggers=60)
    assert warm_up_jit(object(), settings) == 0  # type: ignore[arg-type]
