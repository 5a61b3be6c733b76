"""Type checking of expressions against a source's columns.

``check`` returns an expression's SQL type or raises: unknown columns and functions are
``NotFoundError``; type clashes are ``StatementError`` naming the expression and both types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, TypeVar, cast

from millpond.shared.errors import NotFoundError, StatementError
from millpond.shared.sql import aggregates, ast, functions, kinds, likes
from millpond.shared.sql.arrays import MAP_KEY_TYPES
from millpond.shared.sql.ast import SqlType, to_sql
from millpond.shared.sql.kinds import INTEGRAL, NUMERIC, common_type, decimal_type

RECORD_PLACES = {"ROWPARTITION": SqlType("INT"), "ROWOFFSET": SqlType("BIGINT")}
"""ksqlDB's pseudo-columns of a record's partition and offset, which the queries that read
records read (push queries, pulls over a stream, persistent queries but joins)."""
RECORD_PLACES_READ = (f"{' and '.join(RECORD_PLACES)}, a record's partition and offset, are read by push queries, pull "
                      "queries over a stream and persistent queries, not by a join or a pull query over a table")
"""Where ROWPARTITION and ROWOFFSET may be read, for a message about one read elsewhere."""

BOOLEAN = SqlType("BOOLEAN")
PRIMITIVE = frozenset({"BOOLEAN", "INT", "BIGINT", "DOUBLE", "DECIMAL", "VARCHAR", "BYTES", "TIMESTAMP", "DATE", "TIME"})
# Casts Spark and the Python evaluator both do the same way.
CASTABLE = frozenset({"BOOLEAN", "INT", "BIGINT", "DOUBLE", "DECIMAL", "VARCHAR"})


@dataclass(frozen=True)
class Scope:
    """The columns an expression may use: those of one source, optionally aliased."""

    source: str
    schema: Mapping[str, SqlType]
    alias: str | None = None
    variables: tuple[tuple[str, SqlType, str], ...] = ()
    """The parameters of the lambdas an expression is inside, innermost last: name, type and
    Spark SQL."""

    def variable(self, ref: ast.LambdaVar) -> tuple[SqlType, str]:
        """A lambda parameter's type and Spark SQL."""
        for name, type_, spark in reversed(self.variables):
            if name == ref.name:
                return type_, spark
        raise StatementError(f"{ref.name} is no parameter of a lambda around it")

    def with_variables(self, names: tuple[str, ...], types: tuple[SqlType, ...], sparks: tuple[str, ...]) -> Scope:
        """This scope inside a lambda of these parameters, each with its Spark SQL."""
        return replace(self, variables=(*self.variables, *zip(names, types, sparks, strict=True)))

    def column(self, ref: ast.ColumnRef) -> SqlType:
        """The type of a column reference, checking its qualifier."""
        if ref.qualifier is not None and ref.qualifier not in (self.source, self.alias):
            names = self.source + (f" (alias {self.alias})" if self.alias else "")
            raise NotFoundError(f"{ref.qualifier}.{ref.name}: the query reads {names}, not {ref.qualifier}")
        found = self.schema.get(ref.name)
        if found is None:
            hint = f"; its columns are {', '.join(self.schema)}" if self.schema else ""
            if ref.name in RECORD_PLACES:
                hint = f": {RECORD_PLACES_READ}"
            raise NotFoundError(f"column {ref.name} does not exist in {self.source}{hint}")
        return found


def _clash(what: str, *parts: tuple[ast.Expr, SqlType]) -> StatementError:
    described = ", ".join(f"{to_sql(e)} is {t}" for e, t in parts)
    return StatementError(f"{what}: {described}")


_KIND_NAMES = {NUMERIC: "numbers", INTEGRAL: "INT or BIGINT", frozenset({"BOOLEAN"}): "BOOLEAN",
               frozenset({"VARCHAR"}): "VARCHAR"}


def _require(expr: ast.Expr, type_: SqlType, allowed: frozenset[str], what: str) -> None:
    if type_.base != "NULL" and type_.base not in allowed:
        wanted = _KIND_NAMES.get(allowed) or " or ".join(sorted(allowed))
        raise _clash(f"{what} needs {wanted}", (expr, type_))


