"""Parse SQL text into ``millpond.shared.sql.ast`` nodes with the grammar in ``millpond.lark``.

Unquoted identifiers are upper-cased (ksqlDB's rule); quoted ones keep their case.
Syntax errors become ``StatementError`` with the line, the column and what was expected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.kinds import MAX_DECIMAL_DIGITS
from millpond.shared.sql.times import UNIT_FIRST


@cache
def _parser() -> Lark:
    grammar = resources.files("millpond.shared.sql").joinpath("millpond.lark").read_text()
    return Lark(grammar, start="script", parser="lalr", propagate_positions=True)


def _whole(token: Token) -> int:
    """A whole number's digits as an int; more digits than any BIGINT has is the statement's
    error (Python refuses over 4,300 of them, with an error of its own)."""
    text = str(token)
    if len(text.lstrip("0")) > 19:
        raise StatementError(f"the number {text[:20]}... has more digits than a BIGINT holds (at most {2**63 - 1})",
                             line=token.line, column=token.column)
    return int(text)


def _identifier(token: Token | str) -> str:
    text = str(token)
    if text[:1] in "`\"" and text[-1:] == text[:1]:
        return text[1:-1]
    return text.upper()


def _lambda(params: tuple[str, ...], body: ast.Expr) -> ast.Lambda:
    """The lambda, its parameters in its body made ``LambdaVar``s (a lambda inside it that
    names the same parameter has made its own already: its body sees its own)."""
    twice = next((p for i, p in enumerate(params) if p in params[:i]), None)
    if twice is not None:
        raise StatementError(f"the lambda ({', '.join(params)}) => ... names {twice} twice; give each parameter its own name")

    def bind(node: ast.Expr) -> ast.Expr | None:
        if isinstance(node, ast.ColumnRef) and node.qualifier is None and node.name in params:
            return ast.LambdaVar(node.name)
        return None
    return ast.Lambda(params, ast.replace_nodes(body, bind))


def _unquote(token: Token | str) -> str:
    return str(token)[1:-1].replace("''", "'")


_VARCHAR = ast.SqlType("VARCHAR")
_TYPE_ALIASES = {"STRING": "VARCHAR", "INTEGER": "INT"}


_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}


def _window(kind: str, size: int, advance: int | None, options: tuple[tuple[str, int], ...]) -> ast.Window:
    given: dict[str, int] = {}
    for name, ms in options:
        if name in given:
            raise StatementError(f"WINDOW {kind} gives {name.removesuffix('_ms').upper()} twice; give it once")
        given[name] = ms
    return ast.Window(kind, size, advance, **given)


_JOIN_WORDS = frozenset({"OUTER", "INNER", "LEFT", "RIGHT", "FULL", "JOIN", "ON", "WITHIN"})
"""Words an unquoted alias may not be: ``FROM a OUTER JOIN b`` is a mistake, not the alias OUTER."""


@v_args(inline=True)
class _ToAst(Transformer[Token, Any]):
    """Turns Lark's parse tree into AST nodes (statement texts are filled in later)."""

    # ---- names, literals and types
    def name(self, token: Token) -> str:
        return _identifier(token)

    def IDENTIFIER(self, token: Token) -> str:
        return _identifier(token)

    def QUOTED_IDENTIFIER(self, token: Token) -> str:
        return _identifier(token)

    def string(self, token: Token) -> ast.Literal:
        return ast.Literal(_unquote(token), _VARCHAR)

    def integer(self, token: Token) -> ast.Literal:
        value = _whole(token)
        if value > 2**63:  # 2^63 itself only negated: BIGINT's least
            raise StatementError(f"the integer {token} is out of BIGINT's range (at most {2**63 - 1})",
                                 line=token.line, column=token.column)
        return ast.Literal(value, ast.SqlType("INT" if value < 2**31 else "BIGINT"))

    def number(self, token: Token) -> ast.Literal:
        """A number with an exponent is a DOUBLE; one with a point and none a DECIMAL of its digits
        (``1.50`` is DECIMAL(3, 2), ``0.001`` DECIMAL(3, 3)), as Spark and ksqlDB read it. Either
        is a float in Python, as a table's stores keep a DECIMAL."""
        value = float(token)
        if not math.isfinite(value):
            raise StatementError(f"the number {token} is out of DOUBLE's range", line=token.line, column=token.column)
        if "e" in token.lower():
            return ast.Literal(value, ast.SqlType("DOUBLE"))
        _, digits, exponent = Decimal(str(token)).as_tuple()
        assert isinstance(exponent, int)
        scale = max(-exponent, 0)
        precision = max(len(digits), scale)
        if precision > MAX_DECIMAL_DIGITS:
            raise StatementError(f"the number {token} has {precision} digits; a DECIMAL holds at most {MAX_DECIMAL_DIGITS} "
                                 f"(write it with an exponent, {value:.17g}, for a DOUBLE)".replace("e+", "E"),
                                 line=token.line, column=token.column)
        return ast.Literal(value, ast.SqlType("DECIMAL", (precision, scale)))

    def true(self, _: Token) -> ast.Literal:
        return ast.Literal(True, ast.SqlType("BOOLEAN"))

    def false(self, _: Token) -> ast.Literal:
        return ast.Literal(False, ast.SqlType("BOOLEAN"))

    def null(self, _: Token) -> ast.Literal:
        return ast.Literal(None, ast.SqlType("NULL"))

    def simple_type(self, token: Token) -> ast.SqlType:
        base = str(token).upper()
        return ast.SqlType(_TYPE_ALIASES.get(base, base))

    def type(self, inner: ast.SqlType) -> ast.SqlType:
        return inner

    def decimal_type(self, precision: Token, scale: Token) -> ast.SqlType:
        return ast.SqlType("DECIMAL", (_whole(precision), _whole(scale)))

    def array_type(self, element: ast.SqlType) -> ast.SqlType:
        return ast.SqlType("ARRAY", (element,))

    def map_type(self, key: ast.SqlType, value: ast.SqlType) -> ast.SqlType:
        return ast.SqlType("MAP", (key, value))

    def struct_field(self, name: str, type_: ast.SqlType) -> tuple[str, ast.SqlType]:
        return (name, type_)

    def struct_type(self, *fields: tuple[str, ast.SqlType]) -> ast.SqlType:
        return ast.SqlType("STRUCT", tuple(fields))

    def custom_type(self, name: str) -> ast.SqlType:
        return ast.SqlType(name)  # the metastore's type of that name replaces it (custom_types.resolved)

    # ---- expressions
    def column(self, name: str) -> ast.ColumnRef:
        return ast.ColumnRef(name)

    def qualified_column(self, qualifier: str, name: str) -> ast.ColumnRef:
        return ast.ColumnRef(name, qualifier)

    def subscript(self, operand: ast.Expr, index: ast.Expr) -> ast.Subscript:
        return ast.Subscript(operand, index)

    def dereference(self, operand: ast.Expr, field: str) -> ast.Dereference:
        return ast.Dereference(operand, field)

    def call0(self, name: str) -> ast.Call:
        return ast.Call(name)

    def call_star(self, name: str) -> ast.Call:
        return ast.Call(name, star=True)

    def call(self, name: str, *args: ast.Expr) -> ast.Call:
        if name in UNIT_FIRST and args and isinstance(args[0], ast.ColumnRef) and args[0].qualifier is None:
            # ksqlDB's TIMESTAMPADD(MINUTES, 5, ts): the unit is a word, not a column
            args = (ast.Literal(args[0].name, ast.SqlType("VARCHAR")), *args[1:])
        return ast.Call(name, tuple(args))

    def lambda1(self, param: str, body: ast.Expr) -> ast.Lambda:
        return _lambda((param,), body)

    def lambdan(self, *parts: Any) -> ast.Lambda:
        *params, body = parts
        return _lambda(tuple(params), body)

    def array_of(self, _open: Token, *items: ast.Expr) -> ast.ArrayOf:
        return ast.ArrayOf(tuple(items))

    def map_entry(self, key: ast.Expr, value: ast.Expr) -> tuple[ast.Expr, ast.Expr]:
        return (key, value)

    def map_of(self, _open: Token, *entries: tuple[ast.Expr, ast.Expr]) -> ast.MapOf:
        return ast.MapOf(tuple(entries))

    def struct_entry(self, name: str, value: ast.Expr) -> tuple[str, ast.Expr]:
        return (name, value)

    def struct_of(self, _open: Token, *fields: tuple[str, ast.Expr]) -> ast.StructOf:
        return ast.StructOf(tuple(fields))

    def cast(self, operand: ast.Expr, type_: ast.SqlType) -> ast.Cast:
        return ast.Cast(operand, type_)

    def when(self, cond: ast.Expr, value: ast.Expr) -> tuple[ast.Expr, ast.Expr]:
        return (cond, value)

    def else_(self, value: ast.Expr) -> ast.Expr:
        return value

    def case(self, *parts: Any) -> ast.Case:
        whens = tuple(p for p in parts if isinstance(p, tuple))
        otherwise = parts[-1] if parts and not isinstance(parts[-1], tuple) else None
        return ast.Case(whens, otherwise)

    def comp_op(self, token: Token) -> str:
        return "!=" if str(token) == "<>" else str(token)

    def compare(self, left: ast.Expr, op: str, right: ast.Expr) -> ast.Binary:
        return ast.Binary(op, left, right)

    def or_(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("OR", left, right)

    def and_(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("AND", left, right)

    def not_(self, operand: ast.Expr) -> ast.Unary:
        return ast.Unary("NOT", operand)

    def neg(self, operand: ast.Expr) -> ast.Expr:
        if isinstance(operand, ast.Literal) and isinstance(operand.value, int | float):
            if operand.type.base in ("INT", "BIGINT"):  # as Spark types the integer it reads: -2147483648 is an INT
                return ast.Literal(-operand.value, ast.SqlType("INT" if -(2**31) <= -operand.value < 2**31 else "BIGINT"))
            return ast.Literal(-operand.value, operand.type)
        return ast.Unary("-", operand)

    def is_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand)

    def is_not_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand, negated=True)

    def between(self, operand: ast.Expr, low: ast.Expr, high: ast.Expr) -> ast.Between:
        return ast.Between(operand, low, high)

    def not_between(self, operand: ast.Expr, low: ast.Expr, high: ast.Expr) -> ast.Between:
        return ast.Between(operand, low, high, negated=True)

    def like(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("LIKE", left, right)

    def not_like(self, left: ast.Expr, right: ast.Expr) -> ast.Unary:
        return ast.Unary("NOT", ast.Binary("LIKE", left, right))

    def in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, tuple(items))

    def not_in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, tuple(items), negated=True)

    def add(self, a: ast.Expr, b: ast.Expr) -> ast.Binary:
        return ast.Binary("+", a, b)

    def sub(self, a: ast.Expr, b: ast.Expr) -> ast.Binary:
        return ast.Binary("-", a, b)

    def mul(self, a: ast.Expr, b: ast.Expr) -> ast.Binary:
        return ast.Binary("*", a, b)

    def div(self, a: ast.Expr, b: ast.Expr) -> ast.Binary:
        return ast.Binary("/", a, b)

    def mod(self, a: ast.Expr, b: ast.Expr) -> ast.Binary:
        return ast.Binary("%", a, b)

    def concat_op(self, a: ast.Expr, b: ast.Expr) -> ast.Call:
        return ast.Call("CONCAT", (a, b))

    # ---- clauses
    def or_replace(self, *tokens: Token) -> bool:
        return bool(tokens)

    if_not_exists = if_exists = delete_topic = or_replace

    def extended(self, *tokens: Token) -> bool:
        return bool(tokens)

    def source_kind(self, token: Token) -> str:
        return str(token).upper()

    def key_kind(self, _: Token) -> bool:
        return True

    def column_def(self, name: str, type_: ast.SqlType, key: bool = False) -> ast.ColumnDef:
        return ast.ColumnDef(name, type_, key)

    def property(self, name: str, _eq: Token, value: ast.Literal) -> tuple[str, Any]:
        return (name, value.value)

    def with_clause(self, *props: tuple[str, Any]) -> dict[str, Any]:
        return dict(props)

    def column_list(self, *names: str) -> tuple[str, ...]:
        return tuple(names)

    def select_star(self) -> ast.SelectItem:
        return ast.SelectItem(None)

    def select_expr(self, expr: ast.Expr, alias: str | None = None) -> ast.SelectItem:
        return ast.SelectItem(expr, alias)

    def select_items(self, *items: ast.SelectItem) -> tuple[ast.SelectItem, ...]:
        return tuple(items)

    def where(self, expr: ast.Expr) -> tuple[str, Any]:
        return ("where", expr)

    def group_by(self, *exprs: ast.Expr) -> tuple[str, Any]:
        return ("group_by", tuple(exprs))

    def having(self, expr: ast.Expr) -> tuple[str, Any]:
        return ("having", expr)

    def partition_by(self, expr: ast.Expr) -> tuple[str, Any]:
        return ("partition_by", expr)

    def emit(self, what: Token) -> tuple[str, Any]:
        return ("emit_final", True) if str(what).upper() == "FINAL" else ("emit_changes", True)

    def duration(self, count: Token, unit: Token) -> int:
        name = str(unit).upper().rstrip("S")
        return _whole(count) * _UNIT_MS[name]

    def tumbling(self, size: int, *options: tuple[str, int]) -> tuple[str, Any]:
        return ("window", _window("TUMBLING", size, None, options))

    def hopping(self, size: int, advance: int, *options: tuple[str, int]) -> tuple[str, Any]:
        return ("window", _window("HOPPING", size, advance, options))

    def session(self, gap: int, *options: tuple[str, int]) -> tuple[str, Any]:
        return ("window", _window("SESSION", gap, None, options))

    def retention(self, ms: int) -> tuple[str, int]:
        return ("retention_ms", ms)

    def grace(self, ms: int) -> tuple[str, int]:
        return ("grace_ms", ms)

    def window(self, spec: tuple[str, Any]) -> tuple[str, Any]:
        return spec

    def alias(self, name: str) -> tuple[str, Any]:
        if name in _JOIN_WORDS:
            raise StatementError(f"{name} is a reserved word of joins, not an alias: write "
                                 "[INNER | LEFT [OUTER] | RIGHT [OUTER] | FULL [OUTER]] JOIN")
        return ("alias", name)

    def join_type(self, kind: Token | None = None) -> str:
        return "INNER" if kind is None else str(kind).split()[0].upper()

    def join_grace(self, ms: int) -> tuple[str, int]:
        return ("grace_ms", ms)

    def within(self, *parts: Any) -> ast.Within:
        grace = parts[-1][1] if parts and isinstance(parts[-1], tuple) else None
        spans = [p for p in parts if isinstance(p, int)]
        before, after = (spans[0], spans[0]) if len(spans) == 1 else spans
        return ast.Within(before, after, grace)

    def join(self, kind: str, source: str, *rest: Any) -> tuple[str, Any]:
        alias = next((r[1] for r in rest if isinstance(r, tuple) and r[0] == "alias"), None)
        within = next((r for r in rest if isinstance(r, ast.Within)), None)
        return ("join", ast.Join(kind, source, rest[-1], alias, within))

    def limit(self, token: Token) -> tuple[str, Any]:
        return ("limit", _whole(token))

    # ---- statements
    def query(self, items: tuple[ast.SelectItem, ...], source: str, *clauses: tuple[str, Any]) -> ast.Query:
        joins = tuple(value for name, value in clauses if name == "join")
        return ast.Query(items=items, source=source, joins=joins, **{n: v for n, v in clauses if n != "join"})

    def create_source(self, or_replace: bool, kind: str, if_not_exists: bool, name: str, *rest: Any) -> ast.CreateSource:
        props = rest[-1] if rest and isinstance(rest[-1], dict) else {}
        columns = tuple(c for c in rest if isinstance(c, ast.ColumnDef))
        return ast.CreateSource(kind=kind, name=name, columns=columns, properties=_lower_keys(props),
                                or_replace=or_replace, if_not_exists=if_not_exists)

    def create_read_only(self, *args: Any) -> ast.CreateSource:
        """``CREATE SOURCE STREAM|TABLE``: read-only (ksqlDB's)."""
        return replace(self.create_source(*args), read_only=True)

    def create_as_select(self, or_replace: bool, kind: str, if_not_exists: bool, name: str, *rest: Any) -> ast.CreateAsSelect:
        props = rest[0] if len(rest) == 2 else {}
        return ast.CreateAsSelect(kind=kind, name=name, properties=_lower_keys(props), query=rest[-1],
                                  or_replace=or_replace, if_not_exists=if_not_exists)

    def insert_values(self, target: str, *rest: Any) -> ast.InsertValues:
        columns = rest[0] if rest and isinstance(rest[0], tuple) else None
        values = rest[1:] if columns is not None else rest
        return ast.InsertValues(target=target, columns=columns, values=tuple(values))

    def insert_select(self, target: str, query: ast.Query) -> ast.InsertSelect:
        return ast.InsertSelect(target=target, query=query)

    def show(self, internal: bool, token: Token, extended: bool) -> ast.Show:
        what = str(token).upper()
        if internal and what != "TOPICS":
            raise StatementError(f"ALL applies to TOPICS (SHOW ALL TOPICS lists the internal ones too), not to {what}")
        if extended and what not in EXTENDED_SHOWS:
            raise StatementError(f"EXTENDED applies to {', '.join(EXTENDED_SHOWS)}, not to {what}")
        return ast.Show(what=what, extended=extended, internal=internal)

    def show_all(self, *tokens: Token) -> bool:
        return bool(tokens)

    def describe_sources(self, what: Token, extended: bool) -> ast.Show:
        return ast.Show(what=str(what).split()[-1].upper(), extended=True)

    def print_topic(self, topic: Token, from_beginning: bool, *clauses: tuple[str, Any]) -> ast.PrintTopic:
        options = dict(clauses)
        if options.get("interval", 1) < 1:
            raise StatementError(f"PRINT's INTERVAL must be 1 or more (every n-th record), not {options['interval']}")
        quoted = topic.type == "STRING"
        return ast.PrintTopic(topic=_unquote(topic) if quoted else str(topic), exact=quoted, from_beginning=from_beginning,
                              interval=options.get("interval", 1), limit=options.get("limit"))

    def from_beginning(self, token: Token | None = None) -> bool:
        return token is not None

    def print_interval(self, token: Token) -> tuple[str, Any]:
        return ("interval", _whole(token))

    def describe_function(self, _keywords: Token, name: str) -> ast.DescribeFunction:
        return ast.DescribeFunction(name=name)

    def describe(self, extended: bool, name: str) -> ast.Describe:
        return ast.Describe(name=name, extended=extended)

    def add_column(self, name: str, type_: ast.SqlType) -> ast.ColumnDef:
        return ast.ColumnDef(name, type_)

    def alter_source(self, kind: str, name: str, *columns: ast.ColumnDef) -> ast.AlterSource:
        return ast.AlterSource(kind=kind, name=name, columns=tuple(columns))

    def create_type(self, if_not_exists: bool, name: str, type_: ast.SqlType) -> ast.CreateType:
        return ast.CreateType(name=name, type=type_, if_not_exists=if_not_exists)

    def drop_type(self, if_exists: bool, name: str) -> ast.DropType:
        return ast.DropType(name=name, if_exists=if_exists)

    def drop(self, kind: str, if_exists: bool, name: str, delete_topic: bool) -> ast.Drop:
        return ast.Drop(kind=kind, name=name, if_exists=if_exists, delete_topic=delete_topic)

    def terminate(self, target: Token | str) -> ast.Terminate:
        is_all = isinstance(target, Token) and target.type == "ALL"
        return ast.Terminate(query_id=None if is_all else str(target))

    def explain(self, target: str | ast.Statement) -> ast.Explain:
        if isinstance(target, ast.Statement):
            return ast.Explain(statement=target)
        return ast.Explain(query_id=target)

    def set_prop(self, name: Token, _eq: Token, value: Token) -> ast.SetProperty:
        return ast.SetProperty(name=_unquote(name), value=_unquote(value))

    def unset_prop(self, name: Token) -> ast.UnsetProperty:
        return ast.UnsetProperty(name=_unquote(name))


