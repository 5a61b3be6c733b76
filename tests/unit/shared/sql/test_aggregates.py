import json
import math
import re
import statistics
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import StatementError
from millpond.shared.sql.aggregates import AGGREGATES, by_offset_literals, of, top_literals
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.parser import parse_statement


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
        "COLLECT_SET": lambda: [list(dict.fromkeys(v for _, v in sorted(values)))],
        "ATTR": lambda: [[{"v": v, "n": 1} for v in list(dict.fromkeys(vs))[:2]]],
        "HISTOGRAM": lambda: [dict(Counter(vs))],
        "STDDEV_SAMP": lambda: [len(vs), statistics.fmean(vs) if vs else None,
                                sum((v - statistics.fmean(vs)) ** 2 for v in vs) if vs else None],
        "CORRELATION": lambda: co_moments([(float(v), float(v % 7)) for v in vs]),
        "TOPK": lambda: [sorted(vs, reverse=True)[:1]],
        "TOPKDISTINCT": lambda: [sorted(set(vs), reverse=True)[:1]],
    }[name]()


@given(st.lists(st.integers(-100, 100), min_size=1, max_size=40), st.integers(0, 40))
def test_merging_batch_partials_equals_one_big_batch(values: list[int], cut: int) -> None:
    records = list(enumerate(values))
    first, second = records[:cut], records[cut:]
    for name, agg in AGGREGATES.items():
        merged = agg.merge(partial(name, first), partial(name, second))
        if name in ("STDDEV_SAMP", "CORRELATION"):  # floating point: merged in another order than computed at once
            got, want = agg.finalize(merged), agg.finalize(partial(name, records))
            assert math.isnan(got) if math.isnan(want) else math.isclose(got, want, abs_tol=1e-9), name
        else:
            assert agg.finalize(merged) == agg.finalize(partial(name, records)), name


def test_avg_of_the_seed_example() -> None:
    avg = AGGREGATES["AVG"]
    assert avg.finalize(avg.merge([20 + 29, 2], [23 + 28 + 21, 3])) == 24.2


def events(*signed: tuple[int, Any]) -> list[Any]:
    """COLLECT_LIST's partial over a table's regrouped rows: (sign, value) in input order."""
    return [[{"s": sign, "v": value} for sign, value in signed]]


def test_collect_list_on_a_table_takes_back_the_last_occurrence_of_each_retracted_value() -> None:
    fold = AGGREGATES["COLLECT_LIST"].merger(signed=True)
    first = fold(None, events((1, "a"), (1, "b"), (1, "a"), (-1, "b"), (1, None)))
    assert first == [["a", "a", None]]
    # The stored state is the stream's form (a list), so it shows and restores alike.
    assert AGGREGATES["COLLECT_LIST"].finalize(first) == ["a", "a", None]
    assert fold(first, events((-1, "a"), (1, "c"), (-1, None))) == [["a", "c"]]
    # The last occurrence goes (ksqlDB's lastIndexOf): the first "a" stays ahead of "b".
    assert fold(None, events((1, "a"), (1, "b"), (1, "a"), (-1, "a"))) == [["a", "b"]]
    # A value never added (its row was not counted) takes nothing out.
    assert fold([["a"]], events((-1, "z"))) == [["a"]]