def comparable(a: SqlType, b: SqlType) -> bool:
    """True if values of the two types can be compared with =, <, BETWEEN and IN."""
    if "NULL" in (a.base, b.base):
        return True
    if a.base in NUMERIC and b.base in NUMERIC:
        return True
    return a.base == b.base and a.base in PRIMITIVE


def as_decimal(expr: ast.Expr, type_: SqlType, other: SqlType) -> tuple[int, int]:
    """The (precision, scale) Spark takes an operand of DECIMAL arithmetic as: a DECIMAL's own,
    an integer literal's digits (``DecimalType.fromLiteral``: 2 is DECIMAL(1, 0)), an INT's 10
    or a BIGINT's 20 whole digits, a NULL's the other operand's."""
    if type_.base == "DECIMAL":
        return type_.params
    if type_.base == "NULL":
        return as_decimal(expr, other, other)
    if isinstance(expr, ast.Literal) and isinstance(expr.value, int):
        return len(str(abs(expr.value))), 0
    return kinds.INTEGRAL_DECIMALS[type_.base]


def decimal_arithmetic(op: str, left: tuple[int, int], right: tuple[int, int]) -> SqlType:
    """The DECIMAL that ``left op right`` gives, as Spark's ``DecimalPrecision`` types it: exact
    where 38 digits hold it (``kinds.decimal_type``)."""
    (p1, s1), (p2, s2) = left, right
    if op in ("+", "-"):
        scale = max(s1, s2)
        return decimal_type(max(p1 - s1, p2 - s2) + scale + 1, scale)
    if op == "*":
        return decimal_type(p1 + p2 + 1, s1 + s2)
    if op == "/":
        scale = max(6, s1 + p2 + 1)
        return decimal_type(p1 - s1 + s2 + scale, scale)
    scale = max(s1, s2)  # %
    return decimal_type(min(p1 - s1, p2 - s2) + scale, scale)


