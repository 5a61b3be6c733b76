"""Task assignment as a pure function, in the manner of Kafka Streams' KIP-441 assignor.

A task is one input partition of one persistent query. ``assign`` maps tasks to the live
workers from plain data (members, tasks, the previous assignment, reported lags) and does no
I/O, so the same inputs always give the same output.

It works in two steps:

1. **Target.** Where each active should run: balanced (per worker, active counts differ by
   at most one in total and, for each query, by at most one per query), sticky (an active
   stays on its worker while it is a member) and lag-aware (among the moves balance needs,
   the cheapest are made: tasks that are not running yet, then destinations that are caught
   up, then moves already being warmed up, then the smallest lag).
2. **Hold-back.** A stateful active whose target lags more than ``acceptable_recovery_lag``
   stays on its current worker (or, if that worker is gone, goes to the member with the
   smallest lag, for availability) and the target gets a *warm-up* replica instead, at most
   ``max_warmup_replicas`` per call. Once the target reports a lag within the bound, a later
   call moves the active there; not while the active is *settling* (it moved lately, and its
   new worker may not have processed a batch of it yet: a failover's promoted standby is not
   interrupted by the balance's move, as Kafka Streams waits for its next probing rebalance).
   ``Assignment.pending`` lists the held-back tasks, so the actual assignment may be unbalanced
   while warm-ups run; the target never is.

Stateful tasks then get ``num_standby_replicas`` standbys each (fewer with too few workers),
never beside their active and never two on one worker, preferring the smallest lag, then the
previous holder, then the least-loaded worker. Stateless tasks get no standbys, no warm-ups,
and move freely.

Co-partitioning (partition p of different queries on one worker) is only a tie-breaker. It is
guaranteed from an empty start without lags when every query has the same partition count and
that count is a multiple of the number of members; otherwise balance wins.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from millpond.shared.errors import ErrorKind, MillpondError


@dataclass(frozen=True, order=True)
class Task:
    """One input partition of one persistent query."""

    query_id: str
    partition: int


@dataclass(frozen=True)
class QueryTasks:
    """The tasks of one persistent query: one per partition, numbered from 0."""

    query_id: str
    partitions: int
    """How many tasks the query has."""
    stateful: bool = True
    """Whether the tasks keep a changelog a standby can replay (then they get standbys and warm-ups)."""
    stateful_partitions: int | None = None
    """Of a stateful query, how many tasks keep a store (the result stage's partitions; an
    earlier stage of more partitions has tasks without one, which move freely); None: all."""

    def tasks(self) -> list[Task]:
        """The query's tasks in partition order."""
        return [Task(self.query_id, p) for p in range(self.partitions)]


Lags = Mapping[tuple[str, Task], int]
"""Offset lag of a worker's local store for a task; missing means no local state."""


@dataclass(frozen=True)
class AssignorConfig:
    """How many replicas to keep and how fast to move state."""

    num_standby_replicas: int = 1
    """Standby copies per stateful task, each on a worker other than the active's."""
    acceptable_recovery_lag: int = 10_000
    """A worker whose lag for a task is at most this is caught up and may take the active over."""
    max_warmup_replicas: int = 2
    """Warm-up replicas placed in one call, in total, to bound the restore traffic a rebalance causes."""

    def __post_init__(self) -> None:
        if self.num_standby_replicas < 0 or self.acceptable_recovery_lag < 0 or self.max_warmup_replicas < 1:
            raise MillpondError(
                f"invalid assignor config {self}: standby replicas and recovery lag must be >= 0 and "
                "max warm-up replicas >= 1 (with none, a stateful task could never move)", kind=ErrorKind.INVALID)


@dataclass(frozen=True)
class WorkerTasks:
    """What one worker runs, each kind sorted."""

    active: tuple[Task, ...] = ()
    standby: tuple[Task, ...] = ()
    warmup: tuple[Task, ...] = ()
    """Standbys placed to prepare moving the task's active to this worker."""


