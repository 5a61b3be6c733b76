"""The Spark driver's class-data archive is named after everything a JVM checks before it maps
one: its Java runtime and options, and every jar of its class path (pyspark's and the spark
jar bundle's) by path, size and modification time. Jars elsewhere, or installed again at
the same place, name an archive of their own, not one their JVMs reject; so the JVMs run from a
Spark home in the cache, the same for every virtualenv with the same pyspark, and a fresh
clone maps the archive made before. The cache keeps the few used last."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from millpond.deploy.class_archive import KEPT, _remove_unused, archive_name, spark_home

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


def package(folder: Path, jar_bytes: bytes = b"PK jar") -> Path:
    """A pyspark package as pip installs one: its jars (each with the install's time), its scripts."""
    for jar in jars(folder / "jars"):
        jar.write_bytes(jar_bytes)
        os.utime(jar)  # installed now
    (folder / "bin").mkdir()
    (folder / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (folder / "bin" / "spark-submit").chmod(0o755)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"")
    return folder


def test_virtualenvs_with_the_same_pyspark_run_from_one_spark_home_with_the_same_class_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    cache = tmp_path / "cache"
    home = spark_home(cache, package(tmp_path / "venv"))
    assert home.parent == cache / "spark-home" and sorted(p.name for p in home.iterdir()) == ["bin", "jars"]
    assert os.access(home / "bin" / "spark-submit", os.X_OK)
    class_path = sorted((home / "jars").glob("*.jar"))
    first = archive_name(JAVA, OPTIONS, class_path)
    time.sleep(0.01)
    # A clone elsewhere (its jars installed later) runs from the same home: the same archive.
    assert spark_home(cache, package(tmp_path / "clone")) == home
    assert archive_name(JAVA, OPTIONS, sorted((home / "jars").glob("*.jar"))) == first
    shutil.rmtree(tmp_path / "venv")  # the virtualenv it was made from, gone: the home stays whole
    assert [jar.read_bytes() for jar in class_path] == [b"PK jar"] * 2
    assert spark_home(cache, package(tmp_path / "other", b"PK other jar")) != home  # another pyspark build
    assert not list((cache / "spark-home").glob("*.partial"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    assert spark_home(cache, package(tmp_path / "again")) == tmp_path / "spark"  # an operator's wins
