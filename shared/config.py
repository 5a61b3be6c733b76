"""Typed, frozen configuration for every service.

Each setting has a default and a description; it can be overridden by an environment
variable (``MILLPOND_<FIELD>``, upper-case) or by a TOML file named in
``MILLPOND_CONFIG_FILE``. Environment variables win over the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


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
    def command_topic(self) -> str:
        """The cluster's command topic (one partition, every metastore change in order)."""
        return f"_millpond-{self.service_id}-command_topic"

    @property
    def processing_log_topic(self) -> str:
        """Where records that cannot be processed are written, with the reason."""
        return f"_millpond-{self.service_id}-processing_log"


class CoordinatorSettings(CommonSettings):
    """The coordinator's settings."""

    worker_session_timeout_ms: int = Field(
        3000, description="A worker with no heartbeat for this long is removed from the assignment."
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "latest", description="Where a new persistent query starts when the session does not SET "
        "'auto.offset.reset' (ksqlDB's default is latest).",
    )
    processing_log_stream: str = Field(
        "MILLPOND_PROCESSING_LOG", description="The stream declared over the processing-log topic at start-up, "
        "so records that failed can be queried (as ksqlDB's KSQL_PROCESSING_LOG); empty: do not declare it.",
    )


class WorkerSettings(CommonSettings):
    """A query worker's settings."""

    worker_id: str = Field("worker-1", description="This worker's unique id in the cluster.")
    coordinator: str = Field("127.0.0.1:8089", description="host:port of the coordinator.")
    state_dir: Path = Field(Path(".millpond/state"), description="Where RocksDB stores live.")
    spark_master: str = Field("local[2]", description="Spark master URL for this worker's queries.")
    spark_driver_memory: str = Field("1g", description="Heap of the worker's Spark driver JVM.")
    trigger_interval_ms: int = Field(250, description="Micro-batch trigger interval.")
    heartbeat_interval_ms: int = Field(100, description="How often to heartbeat the coordinator.")
    max_offsets_per_trigger: int = Field(
        0, description="Most input records one micro-batch reads over all its partitions; 0: no limit."
    )
    task_retry_initial_ms: int = Field(500, description="First wait before restarting a failed query's tasks.")
    task_retry_max_ms: int = Field(30000, description="Longest wait between restarts of a failing query's tasks.")


class RouterSettings(CommonSettings):
    """The router's settings."""

    port: int = Field(8088, description="Port of the client front door.")
    coordinator: str = Field("127.0.0.1:8089", description="host:port of the coordinator.")
    assignment_poll_interval_ms: int = Field(
        200, description="How often to refresh the task assignment from the coordinator."
    )
    request_timeout_ms: int = Field(10000, description="Deadline for calls to other services.")
