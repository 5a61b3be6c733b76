"""The short version of bench/fuzz (issue 19's soak): fuzzed statements through the router
and malformed protobuf requests at every public RPC of the router and the coordinator, on a
cluster of its own without workers (no Spark), on a broker of its own: fuzzed INSERTs and
CREATEs name the same topics other tests use (``readings``, ...). No service crashes,
every call gets a status in time, bad input gets no UNKNOWN or INTERNAL, the services still
serve, and their logs hold no unhandled exception."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fuzz
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.net import free_port


@pytest.fixture
def bare_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A coordinator and a router, no workers, with the readings example applied."""
    local = LocalCluster(data_dir=tmp_path, workers=0, router_port=free_port(),
                         service_id=f"fuzz{os.getpid()}", router_env=fuzz.ROUTER_ENV)
    local.start()
    try:
        fuzz.prepare(local)
        yield local
    finally:
        local.stop()


def test_fuzzed_statements_and_malformed_messages_get_statuses_and_break_nothing(bare_cluster: LocalCluster) -> None:
    result = fuzz.run(bare_cluster, statements=300, messages=30, seed=19, oversized=False)
    summary = {k: result[k] for k in ("crashes", "hung_calls", "suspect_answers", "unhandled_exceptions_in_logs")}
    details = {"samples": [result["statements"]["samples"], result["messages"]["samples"]], "logs": result["logs"]}
    assert summary == {"crashes": 0, "hung_calls": 0, "suspect_answers": 0, "unhandled_exceptions_in_logs": 0}, details
    assert result["all_serving"], result["services"]
    assert result["messages"]["rpcs"] == 24  # every method of both services, health and reflection included
    assert sum(sum(c.values()) for c in result["messages"]["codes"].values()) == 24 * 30
    assert sum(sum(c.values()) for c in result["statements"]["codes"].values()) == 300