def check(expr: ast.Expr, scope: Scope, *, aggregates_allowed: bool = False) -> SqlType:
    """The type of ``expr`` in ``scope``; raises if it is ill-typed or names unknown things."""
    def sub(e: ast.Expr) -> SqlType:
        return check(e, scope, aggregates_allowed=False)

    if isinstance(expr, ast.Literal):
        if isinstance(expr.value, int) and not isinstance(expr.value, bool) and expr.value >= 2**63:
            # 2^63 parses only to be negated (BIGINT's least): left so, or negated twice, it is no BIGINT
            raise StatementError(f"the integer {expr.value} is out of BIGINT's range (at most {2**63 - 1})")
        return expr.type
    if isinstance(expr, ast.ColumnRef):
        return scope.column(expr)
    if isinstance(expr, ast.LambdaVar):
        return scope.variable(expr)[0]
    if isinstance(expr, ast.Lambda):
        raise StatementError(f"a lambda ({to_sql(expr)}) is only an argument of TRANSFORM, FILTER or REDUCE")
    if isinstance(expr, ast.Call) and expr.name in TABLE_FUNCTIONS:
        raise StatementError(f"{expr.name} is a table function (it makes a row of each item): it is a whole item of "
                             "the SELECT list of a CREATE STREAM ... AS SELECT, an INSERT INTO ... SELECT or a push or pull "
                             "query over a stream, not part of an expression, a condition, an aggregation or a pull over a "
                             f"table: {to_sql(expr)}")
    if isinstance(expr, ast.Subscript):
        container, index = sub(expr.operand), sub(expr.index)
        if container.base == "ARRAY":
            _require(expr.index, index, INTEGRAL, "an array index")
            return container.params[0]  # type: ignore[no-any-return]
        if container.base == "MAP":
            if not comparable(container.params[0], index):
                raise _clash(f"a key of {container} does not fit", (expr.index, index))
            return container.params[1]  # type: ignore[no-any-return]
        raise _clash("[...] needs an ARRAY or a MAP", (expr.operand, container))
    if isinstance(expr, ast.Dereference):
        struct = sub(expr.operand)
        if struct.base != "STRUCT":
            raise _clash("-> needs a STRUCT", (expr.operand, struct))
        for name, type_ in struct.params:
            if name == expr.field:
                return type_  # type: ignore[no-any-return]
        raise NotFoundError(f"{to_sql(expr.operand)} has no field {expr.field}; "
                            f"its fields are {', '.join(n for n, _ in struct.params)}")
    if isinstance(expr, ast.Call):
        return _check_call(expr, scope, aggregates_allowed)
    if isinstance(expr, ast.Binary):
        left, right = sub(expr.left), sub(expr.right)
        if expr.op in ("AND", "OR"):
            for e, t in ((expr.left, left), (expr.right, right)):
                _require(e, t, frozenset({"BOOLEAN"}), expr.op)
            return BOOLEAN
        if expr.op in ("+", "-", "*", "/", "%"):
            for e, t in ((expr.left, left), (expr.right, right)):
                _require(e, t, NUMERIC, f"arithmetic {expr.op}")
            if "DECIMAL" in (left.base, right.base) and "DOUBLE" not in (left.base, right.base):
                return decimal_arithmetic(expr.op, as_decimal(expr.left, left, right), as_decimal(expr.right, right, left))
            widest = common_type([left, right])
            return widest if widest is not None and widest.base != "NULL" else SqlType("INT")
        if expr.op == "LIKE":
            for e, t in ((expr.left, left), (expr.right, right)):
                _require(e, t, frozenset({"VARCHAR"}), "LIKE")
            if (why := likes.refusal(expr.right)) is not None:
                raise StatementError(why)
            return BOOLEAN
        if not comparable(left, right):
            raise _clash(f"cannot compare with {expr.op}", (expr.left, left), (expr.right, right))
        return BOOLEAN
    if isinstance(expr, ast.Unary):
        operand = sub(expr.operand)
        if expr.op == "NOT":
            _require(expr.operand, operand, frozenset({"BOOLEAN"}), "NOT")
            return BOOLEAN
        _require(expr.operand, operand, NUMERIC, "unary -")
        return operand
    if isinstance(expr, ast.IsNull):
        sub(expr.operand)
        return BOOLEAN
    if isinstance(expr, ast.Between):
        value = sub(expr.operand)
        for bound in (expr.low, expr.high):
            bound_type = sub(bound)
            if not comparable(value, bound_type):
                raise _clash("cannot compare in BETWEEN", (expr.operand, value), (bound, bound_type))
        return BOOLEAN
    if isinstance(expr, ast.InList):
        value = sub(expr.operand)
        for item in expr.items:
            item_type = sub(item)
            if not comparable(value, item_type):
                raise _clash("cannot compare in IN", (expr.operand, value), (item, item_type))
        return BOOLEAN
    if isinstance(expr, ast.Cast):
        source = sub(expr.operand)
        for t in (source, expr.type):
            if t.base != "NULL" and t.base not in CASTABLE:
                raise _clash(f"CAST to {expr.type} is not supported", (expr.operand, source))
        return expr.type
    if isinstance(expr, ast.Case):
        for condition, _ in expr.whens:
            _require(condition, sub(condition), frozenset({"BOOLEAN"}), "a WHEN condition")
        branches = [v for _, v in expr.whens] + ([expr.otherwise] if expr.otherwise is not None else [])
        types = [sub(v) for v in branches]
        result = common_type(types)
        if result is None:
            raise _clash("the CASE branches have different types", *zip(branches, types, strict=True))
        return result
    if isinstance(expr, ast.ArrayOf):
        if not expr.items:
            raise StatementError("ARRAY[] needs at least one item: the items give the ARRAY its type")
        return SqlType("ARRAY", (_common(expr, "ARRAY[...]'s items", expr.items, scope),))
    if isinstance(expr, ast.MapOf):
        if not expr.entries:
            raise StatementError("MAP() needs at least one entry: the entries give the MAP its type")
        key = _common(expr, "MAP(...)'s keys", tuple(k for k, _ in expr.entries), scope)
        if key.base not in MAP_KEY_TYPES:
            raise StatementError(f"MAP(...)'s keys must be {', '.join(sorted(MAP_KEY_TYPES))}, not {key}: {to_sql(expr)}")
        return SqlType("MAP", (key, _common(expr, "MAP(...)'s values", tuple(v for _, v in expr.entries), scope)))
    if isinstance(expr, ast.StructOf):
        names = [name for name, _ in expr.fields]
        if not names:
            raise StatementError("STRUCT() needs at least one field: STRUCT(name := value, ...)")
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise StatementError(f"STRUCT(...) names the field {twice} twice: {to_sql(expr)}")
        return SqlType("STRUCT", tuple((name, _common(expr, f"STRUCT(...)'s field {name}", (value,), scope))
                                       for name, value in expr.fields))
    raise StatementError(f"unsupported expression {to_sql(expr)}")


