"""The coordinator's cluster view: leader generations, takeover from what workers report,
failure verdicts against an injected clock, and what cluster status shows."""

from __future__ import annotations

import pytest

from millpond.cli.status import lag_outcome, status_outcome
from millpond.coordinator.v1 import coordinator_pb2
from millpond.router.v1 import router_pb2
from millpond.services.coordinator.assignor import AssignorConfig, QueryTasks, Task
from millpond.services.coordinator.cluster import EPOCH_SHIFT, Cluster
from millpond.services.coordinator.converters import host_statuses
from millpond.shared.errors import AlreadyExistsError
from millpond.shared.task_status import RUNNING, STOPPING, StoreLag, TaskReport


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock) -> Cluster:
    return Cluster(0.2, AssignorConfig(num_standby_replicas=1), clock=clock, wall_ms=lambda: int(clock.now * 1000))


def beat(cluster: Cluster, worker: str, active: list[int] = (), standby: list[int] = ()) -> bool:  # type: ignore[assignment]
    reports = [TaskReport("Q", p, RUNNING, worker_id=worker) for p in active]
    lags = [StoreLag("Q", p, True, 10, 10) for p in active] + [StoreLag("Q", p, False, 5, 10) for p in standby]
    return cluster.beat(worker, f"{worker}:1", reports, lags)


def test_a_follower_assigns_nothing_and_generations_grow_with_each_leader() -> None:
    clock = Clock()
    cluster = make(clock)
    assert beat(cluster, "w1") and beat(cluster, "w2")
    assert not beat(cluster, "w1")  # a known member
    queries = [QueryTasks("Q", 4)]
    assert not cluster.reassign(queries) and cluster.generation == 0 and not cluster.assignment.workers

    cluster.lead(7)
    assert cluster.reassign(queries)
    first = cluster.generation
    assert first >> EPOCH_SHIFT == 7 and first & ((1 << EPOCH_SHIFT) - 1) == 1
    assert not cluster.reassign(queries) and cluster.generation == first  # unchanged: same generation

    cluster.follow()
    assert cluster.generation == 0 and not cluster.reassign(queries)
    cluster.lead(9)
    cluster.reassign(queries)
    assert cluster.generation > first  # a later leader's orders win at the workers


def test_a_new_leader_keeps_tasks_where_the_workers_report_them() -> None:
    clock = Clock()
    cluster = make(clock)
    beat(cluster, "w1", active=[0, 3], standby=[1])
    beat(cluster, "w2", active=[1, 2], standby=[0])
    cluster.lead(1)
    cluster.reassign([QueryTasks("Q", 4)])
    a = cluster.assignment
    assert a.tasks_of("w1").active == (Task("Q", 0), Task("Q", 3))
    assert a.tasks_of("w2").active == (Task("Q", 1), Task("Q", 2))
    assert a.standbys_of(Task("Q", 0)) == ["w2"] and a.standbys_of(Task("Q", 1)) == ["w1"]


def test_silent_workers_are_suspects_and_removal_moves_their_tasks() -> None:
    clock = Clock()
    cluster = make(clock)
    beat(cluster, "w1")
    beat(cluster, "w2")
    cluster.lead(1)
    queries = [QueryTasks("Q", 4)]
    cluster.reassign(queries)
    clock.now += 0.15
    beat(cluster, "w1")
    assert cluster.membership.suspects() == []
    clock.now += 0.1
    assert [m.worker_id for m in cluster.membership.suspects()] == ["w2"]
    cluster.membership.vouch("w2")  # it answered its health check: not dead
    assert cluster.membership.suspects() == []
    clock.now += 0.3
    beat(cluster, "w1")
    assert cluster.remove("w2") and not cluster.remove("w2")
    cluster.reassign(queries)
    assert len(cluster.assignment.tasks_of("w1").active) == 4
    status = {h.worker_id: h for h in host_statuses(cluster)}
    assert status["w2"].alive is False and not status["w2"].active_tasks
    assert status["w2"].last_status_update_ms == 100_000  # its last beat, not when it was dropped
    assert status["w1"].alive and len(status["w1"].active_tasks) == 4


