"""Who may call what: the tokens file, statement permissions and the per-RPC access rules."""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from millpond.shared.kafka.connection import TRANSACTION_RETRY_BACKOFF_MS, KafkaConnection
from millpond.shared.rpc.auth import INTERNAL_SERVICES, POLICY, Access, Authenticator, access_of
from millpond.shared.security import (
    AuthenticationError,
    Permission,
    PermissionDeniedError,
    Principal,
    TokenBook,
    authorize_statement,
    authorize_text,
    leading_keyword,
    parse_tokens,
    statement_permission,
)
from millpond.shared.sql.parser import parse_statement

TOKENS = f"""
[principals.alice]
token = "alice-secret"
permissions = ["read"]

[principals.ops]
token_sha256 = "{hashlib.sha256(b'ops-secret').hexdigest()}"
permissions = ["admin", "read", "write"]
"""


@pytest.fixture
def book(tmp_path: Path) -> TokenBook:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    return TokenBook(path)


def test_tokens_map_to_principals_by_plain_or_hashed_token(book: TokenBook) -> None:
    alice = book.authenticate("Bearer alice-secret")
    assert (alice.name, alice.permissions, alice.service) == ("alice", frozenset({Permission.READ}), False)
    assert book.authenticate("bearer   ops-secret ").name == "ops"


@pytest.mark.parametrize("header, says", [
    (None, "needs a bearer token"), ("", "needs a bearer token"), ("Basic abc", "must be 'Bearer <token>'"),
    ("Bearer", "must be 'Bearer <token>'"), ("Bearer wrong", "not valid"), ("Bearer ops-secret2", "not valid"),
])
def test_missing_malformed_and_unknown_tokens_are_unauthenticated(book: TokenBook, header: str | None, says: str) -> None:
    with pytest.raises(AuthenticationError, match=says):
        book.authenticate(header)


