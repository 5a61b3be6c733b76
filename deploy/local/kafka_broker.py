"""An embedded single-node Apache Kafka broker (KRaft, combined broker + controller).

The broker runs from the jars that ``deploy/kafka/pom.xml`` fetches from Maven Central, on
loopback ports chosen free at start. It is a real Kafka process: transactions, compaction
and consumer groups behave as on any cluster, just with replication factor one.

    with EmbeddedKafka(data_dir) as broker:
        print(broker.bootstrap_servers)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from aiokafka.admin import AIOKafkaAdminClient

from millpond.deploy.jars import ensure_jars
from millpond.shared.errors import SetupError
from millpond.shared.net import free_port, wait_for_port

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


def _server_properties(data: Path, port: int, controller_port: int, sasl_port: int,
                       sasl_users: dict[str, str]) -> str:
    users = " ".join(f"user_{name}={json.dumps(password)}" for name, password in sorted(sasl_users.items()))
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
                     f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        # A second listener that authenticates clients with SASL/PLAIN, for clusters and tests
        # that use Kafka's client security settings.
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        "log.dirs": str(data / "logs"),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.partitions": "1",
        # Topics are created explicitly by the coordinator, as ksqlDB does.
        "auto.create.topics.enable": "false",
        # One broker: internal topics with one replica and few partitions start fast.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Lets the coordinators' leader election use a short session (a fast failover locally).
        "group.min.session.timeout.ms": "500",
        "log.cleaner.backoff.ms": "1000",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes them (base64url of a UUID), never starting with
    '-': the storage tool would read such an id as an option (Kafka's Uuid.randomUuid
    draws again for the same reason)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class EmbeddedKafka:
    """A Kafka broker process that this object starts and stops.

    ``data_dir`` holds the broker's configuration, logs and data; a directory already
    formatted by an earlier run is reused (its topics survive a restart).
    """

    def __init__(self, data_dir: Path, *, heap: str = "512m", start_timeout: float = 90.0,
                 sasl_users: dict[str, str] | None = None):
        self.data_dir = Path(data_dir)
        self.heap = heap
        self.start_timeout = start_timeout
        self.port = 0
        self.controller_port = 0
        self.sasl_port = 0
        self.sasl_users = sasl_users or {"millpond": "millpond-secret"}
        """Who may connect to the SASL/PLAIN listener, with their passwords."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        """``host:port`` of the listener that requires SASL/PLAIN (``sasl_users``)."""
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def log_file(self) -> Path:
        """The broker's own log."""
        return self.data_dir / "broker.log"

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise SetupError("Java 17+ is needed for the Kafka broker; `apt-get install openjdk-17-jre-headless`")
        classpath = os.pathsep.join(str(j) for j in ensure_jars("kafka"))
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
        ]

    def start(self) -> None:
        """Format storage if needed, start the broker and wait until it answers. Started again
        after ``stop``, it keeps its ports and data: its clients reconnect (a broker restart)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port, self.controller_port, self.sasl_port = free_port(), free_port(), free_port()
        config = self.data_dir / "server.properties"
        config.write_text(_server_properties(self.data_dir, self.port, self.controller_port, self.sasl_port,
                                             self.sasl_users))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log=self.log_file))
        java = self._java()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id = new_cluster_id()
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "--standalone",
                 "-t", cluster_id, "-c", str(config)],
                capture_output=True, text=True, check=False,
            )
            if fmt.returncode != 0:
                raise SetupError(f"formatting Kafka storage failed: {fmt.stdout}{fmt.stderr}")
        out = (self.data_dir / "broker.out").open("ab")
        self.process = subprocess.Popen(
            [*java, "kafka.Kafka", str(config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        out.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise SetupError(
                    f"the Kafka broker exited with {self.process.returncode}; see {self.log_file}"
                )
            if wait_for_port("127.0.0.1", self.port, 0.5) and asyncio.run(self._answers()):
                return
            time.sleep(0.2)
        raise SetupError(f"the Kafka broker did not answer in {self.start_timeout}s; see {self.log_file}")

    async def _answers(self) -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=2000)
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers"))
        except Exception:
            return False
        finally:
            await admin.close()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the broker: SIGTERM for a clean shutdown, SIGKILL if it lingers."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> EmbeddedKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
