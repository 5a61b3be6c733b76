"""The tests' Spark JVMs map the class-data archive the tests make into the cache: a session
started with it and ``-Xshare:on`` (under which a JVM that cannot map its archive exits
instead of starting without) starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from millpond.deploy.class_archive import spark_class_archive
from tests.conftest import TEST_JAVA_OPTIONS

_START = """
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings
create_session(WorkerSettings(spark_master="local[1]")).stop()
"""


def test_a_spark_session_maps_the_class_archive() -> None:
    archive = spark_class_archive(TEST_JAVA_OPTIONS)
    conf = {"spark.driver.extraJavaOptions": f"{TEST_JAVA_OPTIONS} -Xshare:on -XX:SharedArchiveFile={archive}"}
    env = {**os.environ, "MILLPOND_SPARK_CONF": json.dumps(conf), "PYSPARK_PYTHON": sys.executable}
    started = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Unable to use shared archive" not in started.stderr