EXTENDED_SHOWS = ("STREAMS", "TABLES", "QUERIES")
"""What ``SHOW ... EXTENDED`` lists with more columns."""


def _lower_keys(props: dict[str, Any]) -> dict[str, Any]:
    return {k.lower(): v for k, v in props.items()}


def _describe_expected(expected: set[str]) -> str:
    parser = _parser()
    names = []
    for terminal in sorted(expected):
        try:
            pattern = parser.get_terminal(terminal).pattern
            names.append(pattern.value if pattern.type == "str" else terminal)
        except KeyError:
            names.append(terminal)
    return ", ".join(sorted(set(names))[:15])


def _syntax_error(err: UnexpectedInput, text: str) -> StatementError:
    line, column = err.line, err.column
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken) and err.token.type == "$END"):
        expected = _describe_expected(set(getattr(err, "expected", ())))
        lines = text.splitlines() or [""]
        return StatementError(f"statement ends early; expected one of: {expected}",
                              line=len(lines), column=len(lines[-1]) + 1)
    if isinstance(err, UnexpectedToken):
        expected = _describe_expected(set(err.expected))
        return StatementError(f"unexpected {str(err.token)!r}; expected one of: {expected}",
                              line=line, column=column)
    if isinstance(err, UnexpectedCharacters):
        return StatementError(f"unexpected character {text[err.pos_in_stream or 0]!r}",
                              line=line, column=column)
    return StatementError(str(err), line=line, column=column)