def test_collect_list_on_a_table_finds_values_as_java_equals_does() -> None:
    """NaN is taken back by NaN, also inside a struct or an array (each NaN a float of its
    own); -0.0 is not 0.0 (Java's ``Double.equals``)."""
    fold = AGGREGATES["COLLECT_LIST"].merger(signed=True)
    nan = float("nan")
    state = json.loads(json.dumps(fold(None, events((1, nan), (1, {"X": nan}), (1, [1.0, nan]), (1, "k")))))
    assert fold(state, events((-1, float("nan")), (-1, {"X": float("nan")}), (-1, [1.0, float("nan")]))) == [["k"]]
    assert fold(None, events((1, 0.0), (1, -0.0), (-1, 0.0)))[0] == [-0.0]
    assert math.copysign(1, fold(None, events((1, 0.0), (1, -0.0), (-1, 0.0)))[0][0]) == -1


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=40), st.integers(0, 40))
def test_collect_list_on_a_table_folds_batches_as_one(changes: list[tuple[int, bool]], cut: int) -> None:
    """Rows added and taken back (never one not in the list) give the same multiset whether
    the changes come in one batch or two, and that multiset is the rows still in."""
    signed, held = [], []
    for value, add in changes:
        if add or value not in held:
            signed.append((1, value))
            held.append(value)
        else:
            signed.append((-1, value))
            held.remove(value)
    fold = AGGREGATES["COLLECT_LIST"].merger(signed=True)
    whole = fold(None, events(*signed))
    assert fold(fold(None, events(*signed[:cut])), events(*signed[cut:])) == whole
    assert sorted(whole[0]) == sorted(held)


def test_other_merges_take_a_tables_partials_as_a_streams() -> None:
    """Without an ``undo_merge``, a group's first partial is its state and later ones merge."""
    count, collect = AGGREGATES["COUNT"].merger(signed=True), AGGREGATES["COLLECT_LIST"].merger(signed=False)
    assert count(None, [3]) == [3]
    assert count([2], [-1]) == [1]
    assert collect(None, [["a"]]) == [["a"]]
    assert collect([["a"]], [["b"]]) == [["a", "b"]]


def by_offset_partial(newer: bool, params: tuple[int | bool, ...], batch: list[tuple[int, int | None]]) -> list[Any]:
    """What Spark's partial of LATEST_BY_OFFSET (``newer``) or EARLIEST_BY_OFFSET with
    ``params`` yields for one batch of (offset, value) pairs, in offset order."""
    count = next((p for p in params if not isinstance(p, bool)), None)
    skip = next((p for p in params if isinstance(p, bool)), True)
    kept = [(o, v) for o, v in batch if v is not None or not skip]
    if count is None:
        chosen = (kept[-1] if newer else kept[0]) if kept else (None, None)
        return [chosen[1], chosen[0]]
    return [[{"o": o, "v": v} for o, v in (kept[-count:] if newer else kept[:count])]]


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=30), st.integers(0, 30),
       st.sampled_from([(), (False,), (True,), (1,), (3,), (2, False), (2, True)]), st.booleans())
def test_by_offset_skips_nulls_unless_told_and_keeps_n_values_across_batches(
        values: list[int | None], cut: int, params: tuple[int | bool, ...], newer: bool) -> None:
    """ksqlDB's LATEST_BY_OFFSET and EARLIEST_BY_OFFSET: NULLs skipped by default (a group
    whose values are all NULL shows NULL), kept with ``false``; with N, the N latest (earliest)
    values in offset order. Two batches merged give what one batch of them all gives."""
    name = "LATEST_BY_OFFSET" if newer else "EARLIEST_BY_OFFSET"
    agg = of(name, params)
    records = list(enumerate(values))
    merged = agg.merge(by_offset_partial(newer, params, records[:cut]), by_offset_partial(newer, params, records[cut:]))
    count = next((p for p in params if not isinstance(p, bool)), None)
    candidates = values if False in params else [v for v in values if v is not None]
    if count is None:
        assert agg.finalize(merged) == ((candidates[-1] if newer else candidates[0]) if candidates else None)
    else:
        assert agg.finalize(merged) == (candidates[-count:] if newer else candidates[:count])
    assert agg.finalize(merged) == agg.finalize(by_offset_partial(newer, params, records))


