"""One real local cluster (coordinator, two workers with Spark, router) for the e2e tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.net import free_port


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the session's cluster run last, so it never idles beside the clusters
    other tests start."""
    items.sort(key=lambda item: "cluster" in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def cluster(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A running cluster on the session's broker, with its own service id."""
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("cluster")), workers=2,
                         kafka=kafka.bootstrap_servers, router_port=free_port(),
                         service_id=f"e2e{os.getpid()}", spark_master="local[1]",
                         worker_env={"MILLPOND_SERVE_ROUTER": "true"})  # each worker routes too: test_colocated
    local.start()
    yield local
    local.stop()
