"""Aggregate functions as mergeable state.

Spark reduces each micro-batch to one *partial* per key (the ``partials`` expressions, in
Spark SQL; or, for the aggregates with ``arrow`` forms, Arrow's hash aggregation of the
argument values Spark computed); the worker merges partials into the stored state with
``merge`` and shows the state with ``finalize``. States are JSON-serializable lists so they
can travel in the changelog.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.kinds import MAX_DECIMAL_DIGITS, spark_ranked

State = list[Any]
OFFSET = "`_offset`"
SIGN_COLUMN = "_SIGN"
"""The column of a table aggregation's regrouped records that says whether the row is added
to its group (1) or retracted from it (-1): see ``Aggregate.undo``."""
_SIGN = f"`{SIGN_COLUMN}`"


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _least(a: Any, b: Any) -> Any:
    """The smaller as Spark's MIN orders values (NaN above every number)."""
    return min(a, b, key=spark_ranked)


def _greatest(a: Any, b: Any) -> Any:
    """The larger as Spark's MAX orders values (NaN above every number): a batch's NaN stays
    the maximum whichever batch it came in."""
    return max(a, b, key=spark_ranked)


def _pick(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def pick(a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return fn(a, b)

    return pick


def _by_offset(name: str, newer: bool, count: int | None = None, skip_nulls: bool = True) -> Aggregate:
    """LATEST_BY_OFFSET (``newer``) or EARLIEST_BY_OFFSET, as ksqlDB's: the value of the
    greatest (least) offset, NULLs passed over unless ``skip_nulls`` is False; with a
    ``count``, the array of that many values of the greatest (least) offsets, in offset order.

    The state of one value is [value, offset] (offset None: none yet); of ``count`` values,
    [entries], each entry {"o": offset, "v": value} in offset order."""
    pick = "max" if newer else "min"

    def order(x: str) -> str:
        return f"IF(({x}) IS NULL, NULL, {OFFSET})" if skip_nulls else OFFSET

    if count is None:
        def empty(state: State) -> bool:
            # Skipping NULLs, a NULL value is no value: none in this release's states, but an
            # older release kept NULLs, and a state of one would otherwise win for good.
            return state[1] is None or (skip_nulls and state[0] is None)

        def merge(old: State, new: State) -> State:
            if empty(old):
                return new
            if empty(new):
                return old
            return new if (new[1] > old[1]) == newer else old

        return Aggregate(name, lambda x: [f"{pick}_by({x}, {order(x)})", f"{pick}({order(x)})"], merge,
                         lambda s: s[0], lambda t: t, given=_by_offset_given(name, newer), literals=by_offset_literals)

    def partials(x: str) -> list[str]:
        entry = f"named_struct('o', {OFFSET}, 'v', {x})"
        entries = _offset_sorted(f"collect_list({f'IF(({x}) IS NULL, NULL, {entry})' if skip_nulls else entry})")
        return [f"reverse(slice(reverse({entries}), 1, {count}))" if newer else f"slice({entries}, 1, {count})"]

    def merge_entries(old: State, new: State) -> State:
        entries = sorted([*(old[0] or []), *(new[0] or [])], key=lambda e: e["o"])
        return [entries[-count:] if newer else entries[:count]]

    return Aggregate(name, partials, merge_entries, lambda s: [e["v"] for e in s[0] or []],
                     lambda t: SqlType("ARRAY", (t,)), given=_by_offset_given(name, newer),
                     literals=by_offset_literals)


def _by_offset_given(name: str, newer: bool) -> Callable[[tuple[int | bool, ...]], Aggregate]:
    def given(literals: tuple[int | bool, ...]) -> Aggregate:
        count = next((p for p in literals if not isinstance(p, bool)), None)
        skip_nulls = next((p for p in literals if isinstance(p, bool)), True)
        return _by_offset(name, newer, count, skip_nulls)

    return given


def by_offset_literals(name: str, args: Sequence[ast.Expr]) -> tuple[int | bool, ...]:
    """The literal arguments of a LATEST_BY_OFFSET or EARLIEST_BY_OFFSET call after its
    column, as ksqlDB takes them: how many values (an INT of 1 or more), then whether to skip
    NULLs (a BOOLEAN), each optional. In one form per meaning: the defaults left out (``(x,
    true)`` is ``(x)``), so calls that mean the same compare equal, and a count is never
    beside a True (which Python takes for 1)."""
    which = "latest" if name == "LATEST_BY_OFFSET" else "earliest"
    usage = (f"{name} takes a column, then optionally how many {which} values to give (an INT literal of 1 or "
             f"more, giving an ARRAY) and whether to skip NULLs (a BOOLEAN literal, TRUE by default), in that order: "
             f"{name}(x), {name}(x, false), {name}(x, 3) or {name}(x, 3, false)")
    if len(args) > 2:
        raise StatementError(f"{usage}; got {len(args) + 1} arguments")
    count: int | None = None
    skip_nulls = True
    for index, arg in enumerate(args):
        if isinstance(arg, ast.Literal) and arg.type.base == "BOOLEAN" and index == len(args) - 1:
            skip_nulls = bool(arg.value)
        elif isinstance(arg, ast.Literal) and arg.type.base == "INT" and index == 0 and arg.value >= 1:
            count = int(arg.value)
        else:
            raise StatementError(f"{usage}; got {ast.to_sql(arg)} as its argument {index + 2}")
    return (*(() if count is None else (count,)), *(() if skip_nulls else (False,)))


def _top(name: str, distinct: bool, count: int = 1) -> Aggregate:
    """ksqlDB's TOPK and TOPKDISTINCT (``distinct``): the ``count`` greatest values in
    descending order (TOPKDISTINCT each once), NULLs passed over, in Spark's order (NaN above
    every number). The state is that array."""
    def partials(x: str) -> list[str]:
        values = f"collect_list({x})"  # no NULLs
        return [f"slice(reverse(array_sort({f'array_distinct({values})' if distinct else values})), 1, {count})"]

    def merge(old: State, new: State) -> State:
        values = [*(old[0] or []), *(new[0] or [])]
        if distinct:
            values = [v for i, v in enumerate(values) if not any(_same(v, w) for w in values[:i])]
        return [sorted(values, key=_spark_order, reverse=True)[:count]]

    return Aggregate(name, partials, merge, lambda s: s[0] or [], lambda t: SqlType("ARRAY", (t,)), "orderable",
                     given=lambda literals: _top(name, distinct, int(literals[0])), literals=top_literals)


def _spark_order(value: Any) -> Any:
    """A sort key of a value as Spark orders it: a float NaN above every number."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    return value


def top_literals(name: str, args: Sequence[ast.Expr]) -> tuple[int | bool, ...]:
    """TOPK's and TOPKDISTINCT's literal argument after the column: how many values, an INT of
    1 or more (ksqlDB's ``k``)."""
    if len(args) != 1 or not isinstance(args[0], ast.Literal) or args[0].type.base != "INT" or args[0].value < 1:
        given = ", ".join(ast.to_sql(a) for a in args) or "none"
        raise StatementError(f"{name} takes a column and how many of its greatest values to give, an INT literal "
                             f"of 1 or more: {name}(x, 3); got {given} after the column")
    return (int(args[0].value),)


def _offset_sorted(entries: str) -> str:
    """Spark SQL of an array of structs sorted by their offset ``o``, compared alone: whatever
    the other fields hold (a plain sort of structs fails on a MAP, which Spark orders not)."""
    return f"array_sort({entries}, (l, r) -> IF(l.o < r.o, -1, IF(l.o > r.o, 1, 0)))"


def _in_offset_order(x: str) -> str:
    """Spark SQL of the batch's rows as an array of structs: ``s`` the sign (``SIGN_COLUMN``)
    and ``v`` the value of ``x``, in input order (NULLs kept)."""
    return f"transform(array_sort(collect_list(named_struct('o', {OFFSET}, 's', {_SIGN}, 'v', {x}))), " \
           "e -> named_struct('s', e.s, 'v', e.v))"


def _equal_by(same_double: Callable[[float, float], bool]) -> Callable[[Any, Any], bool]:
    """Equality of values whose DOUBLEs (in an array's elements and a struct's fields too) are
    compared by ``same_double``."""
    def equal(a: Any, b: Any) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return same_double(a, b)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
        return bool(a == b)
    return equal


_same = _equal_by(lambda a, b: (a == b and math.copysign(1, a) == math.copysign(1, b)) or (math.isnan(a) and math.isnan(b)))
"""Equal values as Java's ``equals`` finds them, which ksqlDB's lists use: NaN equal to NaN and
-0.0 not to 0.0."""
_spark_same = _equal_by(lambda a, b: a == b or (math.isnan(a) and math.isnan(b)))
"""Equal values as Spark's ``array_distinct`` finds them, which ATTR's and COLLECT_SET's batches
use: NaN equal to NaN and -0.0 to 0.0."""


def _undo_list(old: State | None, new: State) -> State:
    """COLLECT_LIST's state after a table batch: each added value appended in input order, and
    each retracted one taking its last occurrence out (ksqlDB's undo; one never added, nothing)."""
    values = list(old[0] or []) if old is not None else []
    for event in new[0] or []:  # the ``_in_offset_order`` structs, as dicts
        value = event["v"]
        if event["s"] > 0:
            values.append(value)
            continue
        at = next((i for i in range(len(values) - 1, -1, -1) if _same(values[i], value)), None)
        if at is not None:
            del values[at]
    return [values]


COLLECT_SET_LIMIT = 1000
"""Most values a COLLECT_SET keeps, as ksqlDB's default (``ksql.functions.collect_set.limit``):
later ones are left out."""


def _distinct_in_order(x: str) -> str:
    """Spark SQL of the batch's distinct values of ``x`` in input order, each at its first
    occurrence (NULL once too, as a Java list's ``contains`` finds it), at most
    ``COLLECT_SET_LIMIT``."""
    entries = _offset_sorted(f"collect_list(named_struct('o', {OFFSET}, 'v', {x}))")
    return f"slice(array_distinct(transform({entries}, e -> e.v)), 1, {COLLECT_SET_LIMIT})"


def _add_unseen(old: State, new: State) -> State:
    """COLLECT_SET's merge: the values of ``new`` not in ``old`` appended, in their order
    (found as Spark's ``array_distinct`` finds them in a batch, ``_spark_same``: otherwise 0.0
    and -0.0 would be one value or two as the batches were cut)."""
    values = list(old[0] or [])
    for value in new[0] or []:
        if len(values) >= COLLECT_SET_LIMIT:
            break
        if not any(_spark_same(value, held) for held in values):
            values.append(value)
    return [values]


def _attr_partial(x: str) -> str:
    """Spark SQL of ATTR's partial over a stream's batch: two of its distinct values (NULL too),
    each an entry of count 1 (more do not matter: two already make ATTR NULL, and a stream takes
    none back)."""
    return f"transform(slice(array_distinct(collect_list(named_struct('v', {x}))), 1, 2), e -> named_struct('v', e.v, 'n', 1))"


def _attr_merge(old: State, new: State) -> State:
    """ATTR's merge over a stream: the entries of ``new`` whose value ``old`` lacks (found as
    Spark's batches find them, ``_spark_same``), up to two."""
    entries = list(old[0] or [])
    for entry in new[0] or []:
        if len(entries) < 2 and not any(_spark_same(entry["v"], held["v"]) for held in entries):
            entries.append(entry)
    return [entries]


def _attr_undo(old: State | None, new: State) -> State:
    """ATTR's state after a table batch (``_in_offset_order``'s events): each value's count of
    rows, added or taken back (never below 0), as ksqlDB's; values found as a stream's are."""
    entries = [dict(entry) for entry in old[0] or []] if old is not None else []
    for event in new[0] or []:
        held = next((entry for entry in entries if _spark_same(entry["v"], event["v"])), None)
        if held is not None:
            held["n"] = max(0, held["n"] + event["s"])
        elif event["s"] > 0:
            entries.append({"v": event["v"], "n": event["s"]})
    return [[entry for entry in entries if entry["n"] > 0]]


def _attr(state: State) -> Any:
    """ATTR's value: the group's one value (NULL among them), or NULL when it has several."""
    entries = [entry for entry in state[0] or [] if entry["n"] > 0]
    return entries[0]["v"] if len(entries) == 1 else None


HISTOGRAM_LIMIT = 1000
"""Most distinct values a HISTOGRAM counts, as ksqlDB's: a value first seen past them is not counted."""


def _histogram(x: str) -> str:
    """Spark SQL of the batch's count of each non-NULL value of ``x`` (a map)."""
    return (f"map_from_entries(transform(array_distinct(collect_list({x})), "
            f"v -> struct(v, CAST(size(filter(collect_list({x}), w -> w = v)) AS BIGINT))))")


def _signed_histogram(x: str) -> str:
    """``_histogram`` over a table's regrouped rows: each value's rows added less those retracted."""
    entries = f"collect_list(IF(({x}) IS NULL, NULL, named_struct('s', {_SIGN}, 'v', {x})))"
    return (f"map_from_entries(transform(array_distinct(transform({entries}, e -> e.v)), "
            f"v -> struct(v, aggregate(filter({entries}, e -> e.v = v), CAST(0 AS BIGINT), (n, e) -> n + e.s))))")


def _count_into(old: State | None, new: State) -> State:
    """HISTOGRAM's merge: each value's count added to the group's (taken back, signed: a value
    whose count reaches 0 leaves), a value first seen past ``HISTOGRAM_LIMIT`` left out."""
    counts = dict(old[0] or {}) if old is not None else {}
    for value, count in (new[0] or {}).items():
        if value not in counts and len(counts) >= HISTOGRAM_LIMIT:
            continue
        total = counts.get(value, 0) + count
        if total > 0:
            counts[value] = total
        else:
            counts.pop(value, None)
    return [counts]


def _moments(x: str, where: str = "") -> list[str]:
    """Spark SQL of the count, mean and sum of squared deviations from the mean (M2) of the
    non-NULL values of ``x`` (those ``where`` keeps), as doubles; mean and M2 NULL without any."""
    value = f"CAST(({x}) AS DOUBLE)" if not where else f"IF({where}, CAST(({x}) AS DOUBLE), NULL)"
    return [f"count({value})", f"avg({value})", f"var_pop({value}) * count({value})"]


def _with_moments(old: State, new: State, sign: int = 1) -> State:
    """Two sets of values' [count, mean, M2] as one (Chan et al.'s parallel form, as ksqlDB's
    STDDEV_SAMP merges), or with ``sign`` -1 the second taken out of the first."""
    n1, n2 = old[0] or 0, new[0] or 0
    if not n2:
        return [n1, old[1], old[2]] if n1 else [0, None, None]
    mean1, mean2, m2a, m2b = old[1] or 0.0, new[1], old[2] or 0.0, new[2] or 0.0
    if sign > 0:
        n = n1 + n2
        delta = mean2 - mean1
        return [n, mean1 + delta * n2 / n, m2a + m2b + delta * delta * n1 * n2 / n]
    n = n1 - n2
    if n <= 0:
        return [0, None, None]
    mean = (mean1 * n1 - mean2 * n2) / n
    delta = mean2 - mean
    return [n, mean, max(m2a - m2b - delta * delta * n * n2 / n1, 0.0)]


def _undo_moments(old: State | None, new: State) -> State:
    """STDDEV_SAMP's state after a table batch: the rows added (``new``'s first three), then
    those retracted (its last three) taken out."""
    state = old if old is not None else [0, None, None]
    return _with_moments(_with_moments(state, new[:3]), new[3:], sign=-1)


def _sample_deviation(state: State) -> float:
    """The sample standard deviation of a [count, mean, M2] state; 0.0 for fewer than two
    values, as ksqlDB's STDDEV_SAMP."""
    count, _, m2 = state
    return 0.0 if not count or count < 2 else math.sqrt(max(m2 or 0.0, 0.0) / (count - 1))


PAIR_FIELDS = ("x", "y")
"""The fields of the one argument a two-column aggregate's plan holds (``CORRELATION(a, b)``:
``named_struct('x', a, 'y', b)``, ``pair_argument``)."""


def pair_argument(first: str, second: str) -> str:
    """Spark SQL of a two-column aggregate's argument: both columns in one struct."""
    return f"named_struct('{PAIR_FIELDS[0]}', {first}, '{PAIR_FIELDS[1]}', {second})"


SPREAD_NONE = 1e-13
"""A column's sum of squared deviations at most this share of its sum of squares is no spread:
what is left of none after rounding (Spark's means of one value differ in the last bit from
batch to batch; a table's rows taken back leave a residue), where the ratio would be noise."""


def _co_moments(pair: str, where: str = "") -> list[str]:
    """Spark SQL of the count, the two means, the two sums of squared deviations from them and
    the sum of the products of the deviations (n, mean x, mean y, M2 x, M2 y, C) of the pairs of
    ``pair`` (``pair_argument``) that hold two values (and that ``where`` keeps), as doubles."""
    both = " AND ".join([*(f"({pair}).{f} IS NOT NULL" for f in PAIR_FIELDS), *([where] if where else [])])
    x, y = (f"IF({both}, CAST(({pair}).{f} AS DOUBLE), NULL)" for f in PAIR_FIELDS)
    return [f"count({x})", f"avg({x})", f"avg({y})", f"var_pop({x}) * count({x})", f"var_pop({y}) * count({y})",
            f"covar_pop({x}, {y}) * count({x})"]


def _with_co_moments(old: State, new: State, sign: int = 1) -> State:
    """Two sets of pairs' [n, mean x, mean y, M2 x, M2 y, C] as one (Chan et al.'s parallel form
    for co-moments), or with ``sign`` -1 the second taken out of the first."""
    n1, n2 = old[0] or 0, new[0] or 0
    if not n2:
        return list(old) if n1 else [0, None, None, None, None, None]
    mx1, my1, mx2, my2 = old[1] or 0.0, old[2] or 0.0, new[1], new[2]
    m2x1, m2y1, c1, m2x2, m2y2, c2 = (v or 0.0 for v in (old[3], old[4], old[5], new[3], new[4], new[5]))
    if sign > 0:
        n = n1 + n2
        dx, dy = mx2 - mx1, my2 - my1
        scale = n1 * n2 / n
        return [n, mx1 + dx * n2 / n, my1 + dy * n2 / n, m2x1 + m2x2 + dx * dx * scale, m2y1 + m2y2 + dy * dy * scale,
                c1 + c2 + dx * dy * scale]
    n = n1 - n2
    if n <= 0:
        return [0, None, None, None, None, None]
    mx, my = (mx1 * n1 - mx2 * n2) / n, (my1 * n1 - my2 * n2) / n
    dx, dy = mx2 - mx, my2 - my
    scale = n * n2 / n1

    def left(before: float, after: float) -> float:  # what is left of a spread: none, below rounding's residue
        return 0.0 if after <= SPREAD_NONE * before else after

    return [n, mx, my, left(m2x1, m2x1 - m2x2 - dx * dx * scale), left(m2y1, m2y1 - m2y2 - dy * dy * scale),
            c1 - c2 - dx * dy * scale]


def _undo_co_moments(old: State | None, new: State) -> State:
    """CORRELATION's state after a table batch: the pairs added (``new``'s first six), then those
    retracted (its last six) taken out."""
    state = old if old is not None else [0, None, None, None, None, None]
    return _with_co_moments(_with_co_moments(state, new[:6]), new[6:], sign=-1)


def _spread(count: int, mean: float | None, m2: float | None) -> float:
    """A column's sum of squared deviations, 0.0 when it is rounding's residue (``SPREAD_NONE``)."""
    m2, mean = m2 or 0.0, mean or 0.0
    return 0.0 if m2 <= SPREAD_NONE * (m2 + count * mean * mean) else m2


def _correlation(state: State) -> float:
    """The Pearson correlation coefficient of a co-moments state: NaN with fewer than two pairs,
    for a column whose values are all one (ksqlDB's 0 / 0) or a NaN or infinite value, else
    C / sqrt(M2 x * M2 y), within [-1, 1]."""
    count, mean_x, mean_y, m2x, m2y, c = state
    if not count or count < 2:
        return math.nan
    denominator = math.sqrt(_spread(count, mean_x, m2x) * _spread(count, mean_y, m2y))
    ratio = (c or 0.0) / denominator if denominator else math.nan
    return ratio if math.isnan(ratio) else max(-1.0, min(1.0, ratio))


def _signed_count(x: str) -> str:
    """Spark SQL of a batch's count of non-NULL ``x``, retracted rows counted negative."""
    return f"sum(IF(({x}) IS NULL, 0, {_SIGN}))"


def _signed_sum(x: str) -> str:
    """Spark SQL of a batch's sum of ``x``, retracted rows' values subtracted (NULL without
    any): the two sums apart, as Spark sums (an INT's sum a BIGINT; negating the argument
    itself would wrap the least INT, and multiplying a DECIMAL by the sign would widen it)."""
    added, retracted = (f"coalesce(sum(IF({_SIGN} {op} 0, ({x}), NULL)), 0)" for op in (">", "<"))
    return f"IF(count({x}) = 0, NULL, {added} - {retracted})"


@dataclass(frozen=True)
class Aggregate:
    """One aggregate function: how Spark computes a batch partial, and how states combine."""

    name: str
    partials: Callable[[str], list[str]]
    merge: Callable[[State, State], State]
    finalize: Callable[[State], Any]
    result_type: Callable[[SqlType], SqlType]
    param: str = "any"
    """The kind of argument it takes (see ``millpond.shared.sql.kinds.KINDS``)."""
    arrow: tuple[str, ...] = ()
    """The same partials as Arrow hash aggregations of the argument's values (``count``
    counts the non-NULL ones, ``sum`` is NULL without one, as Spark's); empty: Spark only."""
    undo: Callable[[str], list[str]] | None = None
    """The partials over a table's regrouped rows, each added (``SIGN_COLUMN`` 1) or retracted
    (-1): ksqlDB's undo of a table aggregation. None: the aggregate cannot take a row back
    (MIN, MAX ...), so it aggregates streams only."""
    undo_merge: Callable[[State | None, State], State] | None = None
    """How a partial of ``undo``'s forms changes a state (None: the group has none yet), when
    it is not a state itself; None: ``merge`` merges it, and a group's first is its state."""
    columns: int = 1
    """How many columns it aggregates; two: its partials read ``pair_argument``'s struct."""
    given: Callable[[tuple[int | bool, ...]], Aggregate] | None = None
    """The aggregate with the literal arguments a call gives after its column (``literals``
    checks them); None: it takes none."""
    literals: Callable[[str, Sequence[ast.Expr]], tuple[int | bool, ...]] | None = None
    """The literal arguments after the column of a call of it, checked (a StatementError
    saying what it takes); None: it takes none."""

    def merger(self, signed: bool) -> Callable[[State | None, State], State]:
        """How a batch's partial changes a group's state (None: the group has none yet);
        ``signed``: a partial of the ``undo`` forms."""
        if signed and self.undo_merge is not None:
            return self.undo_merge
        merge = self.merge
        return lambda old, new: new if old is None else merge(old, new)


_DOUBLE = SqlType("DOUBLE")
_BIGINT = SqlType("BIGINT")


def _sum_type(type_: SqlType) -> SqlType:
    """SUM's type: its argument's, but for a DECIMAL ten more whole digits, as Spark's (a sum of
    DECIMAL(5, 2) values past 999.99 fits its type, and a table reading the sink reads it)."""
    if type_.base != "DECIMAL":
        return type_
    precision, scale = type_.params
    return SqlType("DECIMAL", (min(precision + 10, MAX_DECIMAL_DIGITS), scale))

AGGREGATES: dict[str, Aggregate] = {
    a.name: a
    for a in [
        Aggregate("COUNT", lambda x: [f"count({x})"], lambda o, n: [_add(o[0], n[0])],
                  lambda s: s[0] or 0, lambda _t: _BIGINT, arrow=("count",), undo=lambda x: [_signed_count(x)]),
        Aggregate("SUM", lambda x: [f"sum({x})"], lambda o, n: [_add(o[0], n[0])],
                  lambda s: s[0], _sum_type, "numeric", arrow=("sum",), undo=lambda x: [_signed_sum(x)]),
        Aggregate("AVG", lambda x: [f"sum({x})", f"count({x})"],
                  lambda o, n: [_add(o[0], n[0]), _add(o[1], n[1])],
                  lambda s: (s[0] / s[1]) if s[1] else None, lambda _t: _DOUBLE, "numeric",
                  arrow=("sum", "count"), undo=lambda x: [_signed_sum(x), _signed_count(x)]),
        Aggregate("MIN", lambda x: [f"min({x})"], lambda o, n: [_pick(_least)(o[0], n[0])],
                  lambda s: s[0], lambda t: t, "orderable", arrow=("min",)),
        Aggregate("MAX", lambda x: [f"max({x})"], lambda o, n: [_pick(_greatest)(o[0], n[0])],
                  lambda s: s[0], lambda t: t, "orderable", arrow=("max",)),
        _by_offset("LATEST_BY_OFFSET", newer=True),
        _by_offset("EARLIEST_BY_OFFSET", newer=False),
        Aggregate("COUNT_DISTINCT", lambda x: [f"collect_set({x})"],
                  lambda o, n: [sorted(set(o[0] or []) | set(n[0] or []), key=repr)],
                  lambda s: len(s[0] or []), lambda _t: _BIGINT, "orderable"),
        Aggregate("STDDEV_SAMP", _moments, _with_moments, _sample_deviation, lambda _t: _DOUBLE, "numeric",
                  undo=lambda x: [*_moments(x, f"{_SIGN} > 0"), *_moments(x, f"{_SIGN} < 0")],
                  undo_merge=_undo_moments),
        Aggregate("CORRELATION", _co_moments, _with_co_moments, _correlation, lambda _t: _DOUBLE, "numeric",
                  undo=lambda x: [*_co_moments(x, f"{_SIGN} > 0"), *_co_moments(x, f"{_SIGN} < 0")],
                  undo_merge=_undo_co_moments, columns=2),
        Aggregate("HISTOGRAM", lambda x: [_histogram(x)], _count_into, lambda s: s[0] or {},
                  lambda _t: SqlType("MAP", (SqlType("VARCHAR"), _BIGINT)), "string",
                  undo=lambda x: [_signed_histogram(x)], undo_merge=_count_into),
        _top("TOPK", distinct=False),
        _top("TOPKDISTINCT", distinct=True),
        Aggregate("ATTR", lambda x: [_attr_partial(x)], _attr_merge, _attr, lambda t: t, "listable",
                  undo=lambda x: [_in_offset_order(x)], undo_merge=_attr_undo),
        Aggregate("COLLECT_SET", lambda x: [_distinct_in_order(x)], _add_unseen, lambda s: s[0] or [],
                  lambda t: SqlType("ARRAY", (t,)), "listable"),
        Aggregate("COLLECT_LIST",
                  lambda x: [f"transform(array_sort(collect_list(named_struct('o', {OFFSET}, 'v', {x}))), e -> e.v)"],
                  lambda o, n: [(o[0] or []) + (n[0] or [])],
                  lambda s: s[0] or [], lambda t: SqlType("ARRAY", (t,)), "listable",
                  undo=lambda x: [_in_offset_order(x)], undo_merge=_undo_list),
    ]
}


def lookup(name: str) -> Aggregate | None:
    """The aggregate called ``name`` (upper-case), or None for a scalar function."""
    return AGGREGATES.get(name.upper())


def of(name: str, literals: tuple[int | bool, ...] = ()) -> Aggregate:
    """The aggregate a call of ``name`` with the literal arguments ``literals`` computes
    (``AggregateCall.literals``). Not cached: (True,) and (1,) are equal keys in Python."""
    aggregate = require(name)
    if not literals:
        return aggregate
    if aggregate.given is None:
        raise StatementError(f"{name} takes exactly one argument")
    return aggregate.given(literals)


def require(name: str) -> Aggregate:
    """The aggregate called ``name``, or a StatementError listing the known ones."""
    agg = lookup(name)
    if agg is None:
        raise StatementError(f"unknown aggregate {name}; known: {', '.join(sorted(AGGREGATES))}")
    return agg