def _common(whole: ast.Expr, what: str, parts: tuple[ast.Expr, ...], scope: Scope) -> SqlType:
    """The type a constructor's ``parts`` widen to (an ARRAY's items, a MAP's keys or values, a
    STRUCT's field), which must be one: not none, not of NULLs alone."""
    types = [check(p, scope) for p in parts]
    result = common_type(types)
    if result is None:
        raise _clash(f"{what} have different types", *zip(parts, types, strict=True))
    if result.base == "NULL":
        raise StatementError(f"{what}: NULL alone has no type; give it one, CAST(NULL AS INT) say, in {to_sql(whole)}")
    return result


TABLE_FUNCTIONS = ("EXPLODE", "CUBE_EXPLODE")
"""ksqlDB's table functions: each makes rows of its ARRAY (``exploded_item``): EXPLODE one of each
item, CUBE_EXPLODE one of each combination of its items (``arrays.cube``)."""


def exploded_item(expr: ast.Expr, scope: Scope) -> SqlType | None:
    """The type of each row's value of a table function (a SELECT item of its own: EXPLODE's
    item, CUBE_EXPLODE's ARRAY), or None for any other expression."""
    if not (isinstance(expr, ast.Call) and expr.name in TABLE_FUNCTIONS):
        return None
    if len(expr.args) != 1 or expr.star:
        raise StatementError(f"{expr.name} takes one ARRAY: {to_sql(expr)}")
    items = check(expr.args[0], scope)
    if items.base != "ARRAY":
        raise _clash(f"{expr.name} needs an ARRAY", (expr.args[0], items))
    return items if expr.name == "CUBE_EXPLODE" else items.params[0]


LAMBDA_FUNCTIONS = ("TRANSFORM", "FILTER", "REDUCE")
"""ksqlDB's functions that take lambdas, their last arguments."""
_LAMBDA_PARAMS = {("TRANSFORM", "ARRAY"): ("x",), ("FILTER", "ARRAY"): ("x",), ("REDUCE", "ARRAY"): ("s", "x"),
                  ("TRANSFORM", "MAP"): ("k", "v"), ("FILTER", "MAP"): ("k", "v"), ("REDUCE", "MAP"): ("s", "k", "v")}
LAMBDA_SHAPES = {("TRANSFORM", "ARRAY"): "TRANSFORM(array, x => ...)",
           ("TRANSFORM", "MAP"): "TRANSFORM(map, (k, v) => key, (k, v) => value)",
           ("FILTER", "ARRAY"): "FILTER(array, x => ...)", ("FILTER", "MAP"): "FILTER(map, (k, v) => ...)",
           ("REDUCE", "ARRAY"): "REDUCE(array, initial state, (s, x) => ...)",
           ("REDUCE", "MAP"): "REDUCE(map, initial state, (s, k, v) => ...)"}


@dataclass(frozen=True)
class LambdaCall:
    """A TRANSFORM, FILTER or REDUCE call, typed."""

    bodies: tuple[Scope, ...]
    """The scope each of its lambdas' bodies is checked in (TRANSFORM of a MAP has two)."""
    result: SqlType
    spark_params: tuple[str, ...]
    """The parameters of its Spark lambdas: one per parameter, or over a MAP's entries (its
    ``map_entries``, TRANSFORM's and REDUCE's) an entry for the two, k and v its fields."""
    state: SqlType | None = None
    """REDUCE's state: its initial value and each step's value are cast to it."""


