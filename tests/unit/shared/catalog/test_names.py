"""Kafka names are an on-disk contract: a renamed changelog or group is lost state. Each
builder must keep producing exactly the string it always has."""

from __future__ import annotations

from millpond.shared.catalog import names
from millpond.shared.config import WorkerSettings


def test_every_name_is_the_literal_it_has_always_been() -> None:
    assert names.command_topic("svc") == "_millpond-svc-command_topic"
    assert names.command_transactional_id("svc") == "svc"
    assert names.processing_log_topic("svc") == "_millpond-svc-processing_log"
    assert names.leader_topic("svc") == "_millpond-svc-coordinator_leader"
    assert names.leader_group("svc") == "_millpond-svc-coordinators"
    assert names.changelog_topic("svc", "CTAS_T_1") == "_millpond-svc-CTAS_T_1-changelog"
    assert names.repartition_topic("svc", "CTAS_T_1") == "_millpond-svc-CTAS_T_1-repartition"
    assert names.consumer_group("svc", "CTAS_T_1") == "_millpond-svc-CTAS_T_1"
    assert names.task_transactional_id("svc", "CTAS_T_1", 3) == "_millpond-svc-CTAS_T_1-3"
    assert names.task_transactional_id("svc", "CTAS_T_1", 3, "repartition") == "_millpond-svc-CTAS_T_1-3-repartition"


def test_a_warm_up_topic_takes_only_what_kafka_allows_of_the_worker_id() -> None:
    assert names.warm_up_topic_prefix("svc", "worker-1") == "_millpond-svc-warm-up-worker-1-"
    assert names.warm_up_topic_prefix("svc", "host a:7/w.1") == "_millpond-svc-warm-up-host_a_7_w.1-"


def test_settings_take_their_topics_from_the_names() -> None:
    settings = WorkerSettings(service_id="svc")
    assert settings.command_topic == "_millpond-svc-command_topic"
    assert settings.leader_topic == "_millpond-svc-coordinator_leader"
    assert settings.processing_log_topic == "_millpond-svc-processing_log"
