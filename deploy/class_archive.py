"""A class-data archive (Java's AppCDS) for the workers' Spark JVMs.

A Spark driver loads and verifies some ten thousand classes before its first job; a JVM
given an archive of them maps them instead, which starts a session in about 60% of the time
(3.5 s against 5.8 s measured on 2 cores). The archive is made once, by a JVM that starts a
session, runs a job and exits with ``-XX:ArchiveClassesAtExit``, and kept in the cache under
a name that changes with the Java runtime and the driver's class path: pyspark's jars (by
version and by where pyspark is installed) and the spark jar bundle (the Kafka connector and
Millpond's extension), so a change of any of them makes a new one. A JVM given an archive
that does not match its own class path ignores it (``-Xshare:auto``, the default) and starts
as it would without: an archive made by one checkout's virtualenv was never mapped by the
JVMs of a clone elsewhere (its session started in 5.4 s, against 3.1 s mapped), so the
path is part of the name.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from millpond.deploy.jars import cache_root, installed_jars

ARCHIVE_TIMEOUT_S = 300

# Runs in a child process: a session as the worker starts it, one job, then the JVM is asked to
# exit (EOF on its stdin) and waited for while it writes the archive.
_MAKE = """
import sys
from pyspark import SparkContext
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings
session = create_session(WorkerSettings(spark_master="local[1]"))
session.range(0, 10_000).selectExpr("id % 10 AS k", "id AS v").groupBy("k").agg({"v": "avg"}).collect()
jvm = SparkContext._gateway.proc
session.stop()
jvm.stdin.close()
sys.exit(jvm.wait(timeout=float(sys.argv[1])))
"""


def _java_version() -> str:
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if "JAVA_HOME" in os.environ else "java"
    done = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60, check=True)
    return done.stderr


def archive_name(java_version: str, pyspark_home: Path, jars: list[Path]) -> str:
    """The archive's file name for a Java runtime and a driver class path: pyspark's (its
    version and installed place) and ``jars`` (whose folder's name is a digest of them)."""
    key = json.dumps([java_version, pyspark.__version__, str(pyspark_home), sorted(str(j) for j in jars)])
    return f"spark-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def archive_path(cache: Path | None = None) -> Path:
    """Where the archive for this Java runtime, pyspark and connector jars lives."""
    pyspark_home = Path(pyspark.__file__).resolve().parent
    return (cache or cache_root()) / "cds" / archive_name(_java_version(), pyspark_home, installed_jars("spark", cache))


def spark_class_archive(java_options: str, cache: Path | None = None) -> Path:
    """The Spark driver's class-data archive for JVMs started with ``java_options``, made now
    (some 15 s) unless the cache has it."""
    path = archive_path(cache)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    conf = {"spark.driver.extraJavaOptions": f"{java_options} -XX:ArchiveClassesAtExit={partial}"}
    env = {**os.environ, "MILLPOND_SPARK_CONF": json.dumps(conf), "PYSPARK_PYTHON": sys.executable}
    try:
        subprocess.run([sys.executable, "-c", _MAKE, str(ARCHIVE_TIMEOUT_S)], env=env, capture_output=True,
                       timeout=ARCHIVE_TIMEOUT_S + 60, check=True)
        if not partial.exists():
            raise RuntimeError(f"the JVM wrote no class-data archive at {partial}")
        partial.replace(path)  # whole or not at all, whoever else makes it meanwhile
    finally:
        partial.unlink(missing_ok=True)
    return path
