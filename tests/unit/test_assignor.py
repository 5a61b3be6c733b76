from hypothesis import given
from hypothesis import strategies as st

from services.coordinator.assignor import assign


@given(st.sets(st.text(min_size=1, max_size=5), max_size=6),
       st.dictionaries(st.text(min_size=1, max_size=5), st.integers(1, 12), max_size=4))
def test_every_task_once_and_balanced(workers: set[str], queries: dict[str, int]) -> None:
    result = assign(workers, queries)
    assert set(result) == workers
    tasks = [t for ts in result.values() for t in ts]
    assert len(tasks) == len(set(tasks))
    if workers:
        assert sorted((t.query_id, t.partition) for t in tasks) == sorted(
            (q, p) for q, n in queries.items() for p in range(n))
        for query_id in queries:
            counts = [sum(t.query_id == query_id for t in ts) for ts in result.values()]
            assert max(counts) - min(counts) <= 1


def test_same_partition_of_every_query_lands_together() -> None:
    result = assign(["b", "a"], {"Q1": 4, "Q2": 4})
    for tasks in result.values():
        assert {t.partition for t in tasks if t.query_id == "Q1"} == {t.partition for t in tasks if t.query_id == "Q2"}
