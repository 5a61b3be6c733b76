"""Typed, frozen configuration for every service.

Each setting has a default and a description; it can be overridden by an environment
variable (``MILLPOND_<FIELD>``, upper-case) or by a TOML file named in
``MILLPOND_CONFIG_FILE``. Environment variables win over the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from millpond.shared.catalog import names
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.rpc.tls import TlsFiles
from millpond.shared.sql.guard import ParseLimits


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix="MILLPOND_", frozen=True, extra="ignore")

    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,host:port...]."
    )
    service_id: str = Field(
        "millpond", description="The cluster's id: names the command topic and internal topics."
    )
    host: str = Field("127.0.0.1", description="Address this service's gRPC server binds to.")
    port: int = Field(0, description="Port of this service's gRPC server; 0 picks a free one.")
    log_level: str = Field("INFO", description="Python logging level.")
    metrics_port: int | None = Field(
        None, description="Serve Prometheus metrics over HTTP at /metrics on this port (0 picks a free one); "
        "unset: no metrics endpoint.",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka's security.protocol for every Kafka client of the service, Spark's included.",
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="Kafka's sasl.mechanism, with a SASL security protocol.",
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user name, with a SASL security protocol.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password, with a SASL security protocol.")
    kafka_ssl_ca_file: str | None = Field(
        None, description="PEM file of the CA that signs the brokers' certificates (SSL and SASL_SSL); unset: the "
        "system's trusted CAs.",
    )
    kafka_ssl_cert_file: str | None = Field(
        None, description="PEM certificate this service presents to the brokers (SSL client authentication).",
    )
    kafka_ssl_key_file: str | None = Field(None, description="PEM private key of kafka_ssl_cert_file.")
    tls_cert_file: str | None = Field(
        None, description="PEM certificate of this service's gRPC server, also presented as its client certificate "
        "to the other services. With tls_key_file and tls_ca_file set every endpoint serves mutual TLS; the files "
        "are read again when they change.",
    )
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_ca_file: str | None = Field(
        None, description="PEM CA certificate(s) that sign the certificates of the services and clients.",
    )
    service_identities: str = Field(
        "millpond-service", description="Comma-separated common names of the services' own certificates: callers "
        "presenting one may call the internal RPCs (heartbeats, lag reports, assignments, local lookups).",
    )
    auth_tokens_file: str | None = Field(
        None, description="TOML file mapping bearer tokens to principals and their permissions (read, write, admin); "
        "set, every client call must carry 'authorization: Bearer <token>'. Read again when it changes.",
    )
    max_statement_chars: int = Field(
        65536, description="Longest statement text (a whole request) a router or coordinator accepts; a longer one "
        "is refused with INVALID_ARGUMENT before it is parsed.",
    )
    parse_timeout_ms: int = Field(
        2000, description="Longest a router or coordinator spends parsing one request's statements (off its event "
        "loop); a statement that takes longer is refused with INVALID_ARGUMENT.",
    )
    max_message_bytes: int = Field(
        4 * 1024 * 1024, description="Largest gRPC message this service accepts or sends; a larger request is "
        "refused with RESOURCE_EXHAUSTED.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("MILLPOND_CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    @property
    def kafka(self) -> KafkaConnection:
        """How this service's Kafka clients connect."""
        return KafkaConnection(
            self.kafka_bootstrap_servers, self.kafka_security_protocol, self.kafka_sasl_mechanism,
            self.kafka_sasl_username,
            self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password is not None else None,
            self.kafka_ssl_ca_file, self.kafka_ssl_cert_file, self.kafka_ssl_key_file)

    @property
    def tls(self) -> TlsFiles | None:
        """This service's certificate, key and CA, when its endpoints serve mutual TLS."""
        return TlsFiles.of(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    @property
    def parse_limits(self) -> ParseLimits:
        """What this service accepts of a client's statement text."""
        return ParseLimits(max_chars=self.max_statement_chars, timeout_s=self.parse_timeout_ms / 1000)

    @property
    def command_topic(self) -> str:
        """The cluster's command topic (one partition, every metastore change in order)."""
        return names.command_topic(self.service_id)

    @property
    def leader_topic(self) -> str:
        """The one-partition topic whose consumer group elects the leading coordinator."""
        return names.leader_topic(self.service_id)

    @property
    def processing_log_topic(self) -> str:
        """Where records that cannot be processed are written, with the reason."""
        return names.processing_log_topic(self.service_id)


class CoordinatorSettings(CommonSettings):
    """The coordinator's settings."""

    statement_timeout_ms: int = Field(
        60000, description="The longest a statement may run once started (its caller going away does not stop it: "
        "cut short, it would leave Kafka clients half-connected); past it, the statement is cancelled and answered "
        "UNAVAILABLE.")

    worker_session_timeout_ms: int = Field(
        200, description="A worker with no heartbeat for this long is a suspect, as is one whose heartbeat stream "
        "broke (its process died): the coordinator checks its health endpoint and removes it from the assignment "
        "unless it answers (workers beat every 100 ms by default).",
    )
    worker_probe_timeout_ms: int = Field(
        1000, description="How long a suspect worker's health check may take. A killed worker refuses at once and is "
        "declared dead then; one that does not answer in time is only declared dead after worker_max_silence_ms.",
    )
    worker_max_silence_ms: int = Field(
        3000, description="A worker silent this long is dead even if its endpoint still accepts connections (hung). "
        "On a loaded 2-core machine a live worker's event loop can stall for over a second.",
    )
    num_standby_replicas: int = Field(
        1, description="Standby copies of each table partition, each on another worker than its active "
        "(ksqlDB's ksql.streams.num.standby.replicas).",
    )
    acceptable_recovery_lag: int = Field(
        10_000, description="A task moves to a worker only once that worker's copy is within this many changelog "
        "records of the end; until then the worker gets a warm-up replica (KIP-441).",
    )
    max_warmup_replicas: int = Field(2, description="Most warm-up replicas the cluster builds at once.")
    moved_active_settle_ms: int = Field(
        3000, ge=0, description="How long a task's active that moved (a failover, a handoff) stays on its new worker "
        "before the balance may move it on to a warm-up that caught up meanwhile, so its first batches are processed "
        "rather than cut short (Kafka Streams waits for its next probing rebalance).",
    )
    coordinator_id: str = Field(
        "", description="This coordinator's id among the cluster's coordinators (empty: host:port of its server).",
    )
    leader_session_timeout_ms: int = Field(
        6000, description="Session timeout of the coordinators' leader-election consumer group: a dead leader is "
        "replaced after about this long. Must lie within the brokers' group.min/max.session.timeout.ms.",
    )
    rebalance_check_interval_ms: int = Field(
        500, description="How often the coordinator re-runs the assignor with fresh lags, so finished warm-ups "
        "become actives.",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "latest", description="Where a new persistent query starts when the session does not SET "
        "'auto.offset.reset' (ksqlDB's default is latest).",
    )
    internal_topic_replicas: int = Field(
        0, ge=0, description="Replication factor of every internal topic: command, changelogs, repartition, "
        "processing log and leader election (ksqlDB's ksql.internal.topic.replicas); 0: min(3, brokers). The command "
        "topic also keeps its records forever and takes min.insync.replicas 2 from 3 replicas on.",
    )
    processing_log_stream: str = Field(
        "MILLPOND_PROCESSING_LOG", description="The stream declared over the processing-log topic at start-up, "
        "so records that failed can be queried (as ksqlDB's KSQL_PROCESSING_LOG); empty: do not declare it.",
    )


def endpoints(text: str) -> list[str]:
    """``host:port`` entries of a comma-separated list."""
    return [e.strip() for e in text.split(",") if e.strip()]


class CoordinatorClientSettings(CommonSettings):
    """Settings of a service that talks to the coordinators."""

    coordinator: str = Field(
        "127.0.0.1:8089", description="host:port of the coordinator, or of each coordinator, comma-separated.",
    )

    @property
    def coordinators(self) -> list[str]:
        """Every coordinator's host:port."""
        return endpoints(self.coordinator)


class WorkerSettings(CoordinatorClientSettings):
    """A query worker's settings."""

    worker_id: str = Field("worker-1", description="This worker's unique id in the cluster.")
    state_dir: Path = Field(Path(".millpond/state"), description="Where RocksDB stores live.")
    spark_master: str = Field("local[2]", description="Spark master URL for this worker's queries.")
    jar_cache: Path | None = Field(
        None, description="The cache `millpond jars` fetched the Spark Kafka connector into (its jars/ folder holds one "
        "directory per bundle); unset: MILLPOND_CACHE or ~/.cache/millpond. The worker never fetches jars itself.",
    )
    spark_driver_memory: str = Field("1g", description="Heap of the worker's Spark driver JVM.")
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="More Spark configuration for the worker's session, over Millpond's own "
        "(a JSON object in MILLPOND_SPARK_CONF, a table in the TOML file), e.g. spark.driver.host, spark.driver.port "
        "and spark.blockManager.port so a Spark master's executors can reach the worker's driver.",
    )
    spark_warm_up_batches: int = Field(
        5, description="Batches of 50,000 made-up JSON records the worker's Spark session reduces when it starts, "
        "before it takes a query, so the JVM has compiled the batch path (about 4 s of a core); until then the "
        "worker offers no copy to take an active over. 0: none (a query's first batches then run the cold code).",
    )
    spark_warm_up_triggers: int = Field(
        250, description="Micro-batches of 1,000 made-up JSON records a streaming query reads over the Kafka "
        "source (from a topic of its own, deleted after) and reduces after spark_warm_up_batches, so the JVM has "
        "compiled the per-batch path too (the streaming engine's trigger, planning, scheduling, the Kafka "
        "reads): about 0.06 s each alone, 0.15 s on two cores shared with a busy cluster; as many as 60 s allow. 0: none (a query's "
        "batches then take about a minute of input to reach their warm speed).",
    )
    spark_cores: int = Field(
        0, description="Cores (threads) Spark gives this worker's queries, as ksqlDB's num.stream.threads: with a "
        "local master it sets local[N], with a cluster master spark.cores.max; 0 leaves spark_master as it is.",
    )
    routers: str = Field(
        "", description="host:port of each router, comma-separated: the worker sends them heartbeats and lag reports.",
    )
    trigger_interval_ms: int = Field(
        0, description="Least time between the starts of two micro-batches; 0: the next batch starts as soon as the "
        "previous one committed, when there is input.",
    )
    gil_switch_interval_ms: float = Field(
        0.5, gt=0, description="How long a thread of the worker's Python holds the interpreter lock while another waits for "
        "it (sys.setswitchinterval; Python's default is 5). Every call into Spark's JVM takes the lock back when its answer "
        "comes: behind a thread busy in Python each waits out the interval (a moved partition's plan makes 73 such "
        "calls).",
    )
    idle_poll_ms: int = Field(
        100, description="How often a running query with no new input asks Kafka for some (Spark's "
        "spark.sql.streaming.pollingDelay).",
    )
    parked_fetch_wait_ms: int = Field(
        10000, gt=0, description="How long the fetch that follows the parked queries' inputs (one consumer for all of "
        "them) waits at the broker while nothing is committed to them. The broker answers it as soon as something is, "
        "so a parked query hears of new input within a round trip of its commit whatever this is (and then starts "
        "again, about a second); this sets how often an idle worker asks. Asking every 500 ms instead (end offsets, "
        "the watch before it) took an idle worker's processing loop about 0.2% of a core.",
    )
    park_after_idle_ms: int = Field(
        15000, description="A query stage with no input for this long stops its Spark query (its tables stay open "
        "and serve) until its input moves, so idle queries cost almost nothing; the first record after a parked "
        "spell waits for the query to start again (about a second). 0: never park.",
    )
    heartbeat_interval_ms: int = Field(
        100, description="How often to heartbeat the coordinators and routers, on a stream to each (a worker that dies "
        "is seen at once by its stream breaking, and the coordinator sends a new assignment on it as soon as it is "
        "made): how late a hung worker is suspected and how old its reported lags can be.",
    )
    max_offsets_per_trigger: int = Field(
        0, description="Most input records one micro-batch reads over all its partitions; 0: no limit."
    )
    max_scan_rows: int = Field(
        100_000, description="Most table rows one pull-query scan reads on this worker; a scan that would read more "
        "is refused with RESOURCE_EXHAUSTED (add a LIMIT or look up a key). The worker filters by the query's WHERE "
        "itself, so a filtered scan reads until it has the router's max_rows_per_response + 1 rows that pass (or "
        "its LIMIT); an unfiltered one reads at most that many rows.",
    )
    serve_router: bool = Field(
        False, description="Also serve RouterService (Execute, StreamQuery, GetClusterStatus) on this worker's port, "
        "as ksqlDB's nodes do: pulls of partitions whose copy is here are answered in-process, the rest forwarded "
        "to their workers, so a client that asks the owner pays one hop. The router's settings (MILLPOND_...) apply.",
    )
    task_retry_initial_ms: int = Field(500, description="First wait before restarting a failed query's tasks.")
    task_retry_max_ms: int = Field(30000, description="Longest wait between restarts of a failing query's tasks.")

    @property
    def router_endpoints(self) -> list[str]:
        """Every router's host:port."""
        return endpoints(self.routers)

    @property
    def spark_local(self) -> bool:
        """Whether the worker's Spark master is local: its own JVM runs the batches' tasks."""
        return self.spark_master.startswith("local")


