"""Starts a local Millpond cluster as child processes: an embedded Kafka broker (unless an
external one is given), one coordinator, N workers and the router.

Every child gets its own process group and log file under the data directory; ``stop``
sends SIGTERM, waits, and SIGKILLs what lingers, so nothing is left running.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millpond.deploy.jars import ensure_jars
from millpond.deploy.local.certs import SERVICE_IDENTITY, LocalCa
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.shared.errors import SetupError
from millpond.shared.net import free_port
from millpond.shared.rpc.tls import ClientCredentials, TlsFiles

PORT_TAKEN_STARTS = 3
"""How many times a child is started when a port it was given was taken by the time it bound
it (``free_port`` finds a port free when asked; the child binds it seconds later)."""

PRINCIPALS = {"admin": ["admin", "read", "write"], "writer": ["read", "write"], "reader": ["read"]}
"""The principals a secure local cluster's tokens file grants, with their permissions."""


@dataclass
class Child:
    """A service process the launcher started."""

    name: str
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path
    module: str
    env: dict[str, str]
    cpus: set[int] | None = None
    """The cores it is pinned to (None: any)."""
    log_from: int = 0
    """Where in ``log`` the output of its latest start begins."""

    @property
    def metrics(self) -> str:
        """The URL of its Prometheus metrics."""
        return f"http://127.0.0.1:{self.env['MILLPOND_METRICS_PORT']}/metrics"


