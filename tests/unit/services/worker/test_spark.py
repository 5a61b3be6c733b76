"""How many threads a worker gives Spark (ksqlDB's num.stream.threads), and its start."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from millpond.services.worker import spark
from millpond.services.worker.spark import parallelism
from millpond.shared.config import WorkerSettings


def test_spark_cores_sets_local_threads_or_the_cluster_core_cap() -> None:
    assert parallelism(WorkerSettings(spark_master="local[1]")) == ("local[1]", {"spark.sql.shuffle.partitions": "2"})
    assert parallelism(WorkerSettings(spark_master="local[1]", spark_cores=3)) == (
        "local[3]", {"spark.sql.shuffle.partitions": "3"})
    assert parallelism(WorkerSettings(spark_master="spark://h:7077", spark_cores=4)) == (
        "spark://h:7077", {"spark.sql.shuffle.partitions": "4", "spark.cores.max": "4"})


async def test_warm_up_tries_again_until_the_session_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Until it starts the worker is offered no active, so no task would ever start it.
    attempts: list[int] = []

    def create(settings: WorkerSettings) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.")
        return "session"

    monkeypatch.setattr(spark, "create_session", create)
    lazy = spark.LazySession(WorkerSettings())
    assert not lazy.ready
    await asyncio.wait_for(lazy.warm_up(), timeout=10)
    assert lazy.ready and len(attempts) == 2
