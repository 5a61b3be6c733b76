"""The router's own view of the workers, from their heartbeats: who is alive and how far
each table copy is behind (ksqlDB's HeartbeatAgent and LagReportingAgent, receiving side).

Pure: beats come in as calls, time from an injected clock. A worker the router has never
heard from is *unknown*, not dead, so routing still works when workers do not report here
(for example a router started by hand without the workers knowing it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from millpond.services.router.pull import Replica
from millpond.shared.task_status import StoreLag, now_ms


@dataclass(frozen=True)
class PullBounds:
    """What a pull query accepts from a table copy (per request, with the router's defaults)."""

    standby_reads: bool
    """Whether a standby copy may answer (ksqlDB's ksql.query.pull.enable.standby.reads)."""
    max_offset_lag: int | None = None
    """Most changelog records the copy may be behind (ksql.query.pull.max.allowed.offset.lag)."""
    max_staleness_ms: int | None = None
    """Oldest the newest change the copy may be missing can be, in milliseconds."""


@dataclass
class HostView:
    """What one worker said last."""

    worker_id: str
    last_beat: float
    lags: dict[tuple[str, int], StoreLag] = field(default_factory=dict)
    answered: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (query, partition), the newest input position a copy here answered a pull at
    since the report (which trails the commits by up to a heartbeat); the next report
    replaces it."""
    disconnected: bool = False
    """Its beat stream broke since this report: dead until its next beat."""


FORGET_AFTER_S = 600.0
"""How long a silent worker stays in the host table (its copies long since assigned elsewhere)."""


class HostTable:
    """Heartbeats and lags per worker endpoint."""

    def __init__(self, dead_after: float, clock: Callable[[], float] = time.monotonic,
                 wall_clock_ms: Callable[[], int] = now_ms):
        self.dead_after = dead_after
        """Seconds without a beat after which a worker counts as dead."""
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        """Milliseconds since the epoch, to compare with the reports' last-applied times."""
        self.hosts: dict[str, HostView] = {}
        self._pruned_at = clock()

    def beat(self, endpoint: str, worker_id: str, lags: list[StoreLag]) -> None:
        """A worker's heartbeat and lag report; workers silent for ``FORGET_AFTER_S`` are
        forgotten (gone for good, or beating from another endpoint: the table only grew)."""
        now = self.clock()
        self.hosts[endpoint] = HostView(worker_id, now, {(lag.query_id, lag.partition): lag for lag in lags})
        if now - self._pruned_at >= FORGET_AFTER_S / 10:
            self._pruned_at = now
            for gone in [e for e, view in self.hosts.items() if now - view.last_beat > FORGET_AFTER_S]:
                del self.hosts[gone]

    def disconnected(self, endpoint: str) -> None:
        """The worker's beat stream broke: its process died (the kernel closed its connection)
        or the connection did. Dead until it beats again, not after ``dead_after``."""
        view = self.hosts.get(endpoint)
        if view is not None:
            view.disconnected = True

    def answered(self, endpoint: str, query_id: str, partition: int, input_offset: int) -> None:
        """The worker's copy of the partition answered a pull at ``input_offset``: until its
        next report, ``choose`` knows the copy is at least there (a session's next pull, whose
        token is that answer's, then needs no wait)."""
        view = self.hosts.get(endpoint)
        if view is not None and input_offset > view.answered.get((query_id, partition), -1):
            view.answered[(query_id, partition)] = input_offset

    def reached(self, endpoint: str, query_id: str, partition: int, input_offset: int) -> bool:
        """Whether the worker's copy of the partition is known to have processed its input up
        to ``input_offset``: by its last report, or by an answer since."""
        view = self.hosts.get(endpoint)
        if view is None:
            return False
        report = view.lags.get((query_id, partition))
        return ((report is not None and report.input_offset >= input_offset)
                or view.answered.get((query_id, partition), -1) >= input_offset)

    def dead(self, endpoint: str) -> bool:
        """True when the worker stopped beating; False while alive or never heard from."""
        view = self.hosts.get(endpoint)
        return view is not None and (view.disconnected or self.clock() - view.last_beat > self.dead_after)

    def lag(self, endpoint: str, query_id: str, partition: int) -> int | None:
        """The reported lag of the worker's copy of the partition, or None when unknown."""
        view = self.hosts.get(endpoint)
        report = view.lags.get((query_id, partition)) if view is not None else None
        return report.lag if report is not None else None

    def choose(self, query_id: str, partition: int, replicas: list[Replica], bounds: PullBounds,
               min_input_offset: int = 0) -> tuple[list[Replica], list[str]]:
        """The replicas that pass every filter of ``bounds``, best first (the active, then
        standbys by smallest reported lag, unknown lags last), and why each other one was
        excluded. A host the router has not heard from is not excluded for lag, staleness or
        position: it is asked, and the worker itself refuses a copy behind the token."""
        now = self.clock()
        wall_ms = self.wall_clock_ms()
        chosen: list[Replica] = []
        excluded: list[str] = []
        for replica in replicas:
            view = self.hosts.get(replica.endpoint)
            report = view.lags.get((query_id, partition)) if view is not None else None
            reason = None
            if replica.standby and not bounds.standby_reads:
                reason = "standby, and standby reads are off (ksql.query.pull.enable.standby.reads)"
            elif view is not None and view.disconnected:
                reason = "dead: its heartbeat stream broke"
            elif view is not None and now - view.last_beat > self.dead_after:
                reason = f"dead: no heartbeat for {now - view.last_beat:.2f} s"
            elif report is not None and bounds.max_offset_lag is not None and report.lag > bounds.max_offset_lag:
                reason = f"lag {report.lag} over the bound of {bounds.max_offset_lag} (max allowed offset lag)"
            elif report is not None and view is not None and bounds.max_staleness_ms is not None:
                staleness = _staleness_ms(report, int((now - view.last_beat) * 1000), wall_ms)
                if staleness > bounds.max_staleness_ms:
                    reason = f"staleness {staleness} ms over the bound of {bounds.max_staleness_ms} ms"
            if reason is None and report is not None and report.input_offset >= 0 \
                    and not self.reached(replica.endpoint, query_id, partition, min_input_offset):
                reason = (f"at input offset {report.input_offset}, the consistency token needs {min_input_offset}")
            if reason is None:
                chosen.append(replica)
            else:
                excluded.append(f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {reason}")

        if len(chosen) < 2:
            return chosen, excluded  # (a key lookup's usual case: the active alone)

        def rank(r: Replica) -> tuple[bool, float]:
            lag = self.lag(r.endpoint, query_id, partition)
            return r.standby, float("inf") if lag is None else lag

        return sorted(chosen, key=rank), excluded


def _staleness_ms(report: StoreLag, report_age_ms: int, now_ms: int) -> int:
    """How old the newest change the copy may be missing can be: a copy that was caught up
    at its last report misses at most what came since that report; one that lagged misses
    everything since the last record it applied."""
    if report.lag == 0:
        return report_age_ms
    return max(now_ms - report.last_applied_ms, report_age_ms)
