"""A class-data archive (Java's AppCDS) for the workers' Spark JVMs.

A Spark driver loads and verifies some ten thousand classes before its first job; a JVM
given an archive of them maps them instead, which starts a session in about 60% of the time
and CPU (measured on 2 cores: with the workers' own options 2.7-2.9 s against 4.3-4.7 s, and
4.3-4.6 s of the JVM's CPU against 7.0-7.5; with the tests' 3.5 s against 5.8 s). The archive
is made once, by a JVM that starts a session, runs a job and exits with
``-XX:ArchiveClassesAtExit``, and kept in the cache under a name that changes with the Java
runtime and its options and with the driver's class path: pyspark's jars and the spark jar
bundle (the Kafka connector and Millpond's extension), each jar by its path, size and
modification time, as the JVM checks them, so a change of any of them makes a new one. A JVM
given an archive that does not match its own class path ignores it (``-Xshare:auto``, the
default) and starts as it would without. So that one archive serves every checkout, the JVMs
run from a Spark home in the cache (``spark_home``): pyspark's package linked there once per
pyspark build (its version and jars), its jars then at the same path with the same times for a
clone elsewhere and a virtualenv made again (each of which made an archive of its own before: 20-30 s of every
fresh clone's first cluster). A local cluster's workers (``LocalCluster``) and the tests' start
with one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark

from millpond.deploy.jars import cache_root, installed_jars
from millpond.shared.errors import SetupError

ARCHIVE_TIMEOUT_S = 300
KEPT = 4
"""The archives the cache keeps, the most recently used, the one being made among them: each
is some 150 MB, and a new one is made for every new class path (a clone, a virtualenv made
again, a rebuilt jar bundle)."""

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


def archive_name(java_version: str, java_options: str, jars: list[Path]) -> str:
    """The archive's file name for a Java runtime started with ``java_options`` and a driver
    class path of ``jars``, each as the JVM checks it before it maps an archive made with it:
    its path, size and modification time (a virtualenv made again at the same place installs
    pyspark's jars anew, and its JVMs then refuse the archive made before)."""
    stats = sorted(f"{jar} {st.st_size} {st.st_mtime_ns}" for jar in jars for st in [jar.stat()])
    key = json.dumps([java_version, java_options, stats])
    return f"spark-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def spark_home(cache: Path | None = None, package: Path | None = None) -> Path:
    """The Spark home the JVMs run from: the environment's ``SPARK_HOME``, else a copy of
    pyspark's ``package`` (installed pyspark's by default) in the cache, made once, by hard
    links where the file system allows, and named by pyspark's version and its jars' names and
    sizes: the same for every virtualenv with that pyspark, so their JVMs' class path, and the
    archive made for it, is too."""
    if "SPARK_HOME" in os.environ:
        return Path(os.environ["SPARK_HOME"])
    package = package or Path(pyspark.__file__).resolve().parent
    jars = sorted((package / "jars").glob("*.jar"))
    key = json.dumps([pyspark.__version__, [(jar.name, jar.stat().st_size) for jar in jars]])
    home = (cache or cache_root()) / "spark-home" / f"{pyspark.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if home.is_dir():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    partial = home.with_name(f"{home.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(package, partial, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("__pycache__"))
        with contextlib.suppress(OSError):  # whole or not at all: another process made it meanwhile
            partial.rename(home)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return home


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (the same file: its size and time too), or, across file systems, a copy
    with its time."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def archive_path(java_options: str, cache: Path | None = None) -> Path:
    """Where the archive for this Java runtime and its options, the Spark home's jars and the
    spark jar bundle lives."""
    jars = sorted((spark_home(cache) / "jars").glob("*.jar")) + installed_jars("spark", cache)
    return (cache or cache_root()) / "cds" / archive_name(_java_version(), java_options, jars)


def spark_class_archive(java_options: str, cache: Path | None = None) -> Path:
    """The Spark driver's class-data archive for JVMs started with ``java_options``, made now
    (some 20-30 s on 2 cores) unless the cache has it."""
    path = archive_path(java_options, cache)
    if path.exists():
        with contextlib.suppress(OSError):  # its last use, for ``_remove_unused`` (another user's cache may refuse it)
            os.utime(path)
        return path
    _remove_unused(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    conf = {"spark.driver.extraJavaOptions": f"{java_options} -XX:ArchiveClassesAtExit={partial}"}
    env = {**os.environ, "MILLPOND_SPARK_CONF": json.dumps(conf), "PYSPARK_PYTHON": sys.executable,
           "SPARK_HOME": str(spark_home(cache))}
    try:
        made = subprocess.run([sys.executable, "-c", _MAKE, str(ARCHIVE_TIMEOUT_S)], env=env, capture_output=True,
                              text=True, timeout=ARCHIVE_TIMEOUT_S + 60)
        if made.returncode != 0 or not partial.exists():
            raise SetupError(f"the Spark JVM wrote no class-data archive at {partial} (exit {made.returncode}): "
                             f"{made.stderr[-2000:]}")
        partial.replace(path)  # whole or not at all, whoever else makes it meanwhile
    finally:
        partial.unlink(missing_ok=True)
    return path


def _remove_unused(folder: Path) -> None:
    """Keep the ``KEPT - 1`` archives used last, so that with the one being made there are ``KEPT``."""
    used = {}
    for archive in folder.glob("spark-*.jsa"):
        with contextlib.suppress(FileNotFoundError):  # another process's make may remove it meanwhile
            used[archive] = archive.stat().st_mtime
    for old in sorted(used, key=used.__getitem__, reverse=True)[KEPT - 1:]:
        old.unlink(missing_ok=True)


def spark_env_with_archive(java_options: str, cache: Path | None = None) -> dict[str, str]:
    """The environment of a process whose Spark driver JVMs start with ``java_options`` and
    map the class-data archive made for them (made now unless the cache has it): the Spark home
    the archive was made for, and the Spark setting that maps it (``MILLPOND_SPARK_CONF``)."""
    archive = spark_class_archive(java_options, cache)
    conf = {"spark.driver.extraJavaOptions": f"{java_options} -XX:SharedArchiveFile={archive}"}
    return {"SPARK_HOME": str(spark_home(cache)), "MILLPOND_SPARK_CONF": json.dumps(conf)}