class ParseTimeoutError(StatementError):
    """Parsing ran past its deadline (the caller names the budget in what it tells the client)."""


def _parse_tree(text: str, deadline: float | None) -> Tree[Token]:
    if deadline is None:
        return _parser().parse(text)
    # The same loop as Lark's own parse, with the clock read between tokens, so a statement
    # that takes too long stops where it is instead of holding a thread to the end.
    interactive = _parser().parse_interactive(text)
    token = None
    for token in interactive.iter_parse():
        if time.monotonic() > deadline:
            raise ParseTimeoutError("parsing ran out of time", line=token.line, column=token.column)
    end = Token.new_borrow_pos("$END", "", token) if token is not None else Token("$END", "", 0, 1, 1)
    tree: Tree[Token] = interactive.feed_token(end)
    return tree


def parse_script(text: str, *, deadline: float | None = None) -> list[ast.Statement]:
    """Parse ``;``-separated statements; each keeps its own text.

    ``deadline`` (a ``time.monotonic()`` instant): stop with ``ParseTimeoutError`` once it passes.
    """
    if deadline is not None and time.monotonic() > deadline:
        raise ParseTimeoutError("parsing ran out of time before it started")
    try:
        tree = _parse_tree(text, deadline)
    except UnexpectedInput as err:
        raise _syntax_error(err, text) from None
    statements: list[ast.Statement] = []
    for child in tree.children:
        if not isinstance(child, Tree):
            continue
        _check_depth(child)
        try:
            node = _ToAst().transform(child)
        except VisitError as err:  # a rule's own check (a WINDOW option given twice): its message
            if isinstance(err.orig_exc, StatementError):
                raise err.orig_exc from None
            raise
        snippet = text[child.meta.start_pos:child.meta.end_pos].strip()
        if isinstance(node, ast.CreateSource | ast.AlterSource):
            node = replace(node, spellings=_spellings(child))
        if named := _custom_types(child):
            node = replace(node, custom_types=named)
        if isinstance(node, ast.Explain) and node.statement is not None:
            _with_text(node.statement, snippet.split(None, 1)[1])
        statements.append(_with_text(node, snippet))
    return statements