class RouterSettings(CoordinatorClientSettings):
    """The router's settings."""

    port: int = Field(8088, description="Port of the client front door.")
    assignment_poll_interval_ms: int = Field(
        1000, description="How often to ask the coordinators for the task assignment, besides following the changes "
        "they push (a fallback while a coordinator's stream is down)."
    )
    request_timeout_ms: int = Field(10000, description="Deadline for calls to other services.")
    host_dead_after_ms: int = Field(
        500, description="A worker whose heartbeats to this router stopped for this long, or whose heartbeat stream "
        "broke, is asked last for pull queries (workers beat every 100 ms).",
    )
    enable_standby_reads: bool = Field(
        False, description="Let pull queries be answered by a standby copy when the active cannot answer "
        "(ksqlDB's ksql.query.pull.enable.standby.reads); the copy may be slightly behind. A request's "
        "properties override it.",
    )
    max_allowed_offset_lag: int | None = Field(
        None, description="Default bound on how many changelog records a copy answering a pull query may be "
        "behind (ksqlDB's ksql.query.pull.max.allowed.offset.lag); None: no bound.",
    )
    max_staleness_ms: int | None = Field(
        None, description="Default bound on how old the newest change a copy answering a pull query may be "
        "missing can be, in milliseconds (millpond.query.pull.max.staleness.ms); None: no bound.",
    )
    pull_host_timeout_ms: int = Field(
        1000, description="How long one worker may take to answer a key lookup before the next copy is asked "
        "(a scan has the request's whole deadline).",
    )
    max_push_queries: int = Field(100, description="Most push queries this router streams at once.")
    max_push_queries_per_client: int = Field(
        10, description="Most push queries one client (its principal, or its address without authentication) "
        "streams at once; one more is refused with RESOURCE_EXHAUSTED.",
    )
    parse_cache_bytes: int = Field(
        64 * 1024 * 1024, description="Bound on the memory of the parses the router keeps for requests that repeat "
        "them, counted as 128 bytes per byte of statement text (a syntax tree takes 27-118 times its text): 64 MiB "
        "holds 512 KiB of text, some 8,000 lookups; the least recently used go first. 0: keep none (nor the key "
        "lookups made of a known lookup's template, which are kept by text too, up to 1,024 texts of at most 512 "
        "characters).",
    )
    max_rows_per_response: int = Field(
        10000, ge=1, description="Most rows one pull query may return (1 or more); a pull query that would return more is refused "
        "with RESOURCE_EXHAUSTED (add a LIMIT or a narrower WHERE).",
    )