def test_by_offset_literals_are_ksqldbs_literals() -> None:
    def params(sql: str) -> tuple[int | bool, ...]:
        (item,) = parse_statement(f"SELECT {sql} FROM s GROUP BY k").items  # type: ignore[attr-defined]
        call = item.expr
        return by_offset_literals(call.name, call.args[1:])

    assert params("LATEST_BY_OFFSET(x)") == params("LATEST_BY_OFFSET(x, true)") == ()
    assert params("LATEST_BY_OFFSET(x, false)") == (False,)
    # One form per meaning: the defaults left out, so (x, 1) and (x, true) never compare equal.
    assert params("EARLIEST_BY_OFFSET(x, 3)") == params("EARLIEST_BY_OFFSET(x, 3, TRUE)") == (3,)
    assert params("EARLIEST_BY_OFFSET(x, 3, false)") == (3, False)
    for wrong in ("LATEST_BY_OFFSET(x, 0)", "LATEST_BY_OFFSET(x, y)", "LATEST_BY_OFFSET(x, false, 2)",
                  "LATEST_BY_OFFSET(x, 2, 3)", "LATEST_BY_OFFSET(x, 'a')", "LATEST_BY_OFFSET(x, 2, true, true)",
                  "LATEST_BY_OFFSET(x, 2.5)"):
        with pytest.raises(StatementError, match=r"LATEST_BY_OFFSET\(x, 3, false\)"):
            params(wrong)
    assert of("LATEST_BY_OFFSET", (2,)).result_type(SqlType("INT")) == SqlType("ARRAY", (SqlType("INT"),))


def test_a_null_an_older_release_kept_gives_way_where_nulls_are_skipped() -> None:
    """Before NULLs were skipped, a state could hold a NULL as its value: skipping NULLs, such
    a state is no value, so the next one replaces it (else EARLIEST would show NULL for good)."""
    old_state = [None, 3]
    assert of("EARLIEST_BY_OFFSET").merger(signed=False)(old_state, [7, 9]) == [7, 9]
    assert of("LATEST_BY_OFFSET").merger(signed=False)([7, 9], old_state) == [7, 9]
    assert of("EARLIEST_BY_OFFSET", (False,)).merger(signed=False)(old_state, [7, 9]) == old_state


def test_collect_set_keeps_each_value_once_where_it_first_came() -> None:
    """ksqlDB's COLLECT_SET: distinct values in the order they first came, NULL once, across
    batches; a value found as Spark's batches find it (NaN is NaN, -0.0 is 0.0: the one that
    came first is kept), inside arrays and structs too."""
    merge = AGGREGATES["COLLECT_SET"].merge
    nan = float("nan")
    state = merge([["b", None, "a"]], [["a", "c", None]])
    assert AGGREGATES["COLLECT_SET"].finalize(state) == ["b", None, "a", "c"]
    merged = merge([[nan, -0.0, {"X": [1.0]}]], [[float("nan"), 0.0, {"X": [1.0]}, {"X": [-0.0]}, {"X": [0.0]}]])[0]
    assert len(merged) == 4 and math.isnan(merged[0]) and merged[2:] == [{"X": [1.0]}, {"X": [0.0]}]
    assert math.copysign(1, merged[1]) == -1 and math.copysign(1, merged[3]["X"][0]) == -1


@given(st.lists(st.one_of(st.integers(-5, 5), st.just(float("nan")), st.floats(-5, 5)), max_size=30),
       st.integers(0, 30), st.integers(1, 4), st.booleans())
