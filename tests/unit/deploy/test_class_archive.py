"""The Spark driver's class-data archive is named after everything a JVM checks before it maps
one: its Java runtime and options, and every jar of its class path (pyspark's and the spark
jar bundle's) by path, size and modification time. A clone's virtualenv elsewhere, or one made
again at the same place, makes an archive of its own, not one its JVMs reject. The cache keeps
the few used last."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from millpond.deploy.class_archive import KEPT, _remove_unused, archive_name

JAVA = 'openjdk version "17.0.13" 2024-10-15'
OPTIONS = "-XX:+UseSerialGC"


def jars(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    made = [folder / "spark-core.jar", folder / "kafka-clients.jar"]
    for jar in made:
        jar.write_bytes(b"PK jar")
        os.utime(jar, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return made


def test_the_same_runtime_and_class_path_name_the_same_archive(tmp_path: Path) -> None:
    class_path = jars(tmp_path / "venv")
    assert archive_name(JAVA, OPTIONS, class_path) == archive_name(JAVA, OPTIONS, list(reversed(class_path)))
    assert archive_name(JAVA, OPTIONS, class_path).startswith("spark-") and archive_name(JAVA, OPTIONS, class_path).endswith(".jsa")


def test_jars_installed_elsewhere_or_again_name_another_archive(tmp_path: Path) -> None:
    class_path = jars(tmp_path / "venv")
    first = archive_name(JAVA, OPTIONS, class_path)
    assert archive_name(JAVA, OPTIONS, jars(tmp_path / "clone")) != first  # the same jars, elsewhere
    shutil.rmtree(tmp_path / "venv")
    assert archive_name(JAVA, OPTIONS, jars(tmp_path / "venv")) == first  # the very same files
    os.utime(class_path[0])  # installed again: now
    assert archive_name(JAVA, OPTIONS, class_path) != first


def test_another_jar_java_runtime_or_java_options_names_another_archive(tmp_path: Path) -> None:
    class_path = jars(tmp_path / "venv")
    first = archive_name(JAVA, OPTIONS, class_path)
    assert archive_name(JAVA, OPTIONS, class_path[:1]) != first
    assert archive_name('openjdk version "17.0.14"', OPTIONS, class_path) != first
    assert archive_name(JAVA, "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", class_path) != first


def test_making_an_archive_keeps_only_the_ones_used_last(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    now = time.time()
    for age in range(KEPT + 2):
        archive = folder / f"spark-{age:04}.jsa"
        archive.write_text("x")
        os.utime(archive, (now - age * 3600, now - age * 3600))
    (folder / "notes.txt").write_text("x")
    _remove_unused(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"] + [f"spark-{age:04}.jsa" for age in range(KEPT - 1)]
