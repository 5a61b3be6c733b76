"""The coordinator's view of its workers: who is a member, what each reports, and the
assignment the leader gives them.

No I/O: heartbeats, leaves and failure verdicts come in as calls, time from injected
clocks. Only the leading coordinator assigns; its generations are ``epoch << 32 | n``,
where the epoch grows with every new leader, so a worker that took an assignment from a
newer leader ignores an older one (two coordinators that both believe they lead cannot
both steer a worker). The protobuf forms are in ``converters``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from millpond.services.coordinator.assignor import Assignment, AssignorConfig, QueryTasks, Task, WorkerTasks, assign
from millpond.services.coordinator.membership import Membership
from millpond.shared.errors import AlreadyExistsError
from millpond.shared.task_status import STOPPING, StoreLag, TaskReport, now_ms

EPOCH_SHIFT = 32


@dataclass
class WorkerView:
    """What a worker said in its last heartbeat."""

    endpoint: str
    last_seen_ms: int
    """Wall-clock time of the last heartbeat (for cluster status)."""
    reports: list[TaskReport] = field(default_factory=list)
    lags: list[StoreLag] = field(default_factory=list)
    left_ms: int = 0
    """When it left or was declared dead; 0 while alive."""

    @property
    def alive(self) -> bool:
        """Whether it is a member."""
        return not self.left_ms


class Cluster:
    """Membership, reports and the assignment, as one coordinator sees them."""

    def __init__(self, session_timeout: float, config: AssignorConfig,
                 clock: Callable[[], float] = time.monotonic, wall_ms: Callable[[], int] = now_ms,
                 departed_retention_ms: int = 600_000, settle_s: float = 0.0, adopt_s: float = 0.0):
        self.membership = Membership(session_timeout, clock)
        self.config = config
        self.clock = clock
        self.settle_s = settle_s
        """How long an active that moved stays on its new worker before the balance may move it
        again (the assignor's ``settling``)."""
        self._moved_at: dict[Task, float] = {}
        """When each task's active last moved to another worker (within ``settle_s``)."""
        self.wall_ms = wall_ms
        self.departed_retention_ms = departed_retention_ms
        self.views: dict[str, WorkerView] = {}
        self.assignment = Assignment()
        self.epoch = 0
        """The leader epoch while this coordinator leads; 0 while it follows."""
        self._changes = 0
        self._adopt_until = clock() + adopt_s
        """Until when a leader keeps tasks where the workers report them rather than assign
        the ones nobody reports (``reassign``): a coordinator that has just started has not heard
        from every worker yet, and one that has not reconnected still runs its tasks."""
        self._elected_queries: set[str] | None = None
        """The queries there were when this coordinator took the lead (None: not looked yet)."""

    @property
    def leading(self) -> bool:
        """Whether this coordinator assigns tasks."""
        return self.epoch > 0

    @property
    def generation(self) -> int:
        """The assignment's generation; 0 while following."""
        return (self.epoch << EPOCH_SHIFT) | self._changes if self.leading else 0

    def beat(self, worker_id: str, endpoint: str, reports: list[TaskReport], lags: list[StoreLag]) -> bool:
        """A heartbeat; True when it makes a new member (or moves one to a new endpoint: the
        generation moves, so routers learn where it is). AlreadyExistsError for a beat from
        another endpoint than a member's that is still beating: two processes with one worker id
        would both run its tasks."""
        known = self.membership.members.get(worker_id)
        if known is not None and known.endpoint != endpoint and not known.disconnected \
                and self.clock() - known.last_beat <= self.membership.session_timeout:
            raise AlreadyExistsError(f"worker id {worker_id} is a member at {known.endpoint}, which beats; this worker "
                                     f"at {endpoint} has the same worker_id: give each worker its own "
                                     "(MILLPOND_WORKER_ID)")
        self.views[worker_id] = WorkerView(endpoint, self.wall_ms(), reports, lags)
        changed = self.membership.beat(worker_id, endpoint)
        if changed and known is not None and self.leading:
            self._changes += 1
        return changed

    def remove(self, worker_id: str) -> bool:
        """The worker left or is dead; True if it was a member."""
        view = self.views.get(worker_id)
        if view is not None and view.alive:
            view.left_ms, view.reports, view.lags = self.wall_ms(), [], []
        removed = self.membership.remove(worker_id)
        cutoff = self.wall_ms() - self.departed_retention_ms
        for gone in [w for w, v in self.views.items() if not v.alive and v.left_ms < cutoff]:
            del self.views[gone]
        return removed

    def lead(self, epoch: int) -> None:
        """Start leading at ``epoch``: the previous assignment is what the workers report
        running, so the first assignment keeps tasks where they are."""
        self.epoch, self._changes = epoch, 0
        self.assignment = self.observed()
        self._elected_queries = None

    def follow(self) -> None:
        """Stop assigning (another coordinator leads)."""
        self.epoch, self._changes = 0, 0
        self.assignment = Assignment()

    def observed(self) -> Assignment:
        """The assignment the live workers report they run (actives from task reports,
        standbys from the lags of their non-active stores)."""
        workers = {}
        for worker_id in sorted(self.membership.members):
            view = self.views.get(worker_id)
            if view is None:
                continue
            active = tuple(sorted({Task(r.query_id, r.partition) for r in view.reports if r.state != STOPPING}))
            standby = tuple(sorted({Task(lag.query_id, lag.partition) for lag in view.lags if not lag.active}))
            workers[worker_id] = WorkerTasks(active, standby)
        return Assignment(workers=workers)

    def lags(self) -> dict[tuple[str, Task], int]:
        """Each member's reported lag per task it holds a store of (the assignor's input)."""
        return {(w, Task(lag.query_id, lag.partition)): lag.lag
                for w, view in self.views.items() if w in self.membership.members for lag in view.lags}

    def reassign(self, queries: list[QueryTasks]) -> bool:
        """Recompute the assignment (leader only); True when it changed."""
        if not self.leading:
            return False
        now = self.clock()
        if self._elected_queries is None:
            self._elected_queries = {q.query_id for q in queries}
        self._moved_at = {t: at for t, at in self._moved_at.items() if now - at < self.settle_s}
        if now < self._adopt_until and self._unreported(queries):
            # Just started: a task of a query from before that no member reports may run on a
            # worker not reconnected yet; assigned elsewhere now, two workers would run it.
            new = self.observed()
        else:
            self._adopt_until = 0.0
            new = assign(self.membership.members, queries, self.assignment, self.lags(), self.config, self._moved_at)
        if new == self.assignment:
            return False
        for worker, held in new.workers.items():
            self._moved_at.update((t, now) for t in held.active if self.assignment.active_of(t) not in (None, worker))
        self.assignment = new
        self._changes += 1
        return True

    def _unreported(self, queries: list[QueryTasks]) -> bool:
        """Whether a task of a query there was at the election has no member reporting it active."""
        observed = self.observed()
        return any(observed.active_of(task) is None for q in queries
                   if self._elected_queries is not None and q.query_id in self._elected_queries for task in q.tasks())

    def runs(self, query_id: str) -> bool:
        """Whether a live worker reports a task (running or still stopping) or a store copy of the query."""
        return any(any(r.query_id == query_id for r in view.reports) or any(lag.query_id == query_id for lag in view.lags)
                   for worker_id, view in self.views.items() if worker_id in self.membership.members)

    def task_reports(self) -> dict[str, list[TaskReport]]:
        """The live workers' reports of the actives they are assigned, by query id."""
        out: dict[str, list[TaskReport]] = defaultdict(list)
        for worker_id, view in self.views.items():
            active = set(self.assignment.tasks_of(worker_id).active)
            for report in view.reports:
                if Task(report.query_id, report.partition) in active:
                    out[report.query_id].append(report)
        return out
