"""The Spark driver's class-data archive is named after everything a JVM checks before it maps
one: its Java runtime and options, and its class path: pyspark's jars (where pyspark is
installed, too) and the spark jar bundle. A clone's virtualenv elsewhere makes an archive of
its own, not one whose class path its JVMs reject. One unused for a week is removed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from millpond.deploy.class_archive import UNUSED_DAYS, _remove_unused, archive_name

JAVA = 'openjdk version "17.0.13" 2024-10-15'
OPTIONS = "-XX:+UseSerialGC"
HOME = Path("/work/main/.venv/lib/python3.11/site-packages/pyspark")
JARS = [Path("/root/.cache/millpond/jars/spark-1a2b/kafka-clients.jar"), Path("/root/.cache/millpond/jars/spark-1a2b/ext.jar")]


def test_the_same_runtime_and_class_path_name_the_same_archive() -> None:
    assert archive_name(JAVA, OPTIONS, HOME, JARS) == archive_name(JAVA, OPTIONS, HOME, list(reversed(JARS)))
    assert archive_name(JAVA, OPTIONS, HOME, JARS).startswith("spark-") and archive_name(JAVA, OPTIONS, HOME, JARS).endswith(".jsa")


def test_pyspark_installed_elsewhere_names_another_archive() -> None:
    clone = Path("/tmp/fresh/.venv/lib/python3.11/site-packages/pyspark")
    assert archive_name(JAVA, OPTIONS, clone, JARS) != archive_name(JAVA, OPTIONS, HOME, JARS)


def test_another_jar_bundle_java_runtime_or_java_options_names_another_archive() -> None:
    rebuilt = [Path(str(j).replace("spark-1a2b", "spark-9f8e")) for j in JARS]
    assert archive_name(JAVA, OPTIONS, HOME, rebuilt) != archive_name(JAVA, OPTIONS, HOME, JARS)
    assert archive_name('openjdk version "17.0.14"', OPTIONS, HOME, JARS) != archive_name(JAVA, OPTIONS, HOME, JARS)
    assert archive_name(JAVA, "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", HOME, JARS) != archive_name(JAVA, OPTIONS, HOME, JARS)


def test_an_archive_unused_for_a_week_is_removed_when_another_is_made(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    old, recent, other = folder / "spark-0001.jsa", folder / "spark-0002.jsa", folder / "notes.txt"
    for path in (old, recent, other):
        path.write_text("x")
    week_ago = time.time() - (UNUSED_DAYS * 86400 + 60)
    os.utime(old, (week_ago, week_ago))
    os.utime(other, (week_ago, week_ago))
    _remove_unused(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "spark-0002.jsa"]
