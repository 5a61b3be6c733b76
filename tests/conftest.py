"""Session-wide fixtures: one real Kafka broker shared by every test that needs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from millpond.deploy.local.kafka_broker import EmbeddedKafka


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A real single-node Kafka broker for the whole session."""
    broker = EmbeddedKafka(Path(tmp_path_factory.mktemp("kafka")))
    broker.start()
    yield broker
    broker.stop()
