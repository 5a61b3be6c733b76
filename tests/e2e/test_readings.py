"""The seed's readings example through the real cluster, and the CLI's contract."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from importlib import resources
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client.parser import text_string_to_metric_families

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.net import free_port

SCRIPT = resources.files("millpond.cli").joinpath("readings.sql").read_text()
MILLPOND = [sys.executable, "-m", "millpond.cli.main"]


def expected_averages() -> dict[str, float]:
    """Computed from the INSERT statements themselves, independently of Millpond."""
    readings: dict[str, list[int]] = defaultdict(list)
    for sensor, value in re.findall(r"VALUES \('(sensor-\d)', '\w+', (\d+)\)", SCRIPT):
        readings[sensor].append(int(value))
    assert sum(len(v) for v in readings.values()) == 40
    return {s: sum(v) / len(v) for s, v in readings.items()}


def sql(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MILLPOND, "sql", "--server", cluster.router, *args], capture_output=True,
                          text=True, timeout=120, check=check)


def json_rows(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_every_service_is_healthy(cluster: LocalCluster) -> None:
    for child in cluster.children:
        with grpc.insecure_channel(child.endpoint) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, child.name


def test_router_lists_its_services_by_reflection(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.router) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {"millpond.router.v1.RouterService", "grpc.health.v1.Health"} <= services


def test_readings_example_end_to_end(cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "readings.sql"
    script.write_text(SCRIPT)
    created = json_rows(sql(cluster, "-f", str(script), "--output", "json"))
    assert len(created) == 43
    assert "auto.offset.reset" in str(created[0]["message"])
    assert created[1]["status"] == "SUCCESS" and created[1]["message"] == "Stream created"
    inserts = created[2:42]
    assert all(r["message"] == "Inserted into READINGS" for r in inserts)
    # The partition is murmur2 of the key, as the Java client computes it: same key, same partition.
    by_sensor: dict[object, set[object]] = defaultdict(set)
    for row, sensor in zip(inserts, re.findall(r"VALUES \('(sensor-\d)'", SCRIPT), strict=True):
        by_sensor[sensor].add(row["partition"])
    assert all(len(p) == 1 for p in by_sensor.values())
    assert re.fullmatch(r"Created query with ID CTAS_AVG_READINGS_\d+", str(created[42]["message"]))

    expected = expected_averages()
    deadline = time.monotonic() + 240
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = json_rows(sql(cluster, "-e", "SELECT * FROM avg_readings;", "--output", "json", check=False))
        if len(rows) == 8 and {r["SENSOR"]: r["AVG_READING"] for r in rows} == expected:
            break
        time.sleep(0.3)
    assert {r["SENSOR"]: r["AVG_READING"] for r in rows} == expected

    one = json_rows(sql(cluster, "-e", "SELECT * FROM avg_readings WHERE sensor = 'sensor-1';", "--output", "json"))
    assert one == [{"SENSOR": "sensor-1", "AVG_READING": 24.2}]
    projected = json_rows(sql(cluster, "-e", "SELECT avg_reading * 2 AS twice FROM avg_readings "
                                             "WHERE sensor = 'sensor-8';", "--output", "json"))
    assert projected == [{"TWICE": pytest.approx(2 * expected["sensor-8"])}]

    table = sql(cluster, "-e", "SELECT * FROM avg_readings WHERE sensor = 'sensor-1';").stdout
    assert "AVG_READING" in table and "24.2" in table

    # Tables in SHOW and DESCRIBE through the CLI.
    shown = json_rows(sql(cluster, "-e", "SHOW TABLES;", "--output", "json"))
    assert "AVG_READINGS" in [r["NAME"] for r in shown]  # the session cluster holds other tests' tables too
    described = json_rows(sql(cluster, "-e", "DESCRIBE avg_readings;", "--output", "json"))
    assert [(r["FIELD"], r["TYPE"]) for r in described] == [("SENSOR", "VARCHAR"), ("AVG_READING", "DOUBLE")]

    # Every service's Prometheus endpoint counts what the example did.
    query_id = str(created[42]["message"]).rsplit(" ", 1)[-1]
    workers = [s for c in cluster.children if c.name.startswith("worker") for s in scrape(c.metrics)]
    assert total(workers, "millpond_records_processed_total", query=query_id) == 40  # each reading exactly once
    assert total(workers, "millpond_records_failed_total", query=query_id) == 0
    assert total(workers, "millpond_microbatch_seconds_count", query=query_id) > 0
    router = scrape(cluster.child("router").metrics)
    assert total(router, "millpond_pull_queries_total", outcome="OK") >= 4
    assert total(router, "millpond_pull_query_seconds_count") >= 4
    coordinator = scrape(cluster.child("coordinator").metrics)
    assert total(coordinator, "millpond_cluster_workers") == 2
    assert {labels["worker"] for name, labels, _ in coordinator
            if name == "millpond_heartbeat_age_seconds"} >= {"worker-1", "worker-2"}


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """One service's Prometheus samples: (name, labels, value)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return [(x.name, x.labels, x.value) for family in text_string_to_metric_families(text) for x in family.samples]


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


def test_cli_errors_go_to_stderr_with_a_non_zero_exit(cluster: LocalCluster) -> None:
    bad = sql(cluster, "-e", "SELEC * FROM avg_readings;", check=False)
    assert bad.returncode != 0
    assert "line 1:1" in bad.stderr and "expected one of" in bad.stderr
    assert bad.stdout == ""
    missing = sql(cluster, "-e", "SELECT * FROM nowhere;", check=False)
    assert missing.returncode != 0 and "NOWHERE does not exist" in missing.stderr


def test_server_errors_are_grpc_statuses(cluster: LocalCluster) -> None:
    from millpond.router.v1 import router_pb2, router_pb2_grpc

    with grpc.insecure_channel(cluster.router) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Execute(router_pb2.ExecuteRequest(sql="CREATE STREAM x (a INT) WITH (kafka_topic='x')"), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "value_format" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            stub.Execute(router_pb2.ExecuteRequest(sql="SELECT * FROM ghost"), timeout=30)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_up_prints_ready_and_stops_everything_on_sigterm(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*MILLPOND, "up", "--kafka", kafka.bootstrap_servers, "--workers", "1", "--port", str(port),
         "--data-dir", str(tmp_path), "--service-id", f"up{os.getpid()}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "ready" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "ready" in line and f"router=127.0.0.1:{port}" in line
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                    text=True).stdout.split()]
        assert len(children) >= 3  # coordinator, worker, router
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in children:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