def lambda_call(call: ast.Call, scope: Scope) -> LambdaCall:
    """Type a call of a ``LAMBDA_FUNCTIONS`` function (``LAMBDA_SHAPES``). REDUCE's state has the
    initial value's type widened to what the lambda gives (0 and a BIGINT sum: BIGINT), as
    Spark's aggregate needs them the same; TRANSFORM of a MAP makes a MAP keyed by one of
    ``MAP_KEY_TYPES``."""
    collection = check(call.args[0], scope) if call.args and not isinstance(call.args[0], ast.Lambda) else None
    base = collection.base if collection is not None and collection.base in ("ARRAY", "MAP") else "ARRAY"
    params, shape = _LAMBDA_PARAMS[call.name, base], LAMBDA_SHAPES[call.name, base]
    lambdas = 2 if (call.name, base) == ("TRANSFORM", "MAP") else 1
    arity = 3 if call.name == "REDUCE" or lambdas == 2 else 2
    fns = [a for a in call.args[-lambdas:] if isinstance(a, ast.Lambda)]
    if len(call.args) != arity or len(fns) != lambdas or any(isinstance(a, ast.Lambda) for a in call.args[:-lambdas]):
        raise StatementError(f"{call.name} takes {arity} arguments, the last {'two' if lambdas == 2 else 'one'} "
                             f"{'lambdas' if lambdas == 2 else 'a lambda'}: {shape}")
    assert collection is not None
    if collection.base not in ("ARRAY", "MAP"):
        raise _clash(f"{call.name} needs an ARRAY or a MAP", (call.args[0], collection))
    for fn in fns:
        if len(fn.params) != len(params):
            raise StatementError(f"{call.name}'s lambda takes {len(params)} parameter(s) here, {shape}; not {to_sql(fn)}")
    items = collection.params
    fn = fns[-1]
    # Spark's names: a name of their own per nesting (a lambda inside sees its own and the outer's).
    entries = collection.base == "MAP" and call.name != "FILTER"
    names = tuple(f"`__lambda{len(scope.variables) + i}`" for i in range(len(params) - entries))
    sparks = (*names[:-1], f"{names[-1]}.key", f"{names[-1]}.value") if entries else names
    if lambdas == 2:
        bodies = tuple(scope.with_variables(f.params, items, sparks) for f in fns)
        key, value = (check(f.body, body) for f, body in zip(fns, bodies, strict=True))
        if key.base not in MAP_KEY_TYPES:
            raise _clash(f"the keys TRANSFORM makes must be {', '.join(sorted(MAP_KEY_TYPES))}", (fns[0].body, key))
        return LambdaCall(bodies, SqlType("MAP", (key, value)), names)
    if call.name != "REDUCE":
        body = scope.with_variables(fn.params, items, sparks)
        result = check(fn.body, body)
        if call.name == "FILTER":
            _require(fn.body, result, frozenset({"BOOLEAN"}), "FILTER's lambda")
            return LambdaCall((body,), collection, names)
        return LambdaCall((body,), SqlType("ARRAY", (result,)), names)
    initial = check(call.args[1], scope)
    if initial.base == "NULL":
        raise StatementError(f"REDUCE's initial state {to_sql(call.args[1])} has no type: CAST it (CAST(NULL AS BIGINT))")
    result = check(fn.body, scope.with_variables(fn.params, (initial, *items), sparks))
    state = common_type([initial, result])
    if state is None or state.base == "NULL":
        raise _clash("REDUCE's lambda gives another type than its state", (call.args[1], initial), (fn.body, result))
    body = scope.with_variables(fn.params, (state, *items), sparks)
    result = check(fn.body, body)
    if result != state and (common_type([state, result]) is None or state.base not in CASTABLE):
        raise _clash(f"REDUCE's lambda gives another type than its state ({state})", (fn.body, result))
    return LambdaCall((body,), state, names, state)