def test_an_active_that_moved_settles_before_the_balance_moves_it_on() -> None:
    clock = Clock()
    cluster = Cluster(0.2, AssignorConfig(num_standby_replicas=1), clock=clock, settle_s=3.0)
    queries = [QueryTasks("Q", 2)]
    for worker in ("w1", "w2"):
        beat(cluster, worker)
    cluster.lead(1)
    cluster.reassign(queries)
    (moving,) = cluster.assignment.tasks_of("w1").active
    beat(cluster, "w1", [moving.partition])
    beat(cluster, "w2", [p for p in range(2) if p != moving.partition], [moving.partition])
    beat(cluster, "w3")  # a new worker: the balance wants one active there
    cluster.remove("w1")
    cluster.reassign(queries)
    assert cluster.assignment.active_of(moving) == "w2"  # the standby holder, caught up
    assert cluster.assignment.pending == {moving: "w3"}
    beat(cluster, "w3", standby=[moving.partition])  # its warm-up caught up
    clock.now += 2.9
    cluster.reassign(queries)
    assert cluster.assignment.active_of(moving) == "w2"  # still settling
    clock.now += 0.2
    assert cluster.reassign(queries)
    assert cluster.assignment.active_of(moving) == "w3" and not cluster.assignment.pending


def test_task_reports_only_count_the_assigned_active() -> None:
    clock = Clock()
    cluster = make(clock)
    beat(cluster, "w1", active=[0, 1])
    cluster.lead(1)
    cluster.reassign([QueryTasks("Q", 2)])
    beat(cluster, "w2", active=[0])  # a stale report from a worker that lost the task
    assert {(r.worker_id, r.partition) for r in cluster.task_reports()["Q"]} == {("w1", 0), ("w1", 1)}


def test_a_query_runs_while_a_live_worker_reports_a_task_still_stopping_or_a_copy_of_it() -> None:
    """What a terminated query's topics wait for (``topic_cleanup``); a stopping task is not
    one a new leader keeps where it is."""
    clock = Clock()
    cluster = make(clock)
    beat(cluster, "w1", active=[0])
    beat(cluster, "w2", standby=[0])
    assert cluster.runs("Q") and not cluster.runs("OTHER")
    cluster.beat("w1", "w1:1", [TaskReport("Q", 0, STOPPING, worker_id="w1")], [])
    cluster.lead(1)
    assert cluster.assignment.tasks_of("w1").active == ()  # stopping: not what w1 runs
    beat(cluster, "w2")
    assert cluster.runs("Q")  # w1's task is still stopping
    beat(cluster, "w1")
    assert not cluster.runs("Q")
    beat(cluster, "w1", active=[0])
    cluster.remove("w1")  # a worker that left or died runs nothing
    assert not cluster.runs("Q")


def test_departed_workers_are_forgotten_after_the_retention() -> None:
    clock = Clock()
    cluster = Cluster(0.2, AssignorConfig(), clock=clock, wall_ms=lambda: int(clock.now * 1000), departed_retention_ms=1000)
    beat(cluster, "w1")
    beat(cluster, "w2")
    cluster.remove("w1")
    clock.now += 2
    cluster.remove("w2")
    assert [h.worker_id for h in host_statuses(cluster)] == ["w2"]


