"""Properties and examples of the KIP-441-style assignor (pure, so every test is in-memory)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.services.coordinator.assignor import Assignment, AssignorConfig, QueryTasks, Task, assign
from millpond.shared.errors import MillpondError

FAST = settings(max_examples=60, deadline=None)

member_ids = st.lists(st.sampled_from([f"w{i}" for i in range(6)]), min_size=1, max_size=4, unique=True)
query_sets = st.lists(st.tuples(st.integers(0, 7), st.booleans()), min_size=1, max_size=3).map(
    lambda qs: [QueryTasks(f"q{i}", n, stateful) for i, (n, stateful) in enumerate(qs)])
configs = st.builds(AssignorConfig, num_standby_replicas=st.integers(0, 2), max_warmup_replicas=st.integers(1, 3))


def all_tasks(queries: list[QueryTasks]) -> list[Task]:
    return [t for q in queries for t in q.tasks()]


def stable(members: list[str], queries: list[QueryTasks], config: AssignorConfig) -> tuple[Assignment, dict[tuple[str, Task], int]]:
    """An assignment after its replicas caught up: actives and standbys report lag 0."""
    first = assign(members, queries, config=config)
    lags = caught_up_lags(first)
    return assign(members, queries, first, lags, config), lags


def caught_up_lags(a: Assignment) -> dict[tuple[str, Task], int]:
    return {(w, t): 0 for w, held in a.workers.items() for t in (*held.active, *held.standby, *held.warmup)}


def spread(counts: Counter[str], members: list[str]) -> int:
    return max(counts[w] for w in members) - min(counts[w] for w in members)


def assert_target_balanced(a: Assignment, queries: list[QueryTasks]) -> None:
    members = list(a.workers)
    targets = {t: a.target_of(t) for t in all_tasks(queries)}
    assert spread(Counter(targets.values()), members) <= 1
    for q in queries:
        assert spread(Counter(w for t, w in targets.items() if t.query_id == q.query_id), members) <= 1


def fewest_moves(members: list[str], queries: list[QueryTasks], owner: dict[Task, str | None]) -> int:
    """Brute force: the fewest actives any balanced target must move away from ``owner``."""
    m, best = len(members), math.inf
    held = Counter((owner[t], t.query_id) for t in all_tasks(queries))
    per_query = [[(q.query_id, q.partitions // m, set(extra)) for extra in itertools.combinations(members, q.partitions % m)]
                 for q in queries]
    for choice in itertools.product(*per_query):
        totals: Counter[str] = Counter()
        moves = 0
        for query_id, base, extra in choice:
            for w in members:
                wanted = base + (w in extra)
                totals[w] += wanted
                moves += max(0, wanted - held[w, query_id])
        if spread(totals, members) <= 1:
            best = min(best, moves)
    return int(best)


@FAST
@given(member_ids, query_sets, configs)
def test_every_task_has_exactly_one_active(members: list[str], queries: list[QueryTasks], config: AssignorConfig) -> None:
    a = assign(members, queries, config=config)
    assert list(a.workers) == sorted(members)
    actives = [t for held in a.workers.values() for t in held.active]
    assert sorted(actives) == sorted(all_tasks(queries))
    assert a.idle == tuple(w for w in sorted(members) if not a.tasks_of(w).active)
    assert assign([], queries) == Assignment()


@FAST
@given(member_ids, member_ids, query_sets, configs, st.data())
def test_target_is_balanced_whatever_the_history(before: list[str], after: list[str], queries: list[QueryTasks],
                                                 config: AssignorConfig, data: st.DataObject) -> None:
    previous = assign(before, queries, config=config)
    lags = data.draw(st.dictionaries(st.tuples(st.sampled_from(after), st.sampled_from(all_tasks(queries) or [Task("q0", 0)])),
                                     st.integers(0, 30_000), max_size=10))
    a = assign(after, queries, previous, lags, config)
    assert sorted(t for held in a.workers.values() for t in held.active) == sorted(all_tasks(queries))
    assert_target_balanced(a, queries)


@FAST
@given(member_ids, member_ids, query_sets, configs)
def test_replicas_never_share_a_worker(before: list[str], after: list[str], queries: list[QueryTasks],
                                       config: AssignorConfig) -> None:
    previous, _ = stable(before, queries, config)
    a = assign(after, queries, previous, caught_up_lags(previous), config)
    stateful = {q.query_id for q in queries if q.stateful}
    assert len(a.pending) <= len(all_tasks(queries))
    assert sum(len(held.warmup) for held in a.workers.values()) <= config.max_warmup_replicas
    for task in all_tasks(queries):
        replicas = [a.active_of(task), *a.standbys_of(task), *a.warmups_of(task)]
        assert len(replicas) == len(set(replicas))
        wanted = min(config.num_standby_replicas, len(after) - 1) if task.query_id in stateful else 0
        assert len(a.standbys_of(task)) == wanted
        if task.query_id not in stateful:
            assert not a.warmups_of(task) and task not in a.pending
        for w in a.warmups_of(task):
            assert a.pending[task] == w


@FAST
@given(member_ids, query_sets, configs)
def test_a_caught_up_assignment_is_a_fixed_point(members: list[str], queries: list[QueryTasks], config: AssignorConfig) -> None:
    a, lags = stable(members, queries, config)
    assert not a.pending
    assert assign(members, queries, a, lags, config) == a


@FAST
@given(member_ids, query_sets, configs)
def test_adding_a_member_moves_the_fewest_actives(members: list[str], queries: list[QueryTasks], config: AssignorConfig) -> None:
    a, lags = stable(members, queries, config)
    grown = [*members, "new"]
    b = assign(grown, queries, a, lags, config)
    moved = [t for t in all_tasks(queries) if b.target_of(t) != a.active_of(t)]
    assert len(moved) == fewest_moves(grown, queries, {t: a.active_of(t) for t in all_tasks(queries)})
    share = -(-len(all_tasks(queries)) // len(grown))
    assert len(moved) <= share + len(queries) - 1  # the new member's share, plus a swap per query at worst


@FAST
@given(member_ids.filter(lambda ms: len(ms) > 1), query_sets, configs, st.data())
def test_removing_a_member_moves_the_fewest_actives(members: list[str], queries: list[QueryTasks], config: AssignorConfig,
                                                    data: st.DataObject) -> None:
    a, lags = stable(members, queries, config)
    gone = data.draw(st.sampled_from(members))
    left = [w for w in members if w != gone]
    b = assign(left, queries, a, lags, config)
    owner = {t: a.active_of(t) for t in all_tasks(queries)}
    orphans = [t for t, w in owner.items() if w == gone]
    moved = [t for t, w in owner.items() if w != gone and b.target_of(t) != w]
    assert len(orphans) + len(moved) == fewest_moves(left, queries, {t: None if w == gone else w for t, w in owner.items()})
    assert all(b.active_of(t) in left for t in orphans)


@FAST
@given(member_ids, query_sets, configs)
def test_a_new_member_warms_up_before_it_takes_actives_over(members: list[str], queries: list[QueryTasks],
                                                            config: AssignorConfig) -> None:
    a, lags = stable(members, queries, config)
    stateful = {q.query_id for q in queries if q.stateful}
    grown = [*members, "new"]
    b = assign(grown, queries, a, lags, config)
    for task in all_tasks(queries):
        if task.query_id in stateful:
            assert b.active_of(task) != "new"  # it has no state while the old owners live
            if b.active_of(task) != a.active_of(task):
                assert lags[b.active_of(task) or "", task] <= config.acceptable_recovery_lag  # onto a caught-up standby
        else:
            assert task not in b.pending
    for _ in range(len(all_tasks(queries)) + 1):
        if not b.pending:
            break
        # (A pending move may be between two old members, when the new one's share is of
        # stateless tasks: its target warms up all the same.)
        warmed = {t for t, target in b.pending.items() if target in (*b.warmups_of(t), *b.standbys_of(t))}
        assert warmed, "every call prepares at least one pending move"
        lags = {**lags, **caught_up_lags(b)}  # the warm-ups report they caught up
        c = assign(grown, queries, b, lags, config)
        assert {t: c.target_of(t) for t in all_tasks(queries)} == {t: b.target_of(t) for t in all_tasks(queries)}
        assert all(c.active_of(t) == b.pending[t] for t in warmed)
        b = c
    assert not b.pending
    assert_target_balanced(b, queries)


@FAST
@given(member_ids.filter(lambda ms: len(ms) > 2), query_sets, st.data())
def test_a_failed_active_goes_to_the_most_caught_up_survivor(members: list[str], queries: list[QueryTasks],
                                                             data: st.DataObject) -> None:
    config = AssignorConfig(num_standby_replicas=2, acceptable_recovery_lag=100)
    a, lags = stable(members, queries, config)
    lags = {key: data.draw(st.integers(0, 300)) if a.active_of(key[1]) != key[0] else 0 for key in lags}
    gone = data.draw(st.sampled_from(members))
    b = assign([w for w in members if w != gone], queries, a, lags, config)
    for task in all_tasks(queries):
        if a.active_of(task) != gone or not any(q.stateful for q in queries if q.query_id == task.query_id):
            continue
        survivors = [lags.get((w, task), math.inf) for w in b.workers]
        promoted = lags.get((b.active_of(task) or "", task), math.inf)
        # Any caught-up worker may take over (KIP-441); with none, the smallest lag wins.
        assert promoted <= config.acceptable_recovery_lag if min(survivors) <= 100 else promoted == min(survivors)


@FAST
@given(member_ids, query_sets, configs)
def test_same_inputs_same_output(members: list[str], queries: list[QueryTasks], config: AssignorConfig) -> None:
    a, lags = stable(members, queries, config)
    grown = [*members, "new"]
    once = assign(grown, queries, a, lags, config)
    assert once == assign(grown, queries, a, lags, config)
    assert once == assign(grown[::-1], queries[::-1], a, dict(reversed(lags.items())), config)  # order is irrelevant


def test_kip441_example_moves_after_the_warm_up() -> None:
    queries = [QueryTasks("Q", 4)]
    config = AssignorConfig(num_standby_replicas=0, max_warmup_replicas=1)
    a, lags = stable(["a", "b"], queries, config)
    assert {w: len(h.active) for w, h in a.workers.items()} == {"a": 2, "b": 2}
    b = assign(["a", "b", "c"], queries, a, lags, config)
    assert b.tasks_of("c").active == () and len(b.tasks_of("c").warmup) == 1 and b.idle == ("c",)
    (warm,) = b.tasks_of("c").warmup
    assert b.pending == {warm: "c"} and b.target_of(warm) == "c"
    # Still behind: nothing moves. Caught up: the active moves and the warm-up is done.
    assert assign(["a", "b", "c"], queries, b, {**lags, ("c", warm): 50_000}, config) == b
    c = assign(["a", "b", "c"], queries, b, {**lags, ("c", warm): 9_000}, config)
    assert c.active_of(warm) == "c" and not c.pending and c.tasks_of("c").warmup == ()


def test_a_settling_active_stays_until_it_settled_and_a_dead_owner_still_fails_over() -> None:
    queries = [QueryTasks("Q", 4)]
    config = AssignorConfig(num_standby_replicas=0, max_warmup_replicas=1)
    a, lags = stable(["a", "b"], queries, config)
    b = assign(["a", "b", "c"], queries, a, lags, config)
    (warm,) = b.tasks_of("c").warmup
    caught_up = {**lags, ("c", warm): 0}
    # The warm-up caught up, but the active moved lately: it stays, the warm-up goes on.
    assert assign(["a", "b", "c"], queries, b, caught_up, config, settling=[warm]) == b
    assert assign(["a", "b", "c"], queries, b, caught_up, config).active_of(warm) == "c"  # settled: it moves
    # A settling active whose owner is gone goes to the caught-up target at once.
    owner = b.active_of(warm)
    assert owner is not None
    survivors = [w for w in ("a", "b", "c") if w != owner]
    assert assign(survivors, queries, b, caught_up, config, settling=[warm]).active_of(warm) == "c"


@FAST
@given(member_ids, query_sets, configs, st.data())
def test_settling_moves_no_live_active_and_keeps_the_target(members: list[str], queries: list[QueryTasks],
                                                          config: AssignorConfig, data: st.DataObject) -> None:
    a, lags = stable(members, queries, config)
    grown = [*members, "new"]
    b = assign(grown, queries, a, lags, config)
    lags = {**lags, **caught_up_lags(b)}  # every warm-up caught up
    settling = data.draw(st.sets(st.sampled_from(all_tasks(queries)))) if all_tasks(queries) else set()
    c = assign(grown, queries, b, lags, config, settling=settling)
    stateful = {t for q in queries if q.stateful for t in q.tasks()}
    for task in all_tasks(queries):
        assert c.target_of(task) == assign(grown, queries, b, lags, config).target_of(task)
        if task in settling and task in stateful:
            assert c.active_of(task) == b.active_of(task)


def test_promotion_prefers_the_standby_with_the_smallest_lag() -> None:
    q = QueryTasks("Q", 1)
    task = Task("Q", 0)
    config = AssignorConfig(num_standby_replicas=2)
    a = assign(["a", "b", "c"], [q], config=config)
    owner = a.active_of(task)
    assert owner is not None and len(a.standbys_of(task)) == 2
    near, far = a.standbys_of(task)
    b = assign([near, far], [q], a, {(near, task): 50_000, (far, task): 80_000}, config)
    assert b.active_of(task) == near and not b.pending  # not caught up, yet the best there is
    assert b.standbys_of(task) == [far]


def test_stateless_tasks_move_at_once_and_have_no_replicas() -> None:
    queries = [QueryTasks("S", 4, stateful=False)]
    a = assign(["a", "b"], queries)
    b = assign(["a", "b", "c"], queries, a)
    assert len(b.tasks_of("c").active) == 1 and not b.pending
    assert all(not h.standby and not h.warmup for h in b.workers.values())


def test_standbys_stay_where_they_were() -> None:
    queries = [QueryTasks("Q", 6)]
    a = assign(["a", "b", "c", "d"], queries)
    b = assign(["a", "b", "c", "d", "e"], queries, a)
    for task in all_tasks(queries):
        if b.active_of(task) == a.active_of(task):
            assert b.standbys_of(task) == a.standbys_of(task)


def test_partition_p_of_every_query_shares_a_worker_from_scratch() -> None:
    a = assign(["b", "a", "c"], [QueryTasks("Q1", 6), QueryTasks("Q2", 6, stateful=False), QueryTasks("Q3", 6)])
    for held in a.workers.values():
        by_query = {q: {t.partition for t in held.active if t.query_id == q} for q in ("Q1", "Q2", "Q3")}
        assert by_query["Q1"] == by_query["Q2"] == by_query["Q3"] and len(by_query["Q1"]) == 2


def test_bad_input_is_refused() -> None:
    with pytest.raises(MillpondError):
        AssignorConfig(max_warmup_replicas=0)
    with pytest.raises(MillpondError):
        assign(["a"], [QueryTasks("Q", 1), QueryTasks("Q", 2)])



def test_tasks_beyond_the_stateful_partitions_move_freely_and_get_no_replicas() -> None:
    # A foreign-key join whose right table has 6 partitions and its left (the result) 4: tasks
    # 4 and 5 keep no store anywhere, so no copy of them can ever catch up.
    queries = [QueryTasks("fk", 6, stateful=True, stateful_partitions=4)]
    first = assign(["w1"], queries)
    lags = caught_up_lags(first)
    grown = assign(["w1", "w2"], queries, first, lags)
    assert not grown.pending or all(task.partition < 4 for task in grown.pending)
    settled = assign(["w1", "w2"], queries, grown, {**lags, **caught_up_lags(grown)})
    assert not settled.pending and sorted(len(t.active) for t in settled.workers.values()) == [3, 3]
    for worker in settled.workers.values():
        assert all(task.partition < 4 for task in (*worker.standby, *worker.warmup))