@dataclass(frozen=True)
class Assignment:
    """The output of ``assign``; treat the mappings as read-only."""

    workers: Mapping[str, WorkerTasks] = field(default_factory=dict)
    """Every member, sorted by id, including idle ones."""
    pending: Mapping[Task, str] = field(default_factory=dict)
    """Stateful tasks held back while their target catches up: task -> target worker."""

    @property
    def idle(self) -> tuple[str, ...]:
        """Members without an active task."""
        return tuple(w for w, t in self.workers.items() if not t.active)

    def tasks_of(self, worker: str) -> WorkerTasks:
        """What ``worker`` runs (nothing when it is not a member)."""
        return self.workers.get(worker, WorkerTasks())

    def active_of(self, task: Task) -> str | None:
        """The worker running ``task``'s active, or None when no worker does."""
        return self._active_index.get(task)

    def standbys_of(self, task: Task) -> list[str]:
        """The workers holding a standby of ``task`` (warm-ups excluded), sorted."""
        return [w for w, t in self.workers.items() if task in t.standby]

    def warmups_of(self, task: Task) -> list[str]:
        """The workers warming ``task`` up, sorted (at most one with this assignor)."""
        return [w for w, t in self.workers.items() if task in t.warmup]

    def target_of(self, task: Task) -> str | None:
        """Where ``task``'s active is meant to run once every warm-up has caught up."""
        target = self.pending.get(task)
        return target if target is not None else self.active_of(task)

    @cached_property
    def _active_index(self) -> dict[Task, str]:
        return {task: w for w, t in self.workers.items() for task in t.active}


@dataclass(frozen=True)
class _Inputs:
    """The facts every step consults, normalized once."""

    members: tuple[str, ...]
    stateful: frozenset[Task]
    lags: Lags
    config: AssignorConfig
    prev_owner: dict[Task, str]
    """Previous actives whose worker is still a member."""
    prev_pending: Mapping[Task, str]
    prev_plan: Counter[tuple[str, str]]
    """Per (worker, query), the live tasks the previous call targeted at the worker."""
    prev_replicas: dict[Task, set[str]]
    settling: frozenset[Task]
    """Stateful actives that moved lately: each stays on its live owner for now."""

    def lag(self, worker: str, task: Task) -> float:
        """The worker's lag for the task; 0 for stateless tasks, which restore nothing."""
        if task not in self.stateful:
            return 0
        return self.lags.get((worker, task), math.inf)

    def caught_up(self, worker: str, task: Task) -> bool:
        """Whether the worker could run the task's active now without a long restore."""
        return self.lag(worker, task) <= self.config.acceptable_recovery_lag


class _Board:
    """Target actives under construction, with the counts balancing needs."""

    def __init__(self) -> None:
        self.owner: dict[Task, str] = {}
        self.per_query: Counter[tuple[str, str]] = Counter()
        self.total: Counter[str] = Counter()
        self.by_partition: Counter[tuple[str, int]] = Counter()

    def put(self, task: Task, worker: str) -> None:
        """Place ``task`` on ``worker``, taking it off its current one."""
        old = self.owner.get(task)
        if old is not None:
            self._count(task, old, -1)
        self.owner[task] = worker
        self._count(task, worker, 1)

    def _count(self, task: Task, worker: str, delta: int) -> None:
        self.per_query[worker, task.query_id] += delta
        self.total[worker] += delta
        self.by_partition[worker, task.partition] += delta


def assign(
    members: Iterable[str],
    tasks: Iterable[QueryTasks],
    previous: Assignment | None = None,
    lags: Lags | None = None,
    config: AssignorConfig | None = None,
    settling: Collection[Task] = (),
) -> Assignment:
    """Assign every task's active, standbys and warm-ups to ``members``.

    ``previous`` makes the result sticky and ``lags`` (as reported by the workers; running
    actives report 0) decides where state can move without a long restore. A ``settling``
    active (one that moved lately) stays on its live owner, its target warmed up meanwhile.
    """
    queries = sorted(tasks, key=lambda q: q.query_id)
    if len({q.query_id for q in queries}) != len(queries) or any(q.partitions < 0 for q in queries):
        raise MillpondError("every query must appear once with a non-negative partition count", kind=ErrorKind.INVALID)
    inputs = _normalize(sorted(set(members)), queries, previous, lags or {}, config or AssignorConfig(), settling)
    if not inputs.members:
        return Assignment()
    board = _target(inputs, queries)
    actual, pending = _hold_back(board, inputs)
    standbys = _standbys(actual, inputs)
    warmups = _warmups(pending, standbys, inputs)
    return _build(inputs, actual, pending, standbys, warmups)


def _normalize(members: list[str], queries: list[QueryTasks], previous: Assignment | None, lags: Lags,
               config: AssignorConfig, settling: Collection[Task]) -> _Inputs:
    alive = set(members)
    current = {t for q in queries for t in q.tasks()}  # a dropped query's old tasks count for nothing
    prev = previous or Assignment()
    replicas: dict[Task, set[str]] = {}
    for worker, held in prev.workers.items():
        for task in (*held.standby, *held.warmup):
            replicas.setdefault(task, set()).add(worker)
    stateful = frozenset(t for q in queries if q.stateful for t in q.tasks()
                         if q.stateful_partitions is None or t.partition < q.stateful_partitions)
    return _Inputs(
        members=tuple(members),
        stateful=stateful,
        lags=lags,
        config=config,
        prev_owner={t: w for w, held in prev.workers.items() if w in alive for t in held.active if t in current},
        prev_pending=prev.pending,
        prev_plan=Counter((w, t.query_id) for t in current if (w := prev.target_of(t)) in alive),
        prev_replicas=replicas,
        settling=frozenset(settling) & stateful,
    )