def _custom_types(tree: Tree[Token]) -> tuple[str, ...]:
    """The names of the custom types a statement's tree names, in order, each once."""
    names = (node.children[0] for node in tree.iter_subtrees() if node.data == "custom_type")
    return tuple(dict.fromkeys(_identifier(n) for n in names if isinstance(n, Token)))


def _spellings(tree: Tree[Token]) -> tuple[tuple[str, str], ...]:
    """``ast.CreateSource.spellings`` of a CREATE statement's tree (names in the order written)."""
    names = [node.children[0] for node in tree.iter_subtrees() if node.data in ("column_def", "add_column", "struct_field")]
    written: dict[str, str] = {}
    for token in sorted((n for n in names if isinstance(n, Token) and n.type == "IDENTIFIER"), key=lambda n: n.start_pos or 0):
        written.setdefault(_identifier(token), str(token))
    return tuple((name, text) for name, text in written.items() if text != name)


MAX_DEPTH = 200


def _check_depth(tree: Tree[Token]) -> None:
    """Refuse trees nested deeper than the recursive passes over them can walk."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            line, column = (node.meta.line, node.meta.column) if not node.meta.empty else (None, None)
            raise StatementError(f"the statement nests more than {MAX_DEPTH} levels deep; simplify the expression",
                                 line=line, column=column)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))


def literal_of_token(token: str) -> ast.Literal:
    """A string (``'...'``) or integer literal as written, read as the parser reads it."""
    reader = _LITERALS
    return reader.string(Token("STRING", token)) if token.startswith("'") else reader.integer(Token("INT", token))


_LITERALS = _ToAst()
"""Reads single literal tokens (it keeps no state between calls)."""


def parse_statement(text: str) -> ast.Statement:
    """Parse exactly one statement (a trailing ``;`` is allowed)."""
    return only_statement(parse_script(text))


def statement_query(statement: str, types: Mapping[str, ast.SqlType] | None = None) -> ast.Query:
    """The SELECT of a persistent query's statement (CREATE ... AS SELECT, INSERT INTO ... SELECT),
    with the custom types it names as ``types`` defines them (``PersistentQuery.types``)."""
    query = getattr(custom_types.resolved(parse_statement(statement), types or {}), "query", None)
    if not isinstance(query, ast.Query):
        raise StatementError(f"not a persistent query's statement: {statement!r}")
    return query


def only_statement(statements: Sequence[ast.Statement]) -> ast.Statement:
    """The one statement of a text that must hold exactly one."""
    if len(statements) != 1:
        raise StatementError(f"expected exactly one statement, found {len(statements)}")
    return statements[0]


def _with_text(node: ast.Statement, text: str) -> ast.Statement:
    object.__setattr__(node, "text", text)
    return node
