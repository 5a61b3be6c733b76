"""SHOW QUERIES' state column: the tasks counted by state, as ksqlDB's ``RUNNING:2``."""

from __future__ import annotations

from millpond.shared.task_status import FAILED, RUNNING, STARTING, STOPPING, TaskReport, summarize


def test_every_state_is_counted_in_a_fixed_order_stopping_last() -> None:
    reports = [TaskReport("Q", p, state) for p, state in enumerate([STOPPING, RUNNING, FAILED, RUNNING, STARTING])]
    assert summarize(reports) == "RUNNING:2, STARTING:1, FAILED:1, STOPPING:1"
    assert summarize([]) == ""