def _target(inputs: _Inputs, queries: list[QueryTasks]) -> _Board:
    """Keep the live actives, fix balanced counts that keep the most, then fill them cheapest first."""
    board = _Board()
    for task, worker in sorted(inputs.prev_owner.items()):
        board.put(task, worker)
    quota = _quotas(inputs, queries, board)
    for query in queries:
        _fill(board, inputs, query, quota)
    return board


def _quotas(inputs: _Inputs, queries: list[QueryTasks], board: _Board) -> Counter[tuple[str, str]]:
    """Active counts per (worker, query), balanced per query and in total, moving the fewest actives.

    Each worker gets ``n // m`` tasks of a query of ``n``; the query's ``n % m`` extra tasks go
    to distinct workers, and each worker gets ``E // m`` or one more of all ``E`` extras. Which
    worker takes which extra is a min-cost flow (query -> worker -> sink) priced by ``_extra_cost``.
    """
    members, m = inputs.members, len(inputs.members)
    quota: Counter[tuple[str, str]] = Counter({(w, q.query_id): q.partitions // m for w in members for q in queries})
    extras = sum(q.partitions % m for q in queries)
    move = 2 * extras + 1  # one move outweighs all preferences
    source, sink, first_worker = 0, 1, 2 + len(queries)
    flow = _Flow(first_worker + m)
    edges: dict[int, tuple[str, str]] = {}
    for i, query in enumerate(queries, start=2):
        flow.add(source, i, query.partitions % m, 0)
        for j, worker in enumerate(members, start=first_worker):
            cost = _extra_cost(inputs, board, query, worker, quota[worker, query.query_id], move)
            edges[flow.add(i, j, 1, cost)] = (worker, query.query_id)
    for j in range(first_worker, first_worker + m):
        flow.add(j, sink, extras // m, -1 - extras * (move + 2))  # outweighs every cost: always filled
        flow.add(j, sink, 1, 0)
    flow.run(source, sink)
    for edge, key in edges.items():
        quota[key] += flow.edges[edge ^ 1][1]  # the reverse edge's capacity is the flow sent
    return quota


def _extra_cost(inputs: _Inputs, board: _Board, query: QueryTasks, worker: str, base: int, move: int) -> int:
    """The cost of giving ``worker`` one more task of ``query`` than ``base``.

    A move, unless the worker already runs more than ``base``; then, to choose among plans
    with as many moves, a small cost unless the worker could take a task over at once
    (caught up on more tasks than its base needs) or the previous plan gave it the extra too.
    """
    q = query.query_id
    follows_plan = inputs.prev_plan[worker, q] > base
    if board.per_query[worker, q] > base:
        return 0 if follows_plan else 1
    caught_up = sum(inputs.caught_up(worker, t) for t in query.tasks() if board.owner.get(t) != worker)
    return move + (0 if caught_up > base - board.per_query[worker, q] else 1 if follows_plan else 2)


class _Flow:
    """Min-cost max-flow by successive shortest paths (Bellman-Ford, as some costs are negative)."""

    def __init__(self, nodes: int) -> None:
        self.out: list[list[int]] = [[] for _ in range(nodes)]
        self.edges: list[list[int]] = []
        """[head, residual capacity, cost]; edge ``e ^ 1`` is the reverse of edge ``e``."""

    def add(self, tail: int, head: int, capacity: int, cost: int) -> int:
        """Add an edge and return its index."""
        for a, b, cap, c in ((tail, head, capacity, cost), (head, tail, 0, -cost)):
            self.out[a].append(len(self.edges))
            self.edges.append([b, cap, c])
        return len(self.edges) - 2

    def run(self, source: int, sink: int) -> None:
        """Send as much flow as possible, as cheaply as possible."""
        unreached = 1 << 62
        while True:
            dist = [unreached] * len(self.out)
            via = [-1] * len(self.out)
            dist[source] = 0
            changed = True
            while changed:
                changed = False
                for node, out in enumerate(self.out):
                    for e in out if dist[node] < unreached else ():
                        head, capacity, cost = self.edges[e]
                        if capacity > 0 and dist[node] + cost < dist[head]:
                            dist[head], via[head], changed = dist[node] + cost, e, True
            if dist[sink] == unreached:
                return
            node = sink
            while node != source:  # every path holds a capacity-1 edge: push one unit
                e = via[node]
                self.edges[e][1] -= 1
                self.edges[e ^ 1][1] += 1
                node = self.edges[e ^ 1][0]


def _fill(board: _Board, inputs: _Inputs, query: QueryTasks, quota: Counter[tuple[str, str]]) -> None:
    """Move the query's unplaced and surplus tasks to workers under quota, cheapest move first."""
    q = query.query_id
    while True:
        moves = [(_move_cost(board, inputs, t, dst), t, dst)
                 for t in query.tasks() if t not in board.owner or board.per_query[board.owner[t], q] > quota[board.owner[t], q]
                 for dst in inputs.members if board.per_query[dst, q] < quota[dst, q]]
        if not moves:
            return
        _, task, dst = min(moves)
        board.put(task, dst)


def _move_cost(board: _Board, inputs: _Inputs, task: Task, dst: str) -> tuple[object, ...]:
    """Order candidate moves, cheapest first (their number is already fixed)."""
    src = board.owner.get(task)
    p = task.partition
    lag, caught_up = inputs.lag(dst, task), inputs.caught_up(dst, task)
    return (
        src is not None,  # a running active moves last
        not caught_up, lag if caught_up else 0,  # a caught-up destination takes over without a restore
        inputs.prev_pending.get(task) != dst,  # else finish the move a warm-up is preparing
        lag,
        board.total[dst],  # spreads a fresh query round-robin
        (board.by_partition[src, p] - 1 if src is not None else 0) - board.by_partition[dst, p],  # co-partitioning
        task, dst,
    )


def _hold_back(board: _Board, inputs: _Inputs) -> tuple[dict[Task, str], dict[Task, str]]:
    """Actual actives and the held-back tasks (task -> target) for targets not caught up, and
    for settling actives whose owner is live."""
    actual: dict[Task, str] = {}
    pending: dict[Task, str] = {}
    for task, target in sorted(board.owner.items()):
        source = target
        if not inputs.caught_up(target, task) or (task in inputs.settling and task in inputs.prev_owner):
            # Keep a live owner; else promote the member that restores least (availability
            # first), ties going to the target and then to the least-loaded member.
            owner = inputs.prev_owner.get(task)
            source = owner if owner is not None else min(inputs.members, key=lambda w: (
                inputs.lag(w, task), w != target, board.total[w], w))
        actual[task] = source
        if source != target:
            pending[task] = target
    return actual, pending


def _standbys(actual: dict[Task, str], inputs: _Inputs) -> dict[Task, list[str]]:
    """Standby workers for each stateful task."""
    wanted = min(inputs.config.num_standby_replicas, len(inputs.members) - 1)
    load = Counter(actual.values())
    result: dict[Task, list[str]] = {}
    for task in sorted(actual):
        if task not in inputs.stateful or wanted <= 0:
            continue
        sticky = inputs.prev_replicas.get(task, set())
        ranked = sorted((w for w in inputs.members if w != actual[task]),
                        key=lambda w: (inputs.lag(w, task), w not in sticky, load[w], w))
        result[task] = sorted(ranked[:wanted])
        load.update(result[task])
    return result


def _warmups(pending: dict[Task, str], standbys: dict[Task, list[str]], inputs: _Inputs) -> dict[Task, str]:
    """Warm-ups for held-back tasks, closest to caught up first, within the budget."""
    result: dict[Task, str] = {}
    for task in sorted(pending, key=lambda t: (inputs.lag(pending[t], t), t)):
        if pending[task] in standbys.get(task, ()):
            continue  # a standby there already restores the state
        if len(result) == inputs.config.max_warmup_replicas:
            break
        result[task] = pending[task]
    return result


def _build(inputs: _Inputs, actual: dict[Task, str], pending: dict[Task, str], standbys: dict[Task, list[str]],
           warmups: dict[Task, str]) -> Assignment:
    def of(worker: str, pairs: Iterable[tuple[Task, str]]) -> tuple[Task, ...]:
        return tuple(sorted(t for t, w in pairs if w == worker))

    standby_pairs = [(t, w) for t, ws in standbys.items() for w in ws]
    workers = {w: WorkerTasks(of(w, actual.items()), of(w, standby_pairs), of(w, warmups.items())) for w in inputs.members}
    return Assignment(workers=workers, pending=dict(sorted(pending.items())))
