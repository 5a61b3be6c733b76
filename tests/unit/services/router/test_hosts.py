"""The router's failure detector, lag table and pull-query filters, with the reasons it gives."""

from __future__ import annotations

from millpond.services.router.hosts import FORGET_AFTER_S, HostTable, PullBounds
from millpond.services.router.pull import Replica
from millpond.shared.task_status import StoreLag

ACTIVE, NEAR, FAR, SILENT = Replica("a:1", False), Replica("b:1", True), Replica("c:1", True), Replica("d:1", True)
OPEN = PullBounds(standby_reads=True)


class Clock:
    def __init__(self) -> None:
        self.now = 10.0
        self.wall_ms = 1_000_000

    def __call__(self) -> float:
        return self.now

    def wall(self) -> int:
        return self.wall_ms


def table(clock: Clock) -> HostTable:
    hosts = HostTable(0.5, clock, clock.wall)
    hosts.beat("a:1", "a", [StoreLag("Q", 0, True, 50, 50, clock.wall_ms - 5_000, input_offset=70)])
    hosts.beat("b:1", "b", [StoreLag("Q", 0, False, 40, 50, clock.wall_ms - 300, input_offset=60)])
    hosts.beat("c:1", "c", [StoreLag("Q", 0, False, 10, 50, clock.wall_ms - 2_000, input_offset=20)])
    return hosts


def test_active_first_then_standbys_by_lag_unknown_last() -> None:
    hosts = table(Clock())
    assert hosts.lag("b:1", "Q", 0) == 10 and hosts.lag("b:1", "Q", 1) is None and hosts.lag("x:1", "Q", 0) is None
    # d never beat: unknown, not dead; asked after the standbys whose lag is known
    assert hosts.choose("Q", 0, [SILENT, FAR, NEAR, ACTIVE], OPEN) == ([ACTIVE, NEAR, FAR, SILENT], [])


def test_dead_hosts_are_excluded_with_how_long_they_were_silent() -> None:
    clock = Clock()
    hosts = table(clock)
    clock.now += 0.4
    hosts.beat("b:1", "b", [StoreLag("Q", 0, False, 40, 50)])
    hosts.beat("c:1", "c", [StoreLag("Q", 0, False, 10, 50)])
    clock.now += 0.2  # the active has been silent for 0.6 s
    assert hosts.dead("a:1") and not hosts.dead("b:1") and not hosts.dead("d:1")
    chosen, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR, FAR, SILENT], OPEN)
    assert chosen == [NEAR, FAR, SILENT]
    assert excluded == ["a:1 (active): dead: no heartbeat for 0.60 s"]


def test_standby_reads_off_leaves_only_the_active() -> None:
    hosts = table(Clock())
    chosen, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR, FAR], PullBounds(standby_reads=False))
    assert chosen == [ACTIVE]
    assert excluded == [f"{r.endpoint} (standby): standby, and standby reads are off "
                        "(ksql.query.pull.enable.standby.reads)" for r in (NEAR, FAR)]


def test_lag_bound_names_the_lag_and_the_bound() -> None:
    hosts = table(Clock())
    chosen, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR, FAR], PullBounds(True, max_offset_lag=10))
    assert chosen == [ACTIVE, NEAR]
    assert excluded == ["c:1 (standby): lag 40 over the bound of 10 (max allowed offset lag)"]


def test_staleness_is_zero_for_a_caught_up_copy_and_time_since_last_apply_for_a_lagging_one() -> None:
    clock = Clock()
    hosts = table(clock)
    clock.now += 0.1  # reports are 100 ms old
    # the active is caught up (lag 0) although it applied nothing for 5 s: staleness = report age
    chosen, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR, FAR], PullBounds(True, max_staleness_ms=1_000))
    assert chosen == [ACTIVE, NEAR]
    assert excluded == ["c:1 (standby): staleness 2000 ms over the bound of 1000 ms"]
    _, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR], PullBounds(True, max_staleness_ms=99))
    assert excluded == ["b:1 (standby): staleness 300 ms over the bound of 99 ms"]


def test_a_copy_behind_the_consistency_token_is_excluded() -> None:
    hosts = table(Clock())
    chosen, excluded = hosts.choose("Q", 0, [ACTIVE, NEAR, FAR, SILENT], OPEN, min_input_offset=60)
    assert chosen == [ACTIVE, NEAR, SILENT]  # the silent host is asked; the worker checks itself
    assert excluded == ["c:1 (standby): at input offset 20, the consistency token needs 60"]


def test_a_position_a_copy_answered_at_counts_until_its_next_report() -> None:
    """The reports trail the commits: a copy that answered a pull at a newer position than it
    reported qualifies for a token up to it; its next report replaces what it answered."""
    clock = Clock()
    hosts = table(clock)
    assert hosts.choose("Q", 0, [NEAR], OPEN, min_input_offset=65)[0] == []  # b reported 60
    hosts.answered("b:1", "Q", 0, 66)
    hosts.answered("b:1", "Q", 0, 64)  # an older answer that came late changes nothing
    hosts.answered("x:1", "Q", 0, 99)  # nor one from a worker never heard from
    assert hosts.choose("Q", 0, [NEAR], OPEN, min_input_offset=66) == ([NEAR], [])
    assert hosts.choose("Q", 0, [NEAR], OPEN, min_input_offset=67)[0] == []
    assert hosts.choose("Q", 1, [NEAR], OPEN, min_input_offset=66) == ([NEAR], [])  # no report: asked
    hosts.beat("b:1", "b", [StoreLag("Q", 0, False, 40, 50, clock.wall_ms, input_offset=61)])
    chosen, excluded = hosts.choose("Q", 0, [NEAR], OPEN, min_input_offset=66)
    assert chosen == [] and excluded == ["b:1 (standby): at input offset 61, the consistency token needs 66"]


def test_a_worker_silent_for_ten_minutes_is_forgotten_at_a_later_beat() -> None:
    """Workers gone for good (or beating from another endpoint now) left the table growing."""
    clock = Clock()
    hosts = table(clock)
    clock.now += FORGET_AFTER_S / 2
    hosts.beat("a:1", "a", [])
    assert set(hosts.hosts) == {"a:1", "b:1", "c:1"}  # silent, but not that long: still known (dead)
    clock.now += FORGET_AFTER_S / 2 + 1
    hosts.beat("a:1", "a", [])
    assert set(hosts.hosts) == {"a:1"}
