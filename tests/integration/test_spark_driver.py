"""A worker's Spark driver that dies, its JVM killed or its SparkContext stopped by an error
Spark cannot go on from, is replaced by a new driver in the same process, whose queries call
back into it as the first one's did (real JVMs, local[1])."""

from __future__ import annotations

import threading
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from millpond.services.worker.query_runner import for_each_batch
from millpond.services.worker.spark import LazySession, driver_alive
from millpond.shared.config import WorkerSettings


async def test_a_killed_or_stopped_driver_is_replaced_by_a_session_that_runs_queries(tmp_path: Path) -> None:
    lazy = LazySession(WorkerSettings(worker_id="driver-test", spark_master="local[1]", state_dir=tmp_path,
                                      spark_warm_up_batches=0, spark_warm_up_triggers=0))
    try:
        first = await lazy.get()
        assert first.range(3).count() == 3 and driver_alive(first)
        jvm = first.sparkContext._gateway.proc  # type: ignore[union-attr]
        jvm.kill()  # a crash of the JVM: what the worker's calls into it then meet is a refused connection
        jvm.wait(10)
        assert not driver_alive(first)
        second = await lazy.get()
        assert second is not first and lazy.replaced == 1 and lazy.ready
        assert second.range(4).count() == 4 and batches_reach_python(second)

        # What Spark does after an error it cannot go on from (e.g. its scheduler's loop dying
        # of a StackOverflowError): the context stops, the JVM runs on.
        second.sparkContext._jsc.sc().stop()  # type: ignore[union-attr]
        stopped = second.sparkContext._gateway.proc  # type: ignore[union-attr]
        assert stopped.poll() is None and not driver_alive(second)
        third = await lazy.get()
        assert lazy.replaced == 2 and third.range(5).count() == 5
        assert stopped.poll() is not None  # that JVM is not left behind
    finally:
        await lazy.stop()


def batches_reach_python(session: SparkSession) -> bool:
    """Whether a streaming query's foreachBatch calls reach this process (PySpark's callback
    server, which a new gateway starts anew)."""
    seen: list[int] = []
    got = threading.Event()

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        seen.append(batch.count())
        if sum(seen):
            got.set()

    rows = session.readStream.format("rate").option("rowsPerSecond", 20).load()
    query = for_each_batch(rows.writeStream, session, on_batch).start()
    try:
        return got.wait(timeout=60)
    finally:
        query.stop()
