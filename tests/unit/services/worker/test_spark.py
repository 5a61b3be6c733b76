"""How many threads a worker gives Spark (ksqlDB's num.stream.threads), its start, and its
local file system."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from millpond.services.worker import spark as spark_module
from millpond.services.worker.spark import LOCAL_FILE_SYSTEM, parallelism
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

    monkeypatch.setattr(spark_module, "create_session", create)
    lazy = spark_module.LazySession(WorkerSettings())
    assert not lazy.ready
    await asyncio.wait_for(lazy.warm_up(), timeout=10)
    assert lazy.ready and len(attempts) == 2


@pytest.mark.parametrize("mode", [0o640, 0o755, 0o600, 0o444, 0o1644])
def test_the_sessions_local_file_system_sets_permissions_itself(spark: SparkSession, tmp_path: Path, mode: int) -> None:
    # Hadoop's own forks /bin/chmod per file; the extension's sets the same bits by a system call.
    jvm = spark.sparkContext._jvm
    fs_package = jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
    path = fs_package.Path((tmp_path / "file").as_uri())
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    assert fs.getClass().getName() == LOCAL_FILE_SYSTEM
    out = fs.create(path, True)
    out.write(bytearray(b"checkpoint"))
    out.close()
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o644  # Hadoop's default, less the umask
    fs.setPermission(path, fs_package.permission.FsPermission(f"{mode:o}"))
    assert (tmp_path / "file").stat().st_mode & 0o7777 == mode  # the sticky bit too (by chmod: no java.nio form)
    assert (tmp_path / ".file.crc").stat().st_mode & 0o7777 == mode  # the checksum's too
    assert (tmp_path / "file").read_bytes() == b"checkpoint"
