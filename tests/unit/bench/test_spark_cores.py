"""How many stream threads the Kafka Streams baseline gets: the Spark cores each worker
gives its queries, read from the environment the launcher started it with."""

from __future__ import annotations

import os

import pytest

from bench.common import worker_spark_cores


@pytest.mark.parametrize(("env", "cores"), [
    ({"MILLPOND_SPARK_MASTER": "local[1]"}, 1),
    ({"MILLPOND_SPARK_MASTER": "local[3]"}, 3),
    ({"MILLPOND_SPARK_MASTER": "local[2, 4]"}, 2),
    ({"MILLPOND_SPARK_MASTER": "local"}, 1),
    ({"MILLPOND_SPARK_MASTER": "local[*]"}, os.cpu_count()),
    ({}, 2),  # the worker's default master, local[2]
    ({"MILLPOND_SPARK_MASTER": "local[1]", "MILLPOND_SPARK_CORES": "4"}, 4),
    ({"MILLPOND_SPARK_MASTER": "spark://host:7077", "MILLPOND_SPARK_CORES": "6"}, 6),
    ({"MILLPOND_SPARK_MASTER": "local[3]", "MILLPOND_SPARK_CORES": "0"}, 3),
])
def test_cores_as_the_worker_reads_them(env: dict[str, str], cores: int) -> None:
    assert worker_spark_cores(env) == cores


def test_a_cluster_master_without_a_core_count_is_refused() -> None:
    with pytest.raises(ValueError, match="MILLPOND_SPARK_CORES"):
        worker_spark_cores({"MILLPOND_SPARK_MASTER": "spark://host:7077"})