def _launch(log: Path, module: str, env: dict[str, str], cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
    """``python -m module`` in a process group of its own, its output appended to ``log``."""
    with log.open("ab") as out:
        # taskset pins the process before it runs anything: its threads and the JVM it
        # starts inherit the affinity.
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        return subprocess.Popen([*pin, sys.executable, "-m", module], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _port_taken(log: Path, since: int) -> bool:
    """Whether what ``log`` got after its first ``since`` bytes says a port was in use."""
    with log.open("rb") as f:
        f.seek(since)
        return b"Address already in use" in f.read()


def wait_healthy(endpoint: str, timeout: float, process: subprocess.Popen[bytes] | None = None,
                 credentials: ClientCredentials | None = None) -> None:
    """Wait until ``endpoint``'s gRPC health service says SERVING."""
    deadline = time.monotonic() + timeout
    with (credentials or ClientCredentials()).channel(endpoint) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise SetupError(f"the service at {endpoint} exited with {process.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SetupError(f"the service at {endpoint} did not become healthy in {timeout}s")


@dataclass
class LocalCluster:
    """A whole cluster on this machine."""

    data_dir: Path
    workers: int = 2
    kafka: str | None = None
    router_port: int = 8088
    spark_master: str = "local[1]"
    service_id: str = "millpond"
    start_timeout: float = 120.0
    coordinators: int = 1
    """Coordinators to run: one leads, the others take over when it dies."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra MILLPOND_* settings for every worker."""
    coordinator_env: dict[str, str] = field(default_factory=dict)
    """Extra MILLPOND_* settings for every coordinator."""
    router_env: dict[str, str] = field(default_factory=dict)
    """Extra MILLPOND_* settings for the router."""
    service_env: dict[str, str] = field(default_factory=dict)
    """Extra MILLPOND_* settings for every service (e.g. Kafka's security settings)."""
    worker_cpus: list[set[int]] = field(default_factory=list)
    """Pin worker i (and its Spark JVM) to ``worker_cpus[i]`` (benchmarks); empty: no pinning."""
    secure: bool = False
    """Mutual TLS on every endpoint with certificates from a throwaway CA under
    ``data_dir/tls``, and bearer tokens (``tokens``) that clients must present."""
    broker: EmbeddedKafka | None = None
    children: list[Child] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    """With ``secure``: principal -> its bearer token (admin, writer, reader)."""
    client_tls: TlsFiles | None = None
    """With ``secure``: a client certificate (not a service's) for the CLI and tests."""
    _security_env: dict[str, str] = field(default_factory=dict)
    _spark_env: dict[str, str] = field(default_factory=dict)

    def credentials(self, principal: str | None = None) -> ClientCredentials:
        """How a client connects: plaintext, or with ``secure`` the client certificate and
        the token of ``principal`` (none: no token)."""
        return ClientCredentials(self.client_tls, self.tokens[principal] if principal else None)

    def _make_security(self) -> None:
        """A CA, the services' certificate, a client certificate and a tokens file."""
        ca = LocalCa(self.data_dir / "tls")
        service = ca.issue(SERVICE_IDENTITY)
        client = ca.issue("millpond-client", "client")
        self.client_tls = TlsFiles(client.cert, client.key, client.ca)
        self.tokens = {name: secrets.token_urlsafe(24) for name in PRINCIPALS}
        tokens_file = self.data_dir / "tls" / "tokens.toml"
        tokens_file.write_text("".join(
            f'[principals.{name}]\ntoken = "{self.tokens[name]}"\npermissions = {json.dumps(permissions)}\n\n'
            for name, permissions in PRINCIPALS.items()))
        tokens_file.chmod(0o600)
        self._security_env = {"MILLPOND_TLS_CERT_FILE": str(service.cert), "MILLPOND_TLS_KEY_FILE": str(service.key),
                               "MILLPOND_TLS_CA_FILE": str(service.ca), "MILLPOND_AUTH_TOKENS_FILE": str(tokens_file),
                               "MILLPOND_SERVICE_IDENTITIES": SERVICE_IDENTITY}

    def _class_archive_env(self) -> dict[str, str]:
        """The workers' Spark JVMs map a class-data archive of the driver's classes, made once
        into the cache (``millpond.deploy.class_archive``): a session starts in about 60% of the
        time. Only on a local master (the archive is of a local driver's class path), and not
        when the environment or ``worker_env`` sets the Spark configuration (the tests set their
        own; an operator's wins)."""
        if "MILLPOND_SPARK_CONF" in os.environ or "MILLPOND_SPARK_CONF" in self.worker_env \
                or not self.spark_master.startswith("local"):
            return {}
        # Both import pyspark: only a cluster with workers to start needs them.
        from millpond.deploy.class_archive import spark_env_with_archive
        from millpond.services.worker.spark import JAVA_OPTIONS
        return spark_env_with_archive(JAVA_OPTIONS)

    @property
    def bootstrap(self) -> str:
        """Kafka bootstrap servers the services use."""
        if self.kafka:
            return self.kafka
        assert self.broker is not None
        return self.broker.bootstrap_servers

    @property
    def router(self) -> str:
        """The client front door."""
        return f"127.0.0.1:{self.router_port}"

    def _spawn(self, name: str, module: str, port: int, env: dict[str, str], cpus: set[int] | None = None) -> Child:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        full_env = {**os.environ, "MILLPOND_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                    "MILLPOND_SERVICE_ID": self.service_id, "MILLPOND_HOST": "127.0.0.1",
                    "MILLPOND_PORT": str(port), "MILLPOND_METRICS_PORT": str(free_port()),
                    **self._security_env, **self.service_env, **env}
        log_from = _size(log)
        child = Child(name, f"127.0.0.1:{port}", _launch(log, module, full_env, cpus), log, module, full_env, cpus,
                      log_from)
        self.children.append(child)
        return child

    def _healthy(self, child: Child) -> None:
        """Wait until ``child`` is healthy. One that exited because a port it was given had
        been taken meanwhile starts again on a new metrics port (its own port stays: others
        were given it), up to ``PORT_TAKEN_STARTS`` times in all."""
        for start in range(1, PORT_TAKEN_STARTS + 1):
            try:
                wait_healthy(child.endpoint, self.start_timeout, child.process, self.credentials())
                return
            except SetupError:
                if start == PORT_TAKEN_STARTS or child.process.poll() is None \
                        or not _port_taken(child.log, child.log_from):
                    raise
            child.env = {**child.env, "MILLPOND_METRICS_PORT": str(free_port())}
            child.log_from = _size(child.log)
            child.process = _launch(child.log, child.module, child.env, child.cpus)

    def child(self, name: str) -> Child:
        """The service called ``name`` (``coordinator``, ``worker-1``, ``router``)."""
        return next(c for c in self.children if c.name == name)

    @property
    def coordinator_endpoints(self) -> str:
        """Every coordinator's host:port, comma-separated, as workers and routers take them."""
        return ",".join(c.endpoint for c in self.children if c.name.startswith("coordinator"))

    def add_worker(self, wait: bool = True) -> Child:
        """Start one more worker (``worker-N``, the next number) and wait until it is healthy."""
        n = 1 + sum(c.name.startswith("worker-") for c in self.children)
        child = self._spawn(f"worker-{n}", "millpond.services.worker", free_port(), {
            "MILLPOND_WORKER_ID": f"worker-{n}",
            "MILLPOND_COORDINATOR": self.coordinator_endpoints,
            "MILLPOND_ROUTERS": self.router,
            "MILLPOND_STATE_DIR": str(self.data_dir / "state"),
            "MILLPOND_SPARK_MASTER": self.spark_master,
            **self._spark_env,
            **self.worker_env,
        }, self.worker_cpus[n - 1] if n <= len(self.worker_cpus) else None)
        if wait:
            self._healthy(child)
        return child

    def add_router(self) -> Child:
        """Start one more router (``router-N``) on a free port and wait until it is healthy.
        Workers started before it do not beat it; it routes without their lag reports."""
        n = 1 + sum(c.name.startswith("router") for c in self.children)
        child = self._spawn(f"router-{n}", "millpond.services.router", free_port(),
                            {"MILLPOND_COORDINATOR": self.coordinator_endpoints, **self.router_env})
        self._healthy(child)
        return child

    def terminate(self, name: str, timeout: float = 30.0) -> None:
        """Stop a service gracefully (SIGTERM) and wait until it exited."""
        child = self.child(name)
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
        try:
            child.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait(5)

    def kill(self, name: str) -> None:
        """SIGKILL a service (its whole process group) and reap it: a crash, not a shutdown."""
        child = self.child(name)
        if child.process.poll() is None:
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(10)

    def restart(self, name: str) -> Child:
        """Start a stopped or killed service again, same id, port and settings; wait until healthy."""
        child = self.child(name)
        if child.process.poll() is None:
            raise SetupError(f"{name} is still running; kill or stop it first")
        child.log_from = _size(child.log)
        child.process = _launch(child.log, child.module, child.env, child.cpus)
        self._healthy(child)
        return child

    def start(self) -> None:
        """Start everything and wait until every service answers health checks."""
        try:
            if self.workers:
                ensure_jars("spark")  # workers only look the connector up; a local cluster fetches it once
                self._spark_env = self._class_archive_env()
            if self.secure:
                self._make_security()
            if not self.kafka:
                self.broker = EmbeddedKafka(self.data_dir / "kafka")
                self.broker.start()
            # The embedded broker allows a short group session: a dead leading coordinator is
            # replaced in about 1.5 s (an external cluster keeps the 6 s default).
            election = {} if self.kafka else {"MILLPOND_LEADER_SESSION_TIMEOUT_MS": "1500"}
            for i in range(1, self.coordinators + 1):
                name = "coordinator" if i == 1 else f"coordinator-{i}"
                port = free_port()
                coordinator = self._spawn(name, "millpond.services.coordinator", port, {
                    "MILLPOND_COORDINATOR_ID": name, **election, **self.coordinator_env})
                self._healthy(coordinator)
            for _ in range(self.workers):
                self.add_worker(wait=False)
            self._spawn("router", "millpond.services.router", self.router_port,
                        {"MILLPOND_COORDINATOR": self.coordinator_endpoints, **self.router_env})
            for child in self.children:
                self._healthy(child)
        except BaseException:
            self.stop()
            raise

    def describe(self) -> str:
        """One line naming every endpoint."""
        parts = [f"router={self.router}"] + [f"{c.name}={c.endpoint}" for c in self.children if c.name != "router"]
        return " ".join([*parts, f"kafka={self.bootstrap}"])

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every child (SIGTERM, then SIGKILL after ``timeout``) and the broker."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(5)
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
