"""The shape of a statement: its text with each string and integer literal taken out.

Two texts of the same shape differ only in the values of those literals, so they parse to
the same tree but for those values: the router answers a key lookup whose shape it has
seen (the same statement asking for another key) without parsing it again. Literals are
found as the grammar's lexer finds them (``millpond.lark``): strings, integers, and what
may hold something like them without being one (quoted names, comments, decimals and
names with digits) kept as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar, cast

from millpond.shared.sql import ast
from millpond.shared.sql.parser import literal_of_token

T = TypeVar("T")
_TOKENS = re.compile(
    r"(?P<kept>--[^\n]*|`[^`]+`|\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_@]*"
    r"|[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)"
    r"|(?P<string>'(?:[^']|'')*')|(?P<integer>[0-9]+)")
"""Kept tokens first (a comment or quoted name may hold a quote; a name or decimal holds
digits), then the two literals that vary. No two alternatives match the same text the
same way, so a match fails in linear time."""

@dataclass(frozen=True)
class Shape:
    """A text as its literals and the text around them, in the order they are written."""

    between: tuple[str, ...]
    """The text before each literal, and after the last (one more than ``literals``)."""
    literals: tuple[str, ...]
    """The literals as written: ``'...'`` strings and integers."""

    @property
    def key(self) -> tuple[tuple[str, ...], str]:
        """Equal for two texts exactly when they differ only in their literals' values
        (``s`` for a string and ``i`` for an integer at each place)."""
        return self.between, "".join("s" if literal.startswith("'") else "i" for literal in self.literals)

    def value(self, index: int) -> ast.Literal:
        """Literal ``index`` as the parser reads it."""
        return literal_of_token(self.literals[index])

    def text(self, literals: tuple[str, ...] | None = None) -> str:
        """The text, or the text with ``literals`` (as written) in place of its own."""
        literals = self.literals if literals is None else literals
        assert len(literals) == len(self.literals)
        return "".join(part for pair in zip(self.between, literals, strict=False) for part in pair) + self.between[-1]


def shape_of(text: str) -> Shape:
    """The shape of ``text``: one pass of a regular expression."""
    between: list[str] = []
    literals: list[str] = []
    end = 0
    for match in _TOKENS.finditer(text):
        if match.lastgroup == "kept":
            continue
        between.append(text[end:match.start()])
        literals.append(match.group())
        end = match.end()
    between.append(text[end:])
    return Shape(tuple(between), tuple(literals))


def replace_node(tree: T, old: ast.Expr, new: ast.Expr) -> T:
    """``tree`` with the node ``old`` (that very object) replaced by ``new``; subtrees that do
    not hold it are shared, not copied."""
    if tree is old:
        return cast(T, new)
    if isinstance(tree, tuple):
        items = tuple(replace_node(item, old, new) for item in tree)
        return tree if all(a is b for a, b in zip(items, tree, strict=True)) else cast(T, items)
    fields = getattr(tree, "__dataclass_fields__", None)
    if fields is None:
        return tree
    changed = {name: value for name in fields
               if (value := replace_node(getattr(tree, name), old, new)) is not getattr(tree, name)}
    if not changed:
        return tree
    copy = object.__new__(type(tree))
    for name in fields:
        object.__setattr__(copy, name, changed.get(name, getattr(tree, name)))
    return copy