def test_topk_keeps_the_greatest_values_across_batches(values: list[float], cut: int, k: int, distinct: bool) -> None:
    """ksqlDB's TOPK (TOPKDISTINCT: each value once): the k greatest in descending order, NaN
    above every number as Spark and Java order it; two batches merged give what one gives."""
    agg = of("TOPKDISTINCT" if distinct else "TOPK", (k,))
    floats = [float(v) for v in values]

    def top(batch: list[float]) -> list[float]:
        kept = [v for i, v in enumerate(batch) if not distinct or not any(
            v == w or (math.isnan(v) and math.isnan(w)) for w in batch[:i])]
        nans = [v for v in kept if math.isnan(v)]
        return (nans + sorted((v for v in kept if not math.isnan(v)), reverse=True))[:k]

    merged = agg.finalize(agg.merge([top(floats[:cut])], [top(floats[cut:])]))
    want = top(floats)
    assert len(merged) == len(want) and all(
        (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(merged, want, strict=True))


def test_topk_takes_one_literal_count() -> None:
    def literals(sql: str) -> tuple[int | bool, ...]:
        (item,) = parse_statement(f"SELECT {sql} FROM s GROUP BY k").items  # type: ignore[attr-defined]
        return top_literals(item.expr.name, item.expr.args[1:])

    assert literals("TOPK(x, 3)") == (3,)
    for wrong in ("TOPK(x)", "TOPK(x, 0)", "TOPK(x, y)", "TOPK(x, 2, 3)", "TOPK(x, true)"):
        with pytest.raises(StatementError, match=r"TOPK\(x, 3\)"):
            literals(wrong)


def test_histogram_counts_each_value_and_takes_back_a_tables_rows() -> None:
    """ksqlDB's HISTOGRAM: each value's count, across batches; over a table a retracted row
    takes one back and a value at 0 leaves; past 1000 values a new one is not counted."""
    histogram = AGGREGATES["HISTOGRAM"]
    assert histogram.finalize(histogram.merge([{"a": 2, "b": 1}], [{"b": 2, "c": 1}])) == {"a": 2, "b": 3, "c": 1}
    fold = histogram.merger(signed=True)
    state = fold(None, [{"a": 2, "b": 1}])
    assert fold(state, [{"a": -1, "b": -1, "c": 1}]) == [{"a": 1, "c": 1}]
    assert fold(state, [{"z": -1}]) == state  # a value never counted takes nothing back
    full = [{f"v{i}": 1 for i in range(1000)}]
    assert histogram.merge(full, [{"v1": 1, "new": 1}])[0] == {**full[0], "v1": 2}


def test_collect_set_keeps_at_most_a_thousand_values() -> None:
    merge = AGGREGATES["COLLECT_SET"].merge
    assert merge([list(range(999))], [[5, 1000, 1001]]) == [[*range(999), 1000]]


def moments(values: list[float]) -> list[Any]:
    """What Spark's STDDEV_SAMP partial gives for a batch: count, mean and M2."""
    if not values:
        return [0, None, None]
    mean = statistics.fmean(values)
    return [len(values), mean, sum((v - mean) ** 2 for v in values)]


@given(st.lists(st.integers(-1000, 1000).map(float) | st.floats(-1000, 1000), max_size=40),
       st.lists(st.integers(0, 39), max_size=10), st.integers(0, 40))
def test_stddev_samp_merges_batches_and_takes_back_a_tables_rows(values: list[float], taken: list[int],
                                                                   cut: int) -> None:
    """STDDEV_SAMP, ksqlDB's (the square root of the sample variance; 0.0 below two values):
    batches merged as one; over a table, rows retracted leave the deviation of those left."""
    agg = AGGREGATES["STDDEV_SAMP"]

    def deviation(kept: list[float]) -> float:
        return statistics.stdev(kept) if len(kept) > 1 else 0.0

    merged = agg.merge(moments(values[:cut]), moments(values[cut:]))
    assert math.isclose(agg.finalize(merged), deviation(values), rel_tol=1e-6, abs_tol=1e-6)
    out = sorted({i for i in taken if i < len(values)})
    left = [v for i, v in enumerate(values) if i not in out]
    fold = agg.merger(signed=True)
    state = fold(None, [*moments(values), *moments([])])
    state = fold(state, [*moments([]), *moments([values[i] for i in out])])
    assert state[0] == len(left)
    assert math.isclose(agg.finalize(state), deviation(left), rel_tol=1e-6, abs_tol=1e-3)


def co_moments(pairs: list[tuple[float | None, float | None]]) -> list[Any]:
    """What Spark's CORRELATION partial gives for a batch: n, the means, M2 of each, C (of the
    pairs holding two values)."""
    both = [(x, y) for x, y in pairs if x is not None and y is not None]
    if not both:
        return [0, None, None, None, None, None]
    mx, my = statistics.fmean(x for x, _ in both), statistics.fmean(y for _, y in both)
    return [len(both), mx, my, sum((x - mx) ** 2 for x, _ in both), sum((y - my) ** 2 for _, y in both),
            sum((x - mx) * (y - my) for x, y in both)]


def pearson(pairs: list[tuple[float | None, float | None]]) -> float:
    """CORRELATION of ``pairs`` as ksqlDB defines it: Pearson's coefficient of the pairs holding
    two values, NaN (its 0 / 0) below two of them or when a column holds one value only."""
    both = [(x, y) for x, y in pairs if x is not None and y is not None]
    if len(both) < 2 or len({x for x, _ in both}) < 2 or len({y for _, y in both}) < 2:
        return math.nan
    return statistics.correlation([x for x, _ in both], [y for _, y in both])


# Whole numbers, hundredths, and 0.1, whose means Spark's batches round differently.
NUMBERS = st.integers(-50, 50).map(float) | st.integers(-500, 500).map(lambda i: i / 100) | st.just(0.1) | st.none()


@settings(max_examples=400)
@given(st.lists(st.tuples(NUMBERS, NUMBERS), max_size=40), st.lists(st.integers(0, 39), max_size=10),
       st.integers(0, 40))
def test_correlation_merges_batches_and_takes_back_a_tables_rows(pairs: list[tuple[float | None, float | None]],
                                                                 taken: list[int], cut: int) -> None:
    """CORRELATION, ksqlDB's (Pearson's coefficient of the pairs holding two values; NaN below
    two or for a column of one value): batches merged as one; over a table, rows retracted
    leave the coefficient of those left."""
    agg = AGGREGATES["CORRELATION"]

    def same(got: float, want: float) -> bool:
        return math.isnan(got) if math.isnan(want) else math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)

    merged = agg.merge(co_moments(pairs[:cut]), co_moments(pairs[cut:]))
    assert same(agg.finalize(merged), pearson(pairs)), (merged, pearson(pairs))
    out = sorted({i for i in taken if i < len(pairs)})
    left = [p for i, p in enumerate(pairs) if i not in out]
    fold = agg.merger(signed=True)
    state = fold(None, [*co_moments(pairs), *co_moments([])])
    state = fold(state, [*co_moments([]), *co_moments([pairs[i] for i in out])])
    assert state[0] == len([p for p in left if None not in p])
    assert same(agg.finalize(state), pearson(left)), (state, pearson(left))


