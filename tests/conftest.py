"""Session-wide fixtures: one real Kafka broker shared by every test that needs it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from millpond.deploy.class_archive import spark_env_with_archive
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.spark import JAVA_OPTIONS
from millpond.shared import net

if "PYTEST_XDIST_WORKER" in os.environ:  # make test's processes: each picks ports of its own share
    net.OWN_PORTS = (int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")))

# The tests start some twenty Spark JVMs, several at once on two cores, and each runs little
# input: the JIT's first tier alone and the serial collector start them sooner than the
# defaults, which tune for long runs, and a class-data archive (made once into the cache)
# sooner still; the workers' own options besides. Every worker the tests start (and every benchmark's smoke run) inherits this;
# an operator's MILLPOND_SPARK_CONF wins.
TEST_JAVA_OPTIONS = f"-XX:TieredStopAtLevel=1 {JAVA_OPTIONS}"


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM (``timeout``'s, a CI job's cancel) ends the run as Ctrl-C does: pytest then
    tears the session's fixtures down, the Kafka broker (a session of its own, which no signal
    to pytest's group reaches) and Spark included. Python's default would exit at once and
    leave them running."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def quick_spark_jvms() -> None:
    # Nor do they warm the JIT up at start (about 13 s of a core each, for batches of a few
    # records): tests/integration/test_jit_warm_up.py runs the warm-up itself.
    os.environ.setdefault("MILLPOND_SPARK_WARM_UP_BATCHES", "0")
    os.environ.setdefault("MILLPOND_SPARK_WARM_UP_TRIGGERS", "0")
    if "MILLPOND_SPARK_CONF" not in os.environ:
        os.environ.update(spark_env_with_archive(TEST_JAVA_OPTIONS))


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A real single-node Kafka broker for the whole session."""
    broker = EmbeddedKafka(Path(tmp_path_factory.mktemp("kafka")))
    broker.start()
    yield broker
    broker.stop()
