"""The router's failure detector and lag table, and the order it asks replicas in."""

from __future__ import annotations

from services.router.hosts import HostTable
from services.router.pull import Replica
from shared.task_status import StoreLag


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_active_first_then_standbys_by_lag_and_dead_hosts_last() -> None:
    clock = Clock()
    hosts = HostTable(0.5, clock)
    active, near, far, silent = (Replica("a:1", False), Replica("b:1", True), Replica("c:1", True),
                                 Replica("d:1", True))
    hosts.beat("a:1", "a", [StoreLag("Q", 0, True, 50, 50)])
    hosts.beat("b:1", "b", [StoreLag("Q", 0, False, 40, 50)])
    hosts.beat("c:1", "c", [StoreLag("Q", 0, False, 10, 50)])
    assert hosts.lag("b:1", "Q", 0) == 10 and hosts.lag("b:1", "Q", 1) is None and hosts.lag("x:1", "Q", 0) is None
    # d never beat: unknown, asked after the standbys whose lag is known
    assert hosts.order("Q", 0, [silent, far, near, active]) == [active, near, far, silent]

    clock.now += 0.4
    hosts.beat("b:1", "b", [StoreLag("Q", 0, False, 40, 50)])
    hosts.beat("c:1", "c", [StoreLag("Q", 0, False, 10, 50)])
    clock.now += 0.2  # the active has been silent for 0.6 s
    assert hosts.dead("a:1") and not hosts.dead("b:1") and not hosts.dead("d:1")
    assert hosts.order("Q", 0, [active, near, far, silent]) == [near, far, silent, active]
