"""What the worker offers the coordinator's assignor while its Spark session starts: a
restarted worker takes no active before it could run it (the soak's restarted worker held
two partitions for 56 s while its Spark session started)."""

from __future__ import annotations

from millpond.services.coordinator.assignor import AssignorConfig, QueryTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.services.worker.membership import offered_lags
from millpond.shared.task_status import RUNNING, StoreLag, TaskReport


def beat(cluster: Cluster, worker: str, active: list[int], caught_up: list[int], spark_ready: bool = True) -> None:
    reports = [TaskReport("Q", p, RUNNING, worker_id=worker) for p in active]
    lags = [StoreLag("Q", p, True, 10, 10) for p in active] + [StoreLag("Q", p, False, 10, 10) for p in caught_up]
    cluster.beat(worker, f"{worker}:1", reports, offered_lags(lags, spark_ready))


def test_a_worker_whose_spark_starts_is_offered_no_active_until_it_started() -> None:
    cluster = Cluster(0.2, AssignorConfig(num_standby_replicas=1), clock=lambda: 100.0, wall_ms=lambda: 100_000)
    beat(cluster, "w1", active=[0, 1, 2], caught_up=[3, 4, 5])
    beat(cluster, "w2", active=[3, 4, 5], caught_up=[0, 1, 2])
    cluster.lead(1)
    queries = [QueryTasks("Q", 6)]
    cluster.reassign(queries)
    # w3 comes back with copies it restored (caught up), its Spark session still starting.
    beat(cluster, "w3", active=[], caught_up=[0, 3], spark_ready=False)
    cluster.reassign(queries)
    assert cluster.assignment.tasks_of("w3").active == ()
    assert len(cluster.assignment.pending) == 2  # held back where they run while w3 warms up
    beat(cluster, "w3", active=[], caught_up=[0, 3], spark_ready=True)
    cluster.reassign(queries)
    assert len(cluster.assignment.tasks_of("w3").active) == 2


def test_actives_are_always_offered() -> None:
    lags = [StoreLag("Q", 0, True, 10, 10), StoreLag("Q", 1, False, 10, 10)]
    assert offered_lags(lags, spark_ready=False) == lags[:1] and offered_lags(lags, spark_ready=True) == lags
