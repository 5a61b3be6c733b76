"""Session-wide fixtures: one real Kafka broker shared by every test that needs it.

``make test`` runs two pytest-xdist processes (``--dist loadgroup``), each a session of its
own with its own broker. Tests are grouped so that a module's cluster is started once: every
module is one group, and the modules on the session-wide e2e ``cluster`` share one group.
"""

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


SHARED_CLUSTER_GROUP = "e2e-shared-cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test an xdist group: its module's, or the shared cluster's (see above)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        shared = "cluster" in getattr(item, "fixturenames", ())
        module = item.module.__name__ if isinstance(item, pytest.Function) and item.module else item.nodeid
        item.add_marker(pytest.mark.xdist_group(SHARED_CLUSTER_GROUP if shared else module))
