"""The Spark driver's class-data archive is named after everything a JVM checks before it maps
one: its Java runtime and its class path, pyspark's jars (where pyspark is installed, too) and
the spark jar bundle. A clone's virtualenv elsewhere makes an archive of its own, not one
whose class path its JVMs reject."""

from __future__ import annotations

from pathlib import Path

from millpond.deploy.class_archive import archive_name

JAVA = 'openjdk version "17.0.13" 2024-10-15'
HOME = Path("/work/main/.venv/lib/python3.11/site-packages/pyspark")
JARS = [Path("/root/.cache/millpond/jars/spark-1a2b/kafka-clients.jar"), Path("/root/.cache/millpond/jars/spark-1a2b/ext.jar")]


def test_the_same_runtime_and_class_path_name_the_same_archive() -> None:
    assert archive_name(JAVA, HOME, JARS) == archive_name(JAVA, HOME, list(reversed(JARS)))
    assert archive_name(JAVA, HOME, JARS).startswith("spark-") and archive_name(JAVA, HOME, JARS).endswith(".jsa")


def test_pyspark_installed_elsewhere_names_another_archive() -> None:
    clone = Path("/tmp/fresh/.venv/lib/python3.11/site-packages/pyspark")
    assert archive_name(JAVA, clone, JARS) != archive_name(JAVA, HOME, JARS)


def test_another_jar_bundle_or_java_runtime_names_another_archive() -> None:
    rebuilt = [Path(str(j).replace("spark-1a2b", "spark-9f8e")) for j in JARS]
    assert archive_name(JAVA, HOME, rebuilt) != archive_name(JAVA, HOME, JARS)
    assert archive_name('openjdk version "17.0.14"', HOME, JARS) != archive_name(JAVA, HOME, JARS)
