"""A child whose port was taken between ``free_port`` and its bind starts again on another.
A local cluster's workers start their Spark JVMs with the class-data archive of the workers'
own Java options, unless the Spark configuration is given or the master is not local."""

from __future__ import annotations

import json
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from millpond.deploy import class_archive
from millpond.deploy.local import launcher
from millpond.deploy.local.launcher import LocalCluster
from millpond.services.worker.spark import JAVA_OPTIONS
from millpond.shared.errors import SetupError
from millpond.shared.net import free_port

# A service as the launcher sees one: binds its metrics port, then answers health checks on its port.
SERVICE = textwrap.dedent("""
    import os, socket, time
    from concurrent import futures
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc
    metrics = socket.socket()
    metrics.bind(("127.0.0.1", int(os.environ["MILLPOND_METRICS_PORT"])))  # OSError when taken
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port("127.0.0.1:" + os.environ["MILLPOND_PORT"])
    server.start()
    time.sleep(120)
""")


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else holds."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_ports: list[int]) -> LocalCluster:
    """A cluster whose next children are the fake service, given these metrics ports in turn."""
    (tmp_path / "fake_service.py").write_text(SERVICE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ports = iter(metrics_ports)
    monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or free_port())
    return LocalCluster(data_dir=tmp_path, kafka="127.0.0.1:9", start_timeout=30)


def test_a_child_whose_metrics_port_was_taken_starts_again_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    local = cluster(tmp_path, monkeypatch, [taken])
    try:
        child = local._spawn("service", "fake_service", free_port(), {})
        local._healthy(child)
        assert child.process.poll() is None
        assert child.env["MILLPOND_METRICS_PORT"] != str(taken)
        assert b"Address already in use" in child.log.read_bytes()  # the first start's
    finally:
        local.stop()


def test_a_child_whose_ports_stay_taken_fails_after_its_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    local = cluster(tmp_path, monkeypatch, [taken] * launcher.PORT_TAKEN_STARTS)
    try:
        child = local._spawn("service", "fake_service", free_port(), {})
        with pytest.raises(SetupError, match="exited with 1"):
            local._healthy(child)
        assert child.log.read_bytes().count(b"Address already in use") == launcher.PORT_TAKEN_STARTS
    finally:
        local.stop()


def test_workers_map_a_class_archive_unless_spark_is_configured_or_not_local(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def env_with_archive(java_options: str) -> dict[str, str]:
        made.append(java_options)
        conf = {"spark.driver.extraJavaOptions": f"{java_options} -XX:SharedArchiveFile=/cache/cds/a.jsa"}
        return {"SPARK_HOME": "/cache/spark-home/4.2.0-a", "MILLPOND_SPARK_CONF": json.dumps(conf)}

    monkeypatch.setattr(class_archive, "spark_env_with_archive", env_with_archive)
    monkeypatch.delenv("MILLPOND_SPARK_CONF", raising=False)
    local = LocalCluster(data_dir=tmp_path, kafka="127.0.0.1:9")
    env = local._class_archive_env()
    assert env["SPARK_HOME"] == "/cache/spark-home/4.2.0-a"
    assert json.loads(env["MILLPOND_SPARK_CONF"]) == {
        "spark.driver.extraJavaOptions": f"{JAVA_OPTIONS} -XX:SharedArchiveFile=/cache/cds/a.jsa"}
    assert LocalCluster(data_dir=tmp_path, kafka="127.0.0.1:9", spark_master="spark://h:7077")._class_archive_env() == {}
    assert LocalCluster(data_dir=tmp_path, kafka="127.0.0.1:9",
                        worker_env={"MILLPOND_SPARK_CONF": "{}"})._class_archive_env() == {}
    monkeypatch.setenv("MILLPOND_SPARK_CONF", "{}")
    assert local._class_archive_env() == {}
    assert made == [JAVA_OPTIONS]