def test_correlation_of_a_column_of_one_value_is_nan_however_batches_are_cut() -> None:
    """Spark's mean of three 0.1s is 0.10000000000000002, of one 0.1 is 0.1: merged, a column of
    0.1s has a spread of rounding's residue alone, which is none (not a coefficient of noise);
    so has one whose other values a table took back, and a NaN or infinite value is NaN."""
    agg = AGGREGATES["CORRELATION"]
    first = [3, sum([0.1] * 3) / 3, 2.0, 0.0, 2.0, 0.0]  # (0.1, 1), (0.1, 2), (0.1, 3) as Spark's avg gives them
    assert math.isnan(agg.finalize(agg.merge(first, [1, 0.1, 4.0, 0.0, 0.0, 0.0])))
    fold = agg.merger(signed=True)
    kept = fold(None, [*co_moments([(7.0, 9.0), (1.0, 9.0), (0.0, 7.0)]), *co_moments([])])
    assert math.isnan(agg.finalize(fold(kept, [*co_moments([]), *co_moments([(1.0, 9.0), (0.0, 7.0)])])))
    assert math.isnan(agg.finalize([2, math.nan, 2.0, math.nan, 1.0, math.nan]))
    assert agg.finalize(co_moments([(1.0, 2.0), (2.0, 4.1), (3.0, 5.9)])) == pytest.approx(0.999015263178192)