def test_status_rows_show_each_worker() -> None:
    clock = Clock()
    cluster = make(clock)
    beat(cluster, "w1", active=[0], standby=[1])
    beat(cluster, "w2", active=[1], standby=[0])
    cluster.lead(1)
    cluster.reassign([QueryTasks("Q", 2)])
    cluster.remove("w2")
    cluster.reassign([QueryTasks("Q", 2)])
    response = coordinator_pb2.GetClusterStatusResponse(coordinator_id="c1", leader=True, generation=cluster.generation,
                                                        hosts=host_statuses(cluster))
    outcome = status_outcome(response, now_ms=100_250, router_hosts=[
        router_pb2.RouterHostView(endpoint="w2:1", worker_id="w2", alive=False, last_beat_age_ms=900)])
    assert outcome.rows == [
        ["w1", "w1:1", True, "250 ms ago", "Q/0 Q/1", "-", "-", 5, "-", ""],
        ["w2", "w2:1", False, "250 ms ago", "-", "-", "-", 0, "-", "dead, silent 900 ms"],
    ]
    assert lag_outcome(response).rows == [["w1", "Q", 0, "active", 10, 10, 0, -1],
                                          ["w1", "Q", 1, "standby", 5, 10, 5, -1]]
    assert outcome.message == f"leader c1, generation {cluster.generation}"


def test_a_leader_just_started_keeps_tasks_where_reported_until_every_earlier_task_is_or_its_grace_ends() -> None:
    """A coordinator that has just started hears w1 first; w2 still runs tasks 2 and 3 under
    the previous leader. They are not given to w1 meanwhile (two workers would run them): w2's
    come back with its first beat, and the assignor runs as usual once every task of the
    queries there were at the election is reported, or after the grace (a worker that never
    comes back)."""
    clock = Clock()
    cluster = Cluster(0.2, AssignorConfig(num_standby_replicas=0), clock=clock, wall_ms=lambda: int(clock.now * 1000),
                      adopt_s=5.0)
    queries = [QueryTasks("Q", 4)]
    beat(cluster, "w1", active=[0, 1])
    cluster.lead(1)
    cluster.reassign(queries)
    assert cluster.assignment.workers["w1"].active == (Task("Q", 0), Task("Q", 1))
    assert cluster.assignment.active_of(Task("Q", 2)) is None  # not given to w1: w2 may run it
    clock.now += 1.0
    beat(cluster, "w2", active=[2, 3])
    cluster.reassign(queries)
    assert {w: t.active for w, t in cluster.assignment.workers.items()} == {
        "w1": (Task("Q", 0), Task("Q", 1)), "w2": (Task("Q", 2), Task("Q", 3))}
    # A query created after the election is assigned at once (every earlier task is reported).
    cluster.reassign([*queries, QueryTasks("R", 2)])
    assert cluster.assignment.active_of(Task("R", 0)) is not None

    # Another start: w2 never comes back; its tasks go to w1 once the grace is over.
    clock.now = 200.0
    other = Cluster(0.2, AssignorConfig(num_standby_replicas=0), clock=clock, wall_ms=lambda: int(clock.now * 1000),
                    adopt_s=5.0)
    beat(other, "w1", active=[0, 1])
    other.lead(2)
    other.reassign(queries)
    assert other.assignment.active_of(Task("Q", 3)) is None
    clock.now += 5.0
    beat(other, "w1", active=[0, 1])
    other.reassign(queries)
    assert other.assignment.workers["w1"].active == tuple(Task("Q", p) for p in range(4))


def test_a_second_process_with_a_members_id_is_refused_and_a_moved_worker_moves_the_generation() -> None:
    """Two processes beating with one worker id would both run its tasks: the second is refused
    while the member beats. A worker that restarted at another endpoint (its old one silent or
    its stream broken) is taken there, and the generation moves so routers learn it."""
    clock = Clock()
    cluster = make(clock)
    cluster.lead(1)
    beat(cluster, "w1", active=[0])
    cluster.reassign([QueryTasks("Q", 1)])
    before = cluster.generation
    with pytest.raises(AlreadyExistsError, match="worker id w1 is a member at w1:1, which beats; this worker at other:2"):
        cluster.beat("w1", "other:2", [], [])
    assert cluster.membership.members["w1"].endpoint == "w1:1" and cluster.generation == before
    cluster.membership.disconnected("w1")  # its process died: the stream broke
    assert cluster.beat("w1", "other:2", [], [])
    assert cluster.membership.members["w1"].endpoint == "other:2" and cluster.generation > before