def _check_call(call: ast.Call, scope: Scope, aggregates_allowed: bool) -> SqlType:
    if call.name in LAMBDA_FUNCTIONS:
        return lambda_call(call, scope).result
    agg = aggregates.lookup(call.name)
    if agg is not None:
        if not aggregates_allowed:
            raise StatementError(f"aggregate {call.name} is only allowed in the SELECT list of a GROUP BY query")
        if call.star:
            if call.name != "COUNT":
                raise StatementError(f"{call.name}(*) is not allowed; only COUNT(*) is")
            return agg.result_type(SqlType("BIGINT"))
        if not call.args:
            raise StatementError(f"{call.name} needs a column to aggregate: {call.name}(x)")
        if agg.literals is not None:  # literal arguments after the column
            agg = aggregates.of(agg.name, agg.literals(agg.name, call.args[1:]))
        elif len(call.args) != agg.columns:
            columns = "one argument" if agg.columns == 1 else f"{agg.columns} arguments, each a column or expression"
            raise StatementError(f"{call.name} takes exactly {columns}, got {len(call.args)}")
        arguments = [check(arg, scope) for arg in call.args[:agg.columns]]
        for arg, argument in zip(call.args, arguments, strict=False):
            if not kinds.accepts(agg.param, argument):
                apart = kinds.HELD_APART.get(agg.param)
                note = f" ({kinds.KIND_NOTES[agg.param]})" if agg.param in kinds.KIND_NOTES else ""
                article = "an " if agg.param[0] in "aeiou" else "a "
                needs = f"{article}{agg.param} argument" if agg.columns == 1 else f"{agg.param} arguments"
                what = f"{call.name} needs {needs}{note}" \
                    if apart is None else \
                    f"{call.name} cannot aggregate a {' or '.join(sorted(apart))} value, nor a value holding one"
                raise _clash(what, (arg, argument))
        return agg.result_type(arguments[0])
    fn = functions.lookup(call.name)
    if fn is None:
        known = ", ".join(sorted([*functions.FUNCTIONS, *aggregates.AGGREGATES]))
        raise NotFoundError(f"function {call.name} does not exist; known functions: {known}")
    if call.star:
        raise StatementError(f"{call.name}(*) is not allowed")
    types = [check(a, scope) for a in call.args]
    low = len(fn.params)
    high = None if fn.variadic else low + len(fn.optional)
    if len(types) < low or (high is not None and len(types) > high):
        raise StatementError(f"{call.name} takes {fn.arity()} argument(s), got {len(types)}")
    for index, (arg, type_) in enumerate(zip(call.args, types, strict=True)):
        kind = fn.kind_at(index)
        if kind is not None and not kinds.accepts(kind, type_):
            raise _clash(f"argument {index + 1} of {call.name} must be {kinds.KIND_NOTES.get(kind, kind)}", (arg, type_))
    if fn.refuses is not None and (error := fn.refuses(call.args, types)) is not None:
        raise StatementError(error)
    result = fn.result(types)
    if fn.name == "ROUND" and types[0].base == "DECIMAL":  # its type depends on the places, a literal in Spark
        places = functions.whole_constant(call.args[1]) if len(call.args) > 1 else 0
        if places is not None:
            result = functions.rounded_decimal(types[0], places)
    if result is None:
        raise _clash(f"the arguments of {call.name} have different types", *zip(call.args, types, strict=True))
    return result


def key_typed(type_: SqlType, spark: str) -> tuple[SqlType, str]:
    """A key column computed by an expression of ``type_`` (whose Spark SQL is ``spark``): its
    type and Spark SQL. A DECIMAL's key is a DOUBLE, cast so in Spark: neither key format holds a
    DECIMAL here (KAFKA's Java serializers have none, as in ksqlDB), and a key such as
    ``amount * 1.5`` was a DOUBLE before a literal with a point was a DECIMAL."""
    if type_.base == "DECIMAL":
        return SqlType("DOUBLE"), f"CAST({spark} AS DOUBLE)"
    return type_, spark


