from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from millpond.shared.sql.aggregates import AGGREGATES


def partial(name: str, values: list[tuple[int, int]]) -> list[Any]:
    """What Spark's partial expression yields for (offset, value) pairs of one batch."""
    vs = [v for _, v in values]
    return {
        "COUNT": lambda: [len(vs)],
        "SUM": lambda: [sum(vs) if vs else None],
        "AVG": lambda: [sum(vs) if vs else None, len(vs)],
        "MIN": lambda: [min(vs) if vs else None],
        "MAX": lambda: [max(vs) if vs else None],
        "LATEST_BY_OFFSET": lambda: [max(values)[1] if values else None, max(values)[0] if values else None],
        "EARLIEST_BY_OFFSET": lambda: [min(values)[1] if values else None, min(values)[0] if values else None],
        "COUNT_DISTINCT": lambda: [sorted(set(vs))],
        "COLLECT_LIST": lambda: [[v for _, v in sorted(values)]],
    }[name]()


@given(st.lists(st.integers(-100, 100), min_size=1, max_size=40), st.integers(0, 40))
def test_merging_batch_partials_equals_one_big_batch(values: list[int], cut: int) -> None:
    records = list(enumerate(values))
    first, second = records[:cut], records[cut:]
    for name, agg in AGGREGATES.items():
        merged = agg.merge(partial(name, first), partial(name, second))
        assert agg.finalize(merged) == agg.finalize(partial(name, records)), name


def test_avg_of_the_seed_example() -> None:
    avg = AGGREGATES["AVG"]
    assert avg.finalize(avg.merge([20 + 29, 2], [23 + 28 + 21, 3])) == 24.2
