"""A child whose port was taken between ``free_port`` and its bind starts again on another."""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from millpond.deploy.local import launcher
from millpond.deploy.local.launcher import LocalCluster
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
