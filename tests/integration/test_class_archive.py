"""The Spark JVMs map the class-data archive made for them into the cache: a session started
with it and ``-Xshare:on`` (under which a JVM that cannot map its archive exits instead of
starting without) starts. The tests' archive: a local cluster's workers start with one made
the same way for their own options (``LocalCluster``), which a test making it would cost CI
another 20-30 s and 150 MB of cache on every fresh clone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from millpond.deploy.class_archive import spark_env_with_archive
from tests.conftest import TEST_JAVA_OPTIONS

_START = """
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings
create_session(WorkerSettings(spark_master="local[1]")).stop()
"""


def test_a_spark_session_maps_its_class_archive() -> None:
    made = spark_env_with_archive(TEST_JAVA_OPTIONS)  # with the Spark home it was made for
    conf = json.loads(made["MILLPOND_SPARK_CONF"])
    conf["spark.driver.extraJavaOptions"] += " -Xshare:on"
    env = {**os.environ, **made, "MILLPOND_SPARK_CONF": json.dumps(conf), "PYSPARK_PYTHON": sys.executable}
    started = subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Unable to use shared archive" not in started.stderr