def check_condition(expr: ast.Expr, scope: Scope, clause: str) -> None:
    """A WHERE (or similar) clause must be BOOLEAN."""
    type_ = check(expr, scope)
    if type_.base not in ("BOOLEAN", "NULL"):
        raise _clash(f"{clause} must be BOOLEAN", (expr, type_))


WRAP_BITS = {"INT": 32, "BIGINT": 64}
"""The width INT and BIGINT arithmetic wraps at (Spark's, outside ANSI mode)."""
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%"})

T = TypeVar("T")


_WRAPPING_CALLS = frozenset({"ABS", "ROUND", "FLOOR", "CEIL"})
"""Functions whose INT or BIGINT result may not fit its type: ABS of the least value (Spark's
wraps to that value again), ROUND to a negative scale near the greatest or least (Spark's
``toInt`` or ``toLong`` of the rounded decimal wraps), FLOOR and CEIL of a DOUBLE past BIGINT
(Spark's ``(long)`` cast saturates: ``functions.SATURATING``). Their DECIMAL results are
rounded to their type (``Call.decimal``)."""


def with_widths(tree: T, scope: Scope) -> T:
    """``tree`` (an expression, a SELECT item, or a tuple of them), already checked in
    ``scope``, with each INT or BIGINT arithmetic marked with the width its result wraps at
    (``Binary.bits``), so Python's evaluation of it wraps as Spark's does: ``v * 3`` of a BIGINT
    near 2^63 is the same wrapped number at a pull, a push and a persistent query. Likewise each
    arithmetic (or FLOOR, CEIL, ROUND) whose result is a DECIMAL is marked with its precision
    and scale (``Binary.decimal``), each CAST of a DECIMAL to VARCHAR, INT or BIGINT with its
    scale (``Cast.scale``: the digits its text has; an integer takes its whole part's low bits),
    and each INT or BIGINT that a CASE or a GREATEST-like call may pick is
    cast to the DOUBLE or DECIMAL it gives (``_widened``). Subtrees without any of these are
    kept, the very objects (a lookup template finds its key's literal in either)."""
    if isinstance(tree, tuple):
        items = tuple(with_widths(item, scope) for item in tree)
        return tree if all(a is b for a, b in zip(items, tree, strict=True)) else cast(T, items)
    if not is_dataclass(tree) or isinstance(tree, (type, SqlType)):
        return tree
    if isinstance(tree, ast.Call) and tree.name in LAMBDA_FUNCTIONS:
        return cast(T, _lambda_widths(tree, scope))
    changed = {f.name: value for f in fields(tree)
               if (value := with_widths(getattr(tree, f.name), scope)) is not getattr(tree, f.name)}
    if (isinstance(tree, ast.Binary) and tree.op in _ARITHMETIC) or (isinstance(tree, ast.Unary) and tree.op == "-") \
            or (isinstance(tree, ast.Call) and tree.name in _WRAPPING_CALLS):
        typed = check(cast(ast.Expr, tree), scope)
        bits = WRAP_BITS.get(typed.base, 0)
        if bits != tree.bits:
            changed["bits"] = bits
        decimal = typed.params if typed.base == "DECIMAL" else ()  # negating a DECIMAL is exact
        if not isinstance(tree, ast.Unary) and decimal != tree.decimal:
            changed["decimal"] = decimal
    if isinstance(tree, ast.Call) and (fn := functions.lookup(tree.name)) is not None and fn.typed:
        arg_types = tuple(check(a, scope) for a in tree.args)
        if arg_types != tree.arg_types:
            changed["arg_types"] = arg_types
    if isinstance(tree, ast.Cast) and tree.type.base in ("VARCHAR", "INT", "BIGINT"):
        operand = check(tree.operand, scope)
        scale = operand.params[1] if operand.base == "DECIMAL" else -1
        if scale != tree.scale:
            changed["scale"] = scale
    if isinstance(tree, ast.Case) or (isinstance(tree, ast.Call) and tree.name in _COMMON_TYPE_CALLS):
        changed.update(_widened(replace(tree, **changed) if changed else tree, scope))
    if isinstance(tree, ast.ArrayOf | ast.MapOf):
        changed.update(_items_widened(replace(tree, **changed) if changed else tree, scope))
    return cast(T, replace(cast(Any, tree), **changed)) if changed else tree


