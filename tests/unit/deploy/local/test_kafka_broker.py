"""The embedded broker's cluster id never starts with '-' (the storage tool would take it
for an option and the broker would not start: one start in 64 did)."""

from __future__ import annotations

import uuid
from unittest import mock

from millpond.deploy.local.kafka_broker import new_cluster_id


def test_an_id_that_would_start_with_a_dash_is_drawn_again() -> None:
    dashed, plain = uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" + bytes(15))
    with mock.patch("millpond.deploy.local.kafka_broker.uuid.uuid4", side_effect=[dashed, plain]) as draw:
        cluster_id = new_cluster_id()
    assert draw.call_count == 2
    assert cluster_id == "EAAAAAAAAAAAAAAAAAAAAA" and len(cluster_id) == 22


def test_ids_are_kafka_shaped() -> None:
    ids = {new_cluster_id() for _ in range(500)}
    assert len(ids) == 500 and not any(i.startswith("-") or len(i) != 22 for i in ids)
