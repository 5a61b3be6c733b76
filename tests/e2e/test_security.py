"""A secure cluster on real Kafka, Spark, RocksDB and gRPC: mutual TLS on every endpoint
with a throwaway CA, bearer tokens for clients, internal RPCs only for the services'
certificate, Kafka reached over SASL, the request limits, certificate rotation, and a
Node.js client.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from millpond.cli.client import RouterClient
from millpond.cli.status import router_status
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.deploy.local.certs import SERVICE_IDENTITY, LocalCa
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc, router_pb2, router_pb2_grpc
from millpond.shared.net import free_port
from millpond.shared.rpc.tls import ClientCredentials, TlsFiles
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
MAX_ROWS = 4
MAX_PUSH_PER_CLIENT = 2


@pytest.fixture(scope="module")
def secure(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Every Kafka client (aiokafka and Spark's) authenticates to the broker with SASL/PLAIN.
    user, password = next(iter(kafka.sasl_users.items()))
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("secure")), workers=1, secure=True,
                         kafka=kafka.sasl_bootstrap_servers, router_port=free_port(), service_id=f"sec{os.getpid()}",
                         service_env={"MILLPOND_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                      "MILLPOND_KAFKA_SASL_MECHANISM": "PLAIN", "MILLPOND_KAFKA_SASL_USERNAME": user,
                                      "MILLPOND_KAFKA_SASL_PASSWORD": password},
                         spark_master="local[1]",
                         router_env={"MILLPOND_MAX_ROWS_PER_RESPONSE": str(MAX_ROWS),
                                     "MILLPOND_MAX_PUSH_QUERIES_PER_CLIENT": str(MAX_PUSH_PER_CLIENT),
                                     "MILLPOND_MAX_STATEMENT_CHARS": "2000"})
    local.start()
    yield local
    local.stop()


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    """The status a call that must fail ends with."""
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    return err.value.code(), str(err.value.details())


def client(cluster: LocalCluster, principal: str | None) -> RouterClient:
    return RouterClient(cluster.router, timeout=60, credentials=cluster.credentials(principal))


def wait_rows(reader: RouterClient, sql: str, rows: int, timeout: float = 180) -> list[list[object]]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = reader.execute(sql)[0].rows
            if len(got) >= rows:
                return got
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise
        assert time.monotonic() < deadline, f"{sql} did not return {rows} rows"
        time.sleep(0.25)


def test_tokens_decide_who_reads_writes_and_administers(secure: LocalCluster) -> None:
    admin, writer, reader = (client(secure, p) for p in ("admin", "writer", "reader"))
    stream, table = f"sec_{secure.service_id}", f"sec_totals_{secure.service_id}"

    # No token, or one the cluster did not issue: UNAUTHENTICATED, and nothing about why the token is wrong.
    anonymous = client(secure, None)
    code, message = code_of(anonymous.execute, "SHOW STREAMS;")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in message
    forged = RouterClient(secure.router, credentials=ClientCredentials(secure.client_tls, "forged-token"))
    code, message = code_of(forged.execute, "SHOW STREAMS;")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "forged-token" not in message

    # Only admin runs DDL; the writer inserts; the reader reads.
    for who in (reader, writer):
        code, message = code_of(who.execute, f"CREATE STREAM {stream} (id VARCHAR KEY, amount INT) "
                                             f"WITH (kafka_topic='{stream}', partitions=2, value_format='JSON');")
        assert code == grpc.StatusCode.PERMISSION_DENIED and "needs the admin permission" in message
    admin.execute(f"CREATE STREAM {stream} (id VARCHAR KEY, amount INT) "
                  f"WITH (kafka_topic='{stream}', partitions=2, value_format='JSON');")
    admin.properties = {"auto.offset.reset": "earliest"}
    admin.execute(f"CREATE TABLE {table} AS SELECT id, COUNT(*) AS n, SUM(amount) AS total FROM {stream} GROUP BY id;")
    code, message = code_of(reader.execute, f"INSERT INTO {stream} (id, amount) VALUES ('a', 1);")
    assert code == grpc.StatusCode.PERMISSION_DENIED and "needs the write permission" in message
    for i in range(3):
        writer.execute(f"INSERT INTO {stream} (id, amount) VALUES ('k{i}', {i + 1});")
    assert sorted(map(tuple, wait_rows(reader, f"SELECT * FROM {table};", 3))) == [("k0", 1, 1), ("k1", 1, 2), ("k2", 1, 3)]
    assert [s for s in reader.execute("SHOW STREAMS;")[0].rows if str(s[0]).lower() == stream]

    # A batch is checked statement by statement: the reader's pull runs, its INSERT does not.
    code, message = code_of(reader.execute, f"SELECT * FROM {table} WHERE id = 'k0'; "
                                            f"INSERT INTO {stream} (id, amount) VALUES ('x', 1);")
    assert code == grpc.StatusCode.PERMISSION_DENIED

    # Cluster status is for admins.
    code, _ = code_of(router_status, secure.router, credentials=secure.credentials("reader"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert router_status(secure.router, credentials=secure.credentials("admin")).cluster.hosts

    # A push query needs read.
    push = reader.stream(f"SELECT id, amount FROM {stream} EMIT CHANGES;")
    assert [n for n, _ in push.columns] == ["ID", "AMOUNT"]
    push.cancel()
    for c in (admin, writer, reader, anonymous, forged):
        c.close()


def test_internal_rpcs_refuse_every_client_certificate_and_token(secure: LocalCluster, tmp_path: Path) -> None:
    admin = secure.credentials("admin")
    worker = secure.child("worker-1")
    coordinator = secure.child("coordinator")
    with admin.channel(secure.router) as channel:
        # An admin token over a client certificate cannot pose as a worker to the router...
        code, message = code_of(router_pb2_grpc.RouterServiceStub(channel).ReportHostStatus,
                                router_pb2.ReportHostStatusRequest(worker_id="worker-1", endpoint="127.0.0.1:1"),
                                timeout=10)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "internal to the cluster" in message
        # ... neither through the deprecated RPC above nor through the internal service.
        code, message = code_of(router_internal_pb2_grpc.RouterInternalServiceStub(channel).ReportWorkerStatus,
                                router_internal_pb2.ReportWorkerStatusRequest(worker_id="worker-1",
                                                                              endpoint="127.0.0.1:1"),
                                timeout=10)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "internal to the cluster" in message
        # ... nor through the stream the workers beat on.
        beat = router_internal_pb2.StreamWorkerStatusRequest(status=router_internal_pb2.ReportWorkerStatusRequest(
            worker_id="worker-1", endpoint="127.0.0.1:1"))
        code, message = code_of(router_internal_pb2_grpc.RouterInternalServiceStub(channel).StreamWorkerStatus,
                                iter([beat]), timeout=10)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "internal to the cluster" in message
    hosts = router_status(secure.router, credentials=admin).router_hosts
    assert "127.0.0.1:1" not in {h.endpoint for h in hosts}, "a client poisoned the router's view"
    with admin.channel(worker.endpoint) as channel:
        code, _ = code_of(worker_pb2_grpc.WorkerServiceStub(channel).Lookup,
                          worker_pb2.LookupRequest(table="X", partition=0, key=b"k"), timeout=10)
        assert code == grpc.StatusCode.PERMISSION_DENIED
    with admin.channel(coordinator.endpoint) as channel:
        code, _ = code_of(coordinator_pb2_grpc.CoordinatorServiceStub(channel).Heartbeat,
                          coordinator_pb2.HeartbeatRequest(worker_id="evil", endpoint="127.0.0.1:1"), timeout=10)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        beats = coordinator_pb2_grpc.CoordinatorServiceStub(channel).Heartbeats(iter([coordinator_pb2.HeartbeatsRequest(
            beat=coordinator_pb2.HeartbeatRequest(worker_id="evil", endpoint="127.0.0.1:1"))]), timeout=10)
        code, _ = code_of(list, beats)
        assert code == grpc.StatusCode.PERMISSION_DENIED

    # A certificate that claims the services' name but comes from another CA does not get
    # past the handshake; neither does a client without a certificate.
    impostor = LocalCa(tmp_path / "other-ca", "Impostor CA").issue(SERVICE_IDENTITY)
    assert secure.client_tls is not None
    forged = ClientCredentials(TlsFiles(impostor.cert, impostor.key, secure.client_tls.ca))
    with forged.channel(worker.endpoint) as channel:
        code, _ = code_of(worker_pb2_grpc.WorkerServiceStub(channel).Lookup,
                          worker_pb2.LookupRequest(table="X", partition=0, key=b"k"), timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE
    no_cert = grpc.ssl_channel_credentials(root_certificates=secure.client_tls.ca.read_bytes())
    with grpc.secure_channel(secure.router, no_cert) as channel:
        code, _ = code_of(router_pb2_grpc.RouterServiceStub(channel).Execute,
                          router_pb2.ExecuteRequest(sql="SHOW STREAMS;"), timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE
    # Plaintext is not served at all.
    with grpc.insecure_channel(secure.router) as channel:
        code, _ = code_of(router_pb2_grpc.RouterServiceStub(channel).Execute,
                          router_pb2.ExecuteRequest(sql="SHOW STREAMS;"), timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE


def test_limits_answer_with_a_clear_status(secure: LocalCluster) -> None:
    admin, reader = client(secure, "admin"), client(secure, "reader")
    stream, table = f"lim_{secure.service_id}", f"lim_totals_{secure.service_id}"
    admin.execute(f"CREATE STREAM {stream} (id VARCHAR KEY, amount INT) "
                  f"WITH (kafka_topic='{stream}', partitions=2, value_format='JSON');")
    admin.properties = {"auto.offset.reset": "earliest"}
    admin.execute(f"CREATE TABLE {table} AS SELECT id, COUNT(*) AS n FROM {stream} GROUP BY id;")
    for i in range(MAX_ROWS + 2):
        admin.execute(f"INSERT INTO {stream} (id, amount) VALUES ('k{i}', {i});")
    wait_rows(reader, f"SELECT * FROM {table} LIMIT {MAX_ROWS};", MAX_ROWS)
    deadline = time.monotonic() + 120
    while True:  # until every key is in the table, the full scan is over the limit
        try:
            reader.execute(f"SELECT * FROM {table};")
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert "max_rows_per_response" in str(err.details()) and "LIMIT" in str(err.details())
                break
        assert time.monotonic() < deadline, "a scan over the row limit was answered"
        time.sleep(0.25)
    assert len(reader.execute(f"SELECT * FROM {table} WHERE id = 'k1';")[0].rows) == 1

    code, message = code_of(reader.execute, "SHOW STREAMS; " + " ".join(["SHOW TABLES;"] * 200))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_statement_chars" in message
    code, message = code_of(reader.execute, "SHOW STREAMS; --" + "x" * (5 * 1024 * 1024))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED

    pushes = [reader.stream(f"SELECT * FROM {stream} EMIT CHANGES;") for _ in range(MAX_PUSH_PER_CLIENT)]
    code, message = code_of(reader.stream, f"SELECT * FROM {stream} EMIT CHANGES;")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_push_queries_per_client" in message
    other = client(secure, "writer").stream(f"SELECT * FROM {stream} EMIT CHANGES;")  # another principal's own quota
    for push in [*pushes, other]:
        push.cancel()
    for c in (admin, reader):
        c.close()


def served_serial(endpoint: str, tls: TlsFiles) -> int:
    """The serial number of the certificate ``endpoint`` presents in a new handshake."""
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.set_alpn_protocols(["h2"])
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as wrapped:
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_rotated_certificate_is_served_without_a_restart(secure: LocalCluster) -> None:
    assert secure.client_tls is not None
    before = {c.name: served_serial(c.endpoint, secure.client_tls) for c in secure.children}
    assert len(set(before.values())) == 1  # every service serves the one service certificate
    rotated = LocalCa(secure.data_dir / "tls").issue(SERVICE_IDENTITY)  # same files, new key and serial
    assert Path(secure.child("router").env["MILLPOND_TLS_CERT_FILE"]) == rotated.cert
    after = {c.name: served_serial(c.endpoint, secure.client_tls) for c in secure.children}
    assert all(after[name] != before[name] for name in before), (before, after)
    # The services still talk to each other (new channels use the new certificate) and to clients.
    reader = client(secure, "admin")
    assert reader.execute("SHOW STREAMS;")[0].rows
    status = router_status(secure.router, credentials=secure.credentials("admin"))
    assert all(h.alive for h in status.cluster.hosts)
    reader.close()


def test_a_nodejs_client_creates_inserts_and_pulls(secure: LocalCluster) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed for this test: apt-get install nodejs npm"
    assert (ROOT / "clients/node/node_modules/@grpc/grpc-js").is_dir(), "run `make install` (npm ci in clients/node)"
    tls = secure.client_tls
    assert tls is not None
    name = f"node_{secure.service_id}"
    done = subprocess.run([node, str(ROOT / "clients/node/smoke.js"), "--server", secure.router, "--name", name,
                           "--token", secure.tokens["admin"], "--ca", str(tls.ca), "--cert", str(tls.cert),
                           "--key", str(tls.key)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["consistency_token"]
    assert result["table"] == {"pump-1": {"n": 2, "total": 7}, "pump-2": {"n": 2, "total": 15},
                               "pump-3": {"n": 1, "total": -2}}
    assert result["lookup"] == {"columns": ["ID", "N", "TOTAL"], "rows": [["pump-2", "2", "15"]]}
    assert len(result["inserted"]) == 5


def test_kafka_clients_authenticate_with_sasl(secure: LocalCluster, kafka: EmbeddedKafka) -> None:
    """The cluster above runs on the SASL listener only; a client with a wrong password is
    refused there, so the queries that ran prove every Kafka client presented the settings."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    from millpond.shared.kafka.connection import KafkaConnection

    async def topics(password: str) -> list[str]:
        connection = KafkaConnection(kafka.sasl_bootstrap_servers, "SASL_PLAINTEXT", "PLAIN", "millpond", password)
        admin = AIOKafkaAdminClient(**connection.client_args(), request_timeout_ms=5000)
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    assert secure.bootstrap == kafka.sasl_bootstrap_servers
    assert any(t.startswith(f"_millpond-{secure.service_id}-") and t.endswith("-changelog")
               for t in asyncio.run(topics(kafka.sasl_users["millpond"])))
    with pytest.raises((KafkaError, OSError)):
        asyncio.run(topics("wrong-password"))