def test_the_tokens_file_is_read_again_when_it_changes(book: TokenBook) -> None:
    book.path.write_text('[principals.bob]\ntoken = "bob-secret"\npermissions = ["write"]\n')
    stat = book.path.stat()
    os.utime(book.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert book.authenticate("Bearer bob-secret").permissions == frozenset({Permission.WRITE})
    with pytest.raises(AuthenticationError):
        book.authenticate("Bearer alice-secret")
    # A broken rewrite keeps the last good file.
    book.path.write_text("[principals")
    os.utime(book.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    assert book.authenticate("Bearer bob-secret").name == "bob"


@pytest.mark.parametrize("text, says", [
    ("[principals", "is not TOML"),
    ("x = 1", r"\[principals.<name>\]"),
    ("[principals.a]\npermissions = []", "exactly one of token and token_sha256"),
    ('[principals.a]\ntoken = "t"\ntoken_sha256 = "ab"', "exactly one"),
    ('[principals.a]\ntoken = "t"\npermissions = ["root"]', "must be a list drawn from"),
    ('[principals.a]\ntoken = "t"\npermissions = [["read"]]', "must be a list drawn from"),  # was a TypeError
])
def test_a_bad_tokens_file_says_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_tokens(text)


@pytest.mark.parametrize("sql, needs", [
    ("SELECT * FROM t WHERE k = 'a';", Permission.READ),
    ("SELECT * FROM s EMIT CHANGES;", Permission.READ),
    ("SHOW TABLES;", Permission.READ),
    ("DESCRIBE t;", Permission.READ),
    ("INSERT INTO s (k, v) VALUES ('a', 1);", Permission.WRITE),
    ("INSERT INTO s SELECT * FROM r;", Permission.ADMIN),
    ("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', value_format='JSON');", Permission.ADMIN),
    ("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k;", Permission.ADMIN),
    ("DROP TABLE t;", Permission.ADMIN),
    ("TERMINATE ALL;", Permission.ADMIN),
    ("SET 'auto.offset.reset'='earliest';", None),
])
def test_each_statement_needs_its_permission(sql: str, needs: Permission | None) -> None:
    stmt = parse_statement(sql)
    assert statement_permission(stmt) == needs
    reader = Principal("reader", frozenset({Permission.READ}))
    if needs in (None, Permission.READ):
        authorize_statement(reader, stmt)
    else:
        with pytest.raises(PermissionDeniedError, match=f"needs the {needs.value} permission"):
            authorize_statement(reader, stmt)
    authorize_statement(Principal("svc", frozenset(), service=True), stmt)


def test_internal_rpcs_take_only_service_certificates_whatever_the_token(book: TokenBook) -> None:
    auth = Authenticator(book, frozenset({"millpond-service"}))
    heartbeat = "/millpond.coordinator.v1.CoordinatorService/Heartbeat"
    assert auth.principal(heartbeat, "millpond-service", None).service
    for common_name in ("alice", "millpond-service-evil", None):
        with pytest.raises(PermissionDeniedError, match="internal to the cluster"):
            auth.principal(heartbeat, common_name, "Bearer ops-secret")
    # Not in the policy: internal by default.
    with pytest.raises(PermissionDeniedError):
        auth.principal("/millpond.worker.v1.WorkerService/SomethingNew", "alice", "Bearer ops-secret")


def test_client_rpcs_check_the_token_and_the_method_permission(book: TokenBook) -> None:
    auth = Authenticator(book, frozenset({"millpond-service"}))
    status = "/millpond.router.v1.RouterService/GetClusterStatus"
    assert auth.principal(status, "client", "Bearer ops-secret").name == "ops"
    with pytest.raises(PermissionDeniedError, match="needs the admin permission"):
        auth.principal(status, "client", "Bearer alice-secret")
    with pytest.raises(AuthenticationError):
        auth.principal("/millpond.router.v1.RouterService/Execute", "client", None)
    assert auth.principal("/millpond.router.v1.RouterService/StreamQuery", "client", "Bearer alice-secret").name == "alice"
    assert access_of("/grpc.health.v1.Health/Check") is Access.OPEN


def test_without_a_tokens_file_a_verified_certificate_is_enough_for_client_rpcs() -> None:
    auth = Authenticator(None, frozenset({"millpond-service"}))
    principal = auth.principal("/millpond.router.v1.RouterService/Execute", "carol", None)
    assert principal.name == "carol" and principal.permissions == frozenset(Permission)
    with pytest.raises(PermissionDeniedError):
        auth.principal("/millpond.router.v1.RouterService/ReportHostStatus", "carol", None)
    with pytest.raises(PermissionDeniedError, match="internal to the cluster"):
        auth.principal("/millpond.router.v1.RouterInternalService/ReportWorkerStatus", "carol", None)


def test_every_method_of_an_internal_service_is_for_the_services_only() -> None:
    for service in INTERNAL_SERVICES:
        assert access_of(f"/{service}/AnyMethod") is Access.SERVICE
    assert not {m for m in POLICY if m.lstrip("/").partition("/")[0] in INTERNAL_SERVICES}
    auth = Authenticator(None, frozenset({"millpond-service"}))
    assert auth.principal("/millpond.router.v1.RouterInternalService/ReportWorkerStatus", "millpond-service",
                          None).service


def test_kafka_security_settings_reach_aiokafka_and_spark() -> None:
    plain = KafkaConnection("b:9092")
    assert plain.client_args() == {"bootstrap_servers": "b:9092", "security_protocol": "PLAINTEXT"}
    assert plain.spark_options() == {"kafka.bootstrap.servers": "b:9092", "kafka.security.protocol": "PLAINTEXT"}
    sasl = KafkaConnection("b:9093", "SASL_PLAINTEXT", "SCRAM-SHA-512", "svc", 'pa"ss')
    args = sasl.client_args()
    assert (args["sasl_mechanism"], args["sasl_plain_username"], args["sasl_plain_password"]) == (
        "SCRAM-SHA-512", "svc", 'pa"ss')
    assert sasl.spark_options()["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="pa\\"ss";')
    # Transactional producers (tasks, the command log) connect the same way, and retry the
    # moment after a commit, when the coordinator still writes its markers, after 20 ms, not 100.
    assert sasl.transactional_args("t") == {**args, "transactional_id": "t", "enable_idempotence": True,
                                            "retry_backoff_ms": TRANSACTION_RETRY_BACKOFF_MS}
    assert TRANSACTION_RETRY_BACKOFF_MS < inspect.signature(AIOKafkaProducer).parameters["retry_backoff_ms"].default


@pytest.mark.parametrize("name, settings_class", [
    ("coordinator.toml", "CoordinatorSettings"), ("worker.toml", "WorkerSettings"), ("router.toml", "RouterSettings"),
])
def test_the_multihost_example_configurations_load(name: str, settings_class: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    from millpond.shared import config

    path = Path(__file__).resolve().parents[3] / "deploy" / "multihost" / name
    cls = getattr(config, settings_class)
    for key in tomllib.loads(path.read_text()):
        assert key in cls.model_fields, f"{name}: {key} is not a {settings_class} setting"
    for var in [v for v in os.environ if v.startswith("MILLPOND_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("MILLPOND_CONFIG_FILE", str(path))
    settings = cls()
    assert settings.service_id == "prod" and settings.kafka.security_protocol == "SASL_SSL"
    assert settings.tls is not None


def test_text_is_authorized_by_its_first_keyword_before_it_is_parsed() -> None:
    reader = Principal("reader", frozenset({Permission.READ}))
    writer = Principal("writer", frozenset({Permission.WRITE}))
    nobody = Principal("nobody", frozenset())
    assert leading_keyword("  -- a comment\n\tcreate table t") == "CREATE"
    authorize_text(reader, "select * from t")
    authorize_text(writer, "INSERT INTO t VALUES (1)")  # INSERT ... SELECT is decided after the parse
    authorize_text(nobody, "SET 'auto.offset.reset'='earliest'")
    with pytest.raises(PermissionDeniedError, match="needs the admin permission"):
        authorize_text(reader, "-- x\nDROP TABLE t")
    with pytest.raises(PermissionDeniedError, match="holds no permission"):
        authorize_text(nobody, "((((")
    authorize_text(reader, "((((")  # the parser will say what is wrong
