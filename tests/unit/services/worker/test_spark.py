"""How many threads a worker gives Spark (ksqlDB's num.stream.threads)."""

from __future__ import annotations

from millpond.services.worker.spark import parallelism
from millpond.shared.config import WorkerSettings


def test_spark_cores_sets_local_threads_or_the_cluster_core_cap() -> None:
    assert parallelism(WorkerSettings(spark_master="local[1]")) == ("local[1]", {"spark.sql.shuffle.partitions": "2"})
    assert parallelism(WorkerSettings(spark_master="local[1]", spark_cores=3)) == (
        "local[3]", {"spark.sql.shuffle.partitions": "3"})
    assert parallelism(WorkerSettings(spark_master="spark://h:7077", spark_cores=4)) == (
        "spark://h:7077", {"spark.sql.shuffle.partitions": "4", "spark.cores.max": "4"})