def _lambda_widths(call: ast.Call, scope: Scope) -> ast.Call:
    """``with_widths`` of a lambda function's call: each lambda's body in its lambda's scope, and
    REDUCE's initial value and lambda's value each cast to its state where they differ."""
    typed = lambda_call(call, scope)
    count = len(typed.bodies)
    args = [with_widths(a, scope) for a in call.args[:-count]]
    fns = [cast(ast.Lambda, f) for f in call.args[-count:]]
    bodies = [with_widths(f.body, body) for f, body in zip(fns, typed.bodies, strict=True)]
    if typed.state is not None:
        if check(args[1], scope) != typed.state:
            args[1] = with_widths(ast.Cast(args[1], typed.state), scope)
        if check(bodies[0], typed.bodies[0]) != typed.state:
            bodies[0] = with_widths(ast.Cast(bodies[0], typed.state), typed.bodies[0])
    if all(a is b for a, b in zip([*args, *bodies], [*call.args[:-count], *(f.body for f in fns)], strict=True)):
        return call
    return replace(call, args=(*args, *(replace(f, body=body) for f, body in zip(fns, bodies, strict=True))))


_COMMON_TYPE_CALLS = frozenset({"GREATEST", "LEAST", "COALESCE", "IFNULL"})
"""Functions whose result is one of their arguments, in the type they all widen to."""


def _items_widened(tree: ast.ArrayOf | ast.MapOf, scope: Scope) -> dict[str, Any]:
    """The items of an ARRAY[...] (the keys and the values of a MAP(...)) each cast to the type
    they widen to where theirs differs, as Spark's analyzer casts them: ARRAY[1, 2.5] is [1.0, 2.5]
    in a pull's row as in Spark's. Empty when none needs it."""
    typed = check(tree, scope)

    def widen(item: ast.Expr, to: SqlType) -> ast.Expr:
        own = check(item, scope)
        return item if own == to or own.base == "NULL" else ast.Cast(item, to)

    if isinstance(tree, ast.ArrayOf):
        items = tuple(widen(i, typed.params[0]) for i in tree.items)
        return {"items": items} if any(a is not b for a, b in zip(items, tree.items, strict=True)) else {}
    entries = tuple((widen(k, typed.params[0]), widen(v, typed.params[1])) for k, v in tree.entries)
    changed = any(a is not b for new, old in zip(entries, tree.entries, strict=True) for a, b in zip(new, old, strict=True))
    return {"entries": entries} if changed else {}


def _widened(tree: ast.Case | ast.Call, scope: Scope) -> dict[str, Any]:
    """The fields of a CASE or a ``_COMMON_TYPE_CALLS`` call whose result is a DOUBLE (or a
    DECIMAL) with each INT or BIGINT result operand cast to it, as Spark's analyzer does: a
    CASE that picks an INT branch, or GREATEST(i, 2.5) that picks ``i``, gives 3.0, not 3 (a
    pull's row would carry an int where its column says DOUBLE). Empty when none needs it."""
    result = check(tree, scope)
    if result.base not in ("DOUBLE", "DECIMAL"):
        return {}

    def widen(operand: ast.Expr) -> ast.Expr:
        return ast.Cast(operand, result) if check(operand, scope).base in kinds.INTEGRAL else operand

    if isinstance(tree, ast.Call):
        args = tuple(widen(a) for a in tree.args)
        return {"args": args} if any(a is not b for a, b in zip(args, tree.args, strict=True)) else {}
    whens = tuple((condition, widen(value)) for condition, value in tree.whens)
    otherwise = widen(tree.otherwise) if tree.otherwise is not None else None
    changed: dict[str, Any] = {}
    if any(a[1] is not b[1] for a, b in zip(whens, tree.whens, strict=True)):
        changed["whens"] = whens
    if otherwise is not tree.otherwise:
        changed["otherwise"] = otherwise
    return changed