def test_correlation_takes_two_numbers() -> None:
    schema = "CREATE STREAM s (k VARCHAR KEY, a INT, b DOUBLE, c VARCHAR) WITH (kafka_topic='s', value_format='json')"
    meta = Metastore()
    meta.apply(parse_statement(schema), 0)
    meta.apply(parse_statement("CREATE TABLE t AS SELECT k, CORRELATION(a, b * 2) AS r FROM s GROUP BY k"), 1)
    (query,) = meta.queries.values()
    (call,) = query.plan.aggregates
    assert call.argument == "named_struct('x', `A`, 'y', (`B` * 2))" and meta.source("T").schema["R"] == SqlType("DOUBLE")
    for select, message in [("CORRELATION(a)", "CORRELATION takes exactly 2 arguments, each a column or expression, got 1"),
                            ("CORRELATION(a, c)", "CORRELATION needs numeric arguments"),
                            ("CORRELATION(a, b, a)", "takes exactly 2 arguments")]:
        with pytest.raises(StatementError, match=re.escape(message)):
            meta.apply(parse_statement(f"CREATE TABLE u AS SELECT k, {select} AS r FROM s GROUP BY k"), 2)


@pytest.mark.parametrize("order", [(1.0, math.nan), (math.nan, 1.0)])
def test_min_and_max_of_batches_order_nan_as_spark_whichever_batch_it_came_in(order: tuple[float, float]) -> None:
    """Spark's MAX of a batch with a NaN is NaN, its MIN the least number; merged in Python, a
    batch's NaN was kept or lost by the order the batches came in (``max(1.0, nan)`` is 1.0)."""
    first, second = order
    assert math.isnan(AGGREGATES["MAX"].merge([first], [second])[0])
    assert AGGREGATES["MIN"].merge([first], [second]) == [1.0]
    assert AGGREGATES["MAX"].merge([None], [2.0]) == [2.0] and AGGREGATES["MIN"].merge([3], [None]) == [3]


def test_attr_is_the_one_value_of_a_group_and_counts_rows_taken_back() -> None:
    """ATTR (ksqlDB's): a stream's groups NULL for good once two values are seen (NULL is one);
    a table's count each value's rows, so that a value all of whose rows left is no longer one."""
    attr = AGGREGATES["ATTR"]
    stream = attr.merger(signed=False)
    state = stream(None, [[{"v": "a", "n": 1}]])
    assert attr.finalize(state) == "a"
    assert attr.finalize(stream(state, [[{"v": "a", "n": 1}]])) == "a"
    assert attr.finalize(stream(state, [[{"v": None, "n": 1}]])) is None
    # Values compared as Spark's array_distinct compares them in a batch: NaN equal to NaN, -0.0 to 0.0.
    nan = stream(None, [[{"v": math.nan, "n": 1}]])
    assert math.isnan(attr.finalize(stream(nan, [[{"v": math.nan, "n": 1}]])))
    assert attr.finalize(stream(stream(None, [[{"v": 0.0, "n": 1}]]), [[{"v": -0.0, "n": 1}]])) == 0.0
    assert attr.finalize(stream(stream(None, [[{"v": 1.0, "n": 1}]]), [[{"v": -1.0, "n": 1}]])) is None
    assert attr.finalize(stream(stream(None, [[{"v": [0.0], "n": 1}]]), [[{"v": [-0.0], "n": 1}]])) == [0.0]
    table = attr.merger(signed=True)
    state = table(None, events((1, "a"), (1, "b"), (1, "a")))
    assert attr.finalize(state) is None
    state = table(state, events((-1, "b")))
    assert attr.finalize(state) == "a"
    state = table(state, events((-1, "a"), (-1, "a"), (-1, "a"), (1, "c")))  # never below 0
    assert attr.finalize(state) == "c" and state == [[{"v": "c", "n": 1}]]
    assert attr.finalize(table(state, events((-1, "c")))) is None
    assert json.loads(json.dumps(state)) == state  # stored as JSON
