"""The in-memory changelog that the worker's changelog readers read in these tests, and the
worker's Spark session for those that run Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from millpond.services.worker import spark as spark_module
from millpond.services.worker.spark import create_session
from millpond.services.worker.state import changelog as changelog_module
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka import connection as connection_module
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer


@pytest.fixture
def changelog(monkeypatch: pytest.MonkeyPatch) -> Iterator[Changelog]:
    """The changelog every reader in the test reads, and the end offsets consumers ask
    (``FakeConsumer`` patched in)."""
    log = Changelog()
    monkeypatch.setattr(FakeConsumer, "changelog", log)
    monkeypatch.setattr(FakeConsumer, "seeks", [])
    monkeypatch.setattr(FakeConsumer, "chunks", [])
    monkeypatch.setattr(FakeConsumer, "observe", None)
    monkeypatch.setattr(FakeConsumer, "waits", False)
    monkeypatch.setattr(FakeConsumer, "markers_apart", False)
    monkeypatch.setattr(changelog_module, "AIOKafkaConsumer", FakeConsumer)
    monkeypatch.setattr(connection_module, "AIOKafkaConsumer", FakeConsumer)  # end offsets asked apart
    yield log


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The worker's own session settings, in local[1]."""
    settings = WorkerSettings(worker_id="spark-test", spark_master="local[1]", state_dir=tmp_path_factory.mktemp("state"))
    session = create_session(settings)
    yield session
    session.stop()


@pytest.fixture
def dead_drivers(monkeypatch: pytest.MonkeyPatch) -> set[object]:
    """The made-up sessions whose driver a test says died (``spark.driver_alive``: any other is
    alive), for tests of ``LazySession`` without Spark."""
    dead: set[object] = set()
    monkeypatch.setattr(spark_module, "driver_alive", lambda session: session not in dead)
    return dead
