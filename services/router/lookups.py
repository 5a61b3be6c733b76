"""The key-lookup fast path: a pull query of a shape seen before, asking for another key.

Clients ask for one key after another with the same statement; each new key is a new text,
which the parse cache has never seen, so it would be parsed by Lark and planned again
(about a millisecond of the router's one core). Here a lookup's parse and plan are kept as
a template per shape (the text with its string and integer literals taken out, see
``millpond.shared.sql.shapes``); a text of that shape whose literals differ only in the
key's is answered with the template's statement and plan for the new key, after one pass
of a regular expression.

A template is kept only when its key literal is proven to be one literal of the shape: the
text with that literal changed is parsed once and must give the template's statement with
that one value changed (a folded ``-5`` or a value written twice is not a template).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TypeVar

from millpond.services.router.pull import PullPlan, row_as_is
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import serialize_key
from millpond.shared.sql import ast
from millpond.shared.sql.guard import StatementParser
from millpond.shared.sql.planner import key_equality, key_literal
from millpond.shared.sql.shapes import Shape, replace_node, shape_of

K = TypeVar("K")
V = TypeVar("V")
MAX_TEMPLATES = 1024
MAX_TEXT_CHARS = 4096
"""Longer statements are not kept as templates (a key lookup is short)."""
MAX_INSTANCE_CHARS = 512
"""Longer texts are not kept made (``LookupTemplates._instances``): at most ``MAX_TEMPLATES``
short texts with their statements, a few megabytes."""
_PROBES = ("'millpond-probe-7f3a'", "7919", "'millpond-probe-c41e'", "7927")
"""Values to prove a template with, two per kind of literal (one may be the learned key)."""


@dataclass(frozen=True)
class LookupTemplate:
    """A key lookup's statement and plan, with the place of its key among the literals."""

    shape: Shape
    key_index: int
    """The key's literal, by its index in ``shape.literals``."""
    query: ast.Query
    key: ast.Literal
    """The node in ``query.where`` the key's literal became."""
    plan: PullPlan
    command_offset: int
    """The metastore version the plan holds for."""

    def instance(self, shape: Shape, text: str) -> tuple[ast.Query, PullPlan] | None:
        """The statement and plan of ``text``, of this template's shape; None when its key is
        one no row has (5.5 for an INT key): not a lookup, its plan a scan."""
        literal = shape.value(self.key_index)
        key_col = self.plan.table.key_column
        assert key_col is not None
        key = key_literal(literal.value, key_col)
        if key is None:
            return None
        where = replace_node(self.query.where, self.key, literal)
        query = replace(self.query, where=where, text=text)
        key_bytes = serialize_key(key, key_col.type)
        # The plan's WHERE is the statement's typed (``with_widths``), the key's literal the same node.
        return query, replace(self.plan, key=key, key_bytes=key_bytes, where=replace_node(self.plan.where, self.key, literal),
                              partition=partition_for(key_bytes, self.plan.table.partitions),
                              row_as_is=row_as_is(self.plan.table, self.plan.items, where, key))


@dataclass(frozen=True)
class _Instance:
    """A request text made of a template: its statement and plan, for a metastore version."""

    command_offset: int
    shape: tuple[tuple[str, ...], str]
    """The template's shape (``Shape.key``)."""
    query: ast.Query
    plan: PullPlan


def _put(entries: OrderedDict[K, V], key: K, value: V, size: int) -> None:
    """``entries[key] = value`` as the most recent, dropping the least recent beyond ``size``."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > size:
        entries.popitem(last=False)


def single_statement(text: str) -> str:
    """A request's text as the parser names its one statement (trimmed, no final ``;``)."""
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(";") else text


class LookupTemplates:
    """Templates of the key lookups seen, by shape, the least recently used dropped first."""

    def __init__(self, parser: StatementParser, size: int = MAX_TEMPLATES):
        self.parser = parser
        self.size = size
        self._templates: OrderedDict[tuple[tuple[str, ...], str], LookupTemplate] = OrderedDict()
        self._refused: OrderedDict[tuple[tuple[str, ...], str], int] = OrderedDict()
        """Shapes whose probe failed, with the metastore version (so none is probed twice)."""
        self._instances: OrderedDict[str, _Instance] = OrderedDict()
        """The statements and plans made of templates lately, by request text (``match``): a
        key asked again is not taken apart and put together again. None kept when the parser
        keeps no parses (``parse_cache_bytes`` 0)."""

    def __len__(self) -> int:
        return len(self._templates)

    def match(self, text: str, command_offset: int) -> tuple[ast.Query, PullPlan] | None:
        """The statement and plan of a request ``text`` that is a key lookup of a known shape
        (the metastore unchanged since), or None: parse it."""
        if len(text) > MAX_TEXT_CHARS:
            return None
        made = self._instances.get(text)
        if made is not None:
            if made.command_offset == command_offset and made.shape in self._templates:
                self._instances.move_to_end(text)
                self._templates.move_to_end(made.shape)  # the shape is in use: keep its template
                return made.query, made.plan
            del self._instances[text]  # made for another metastore version, or of a dropped template
        request, text = text, single_statement(text)
        shape = shape_of(text)
        template = self._templates.get(shape.key)
        if template is None or template.command_offset != command_offset or not all(
                a == b for i, (a, b) in enumerate(zip(shape.literals, template.shape.literals, strict=True))
                if i != template.key_index):
            return None
        made_now = template.instance(shape, text)
        if made_now is None:
            return None
        self._templates.move_to_end(shape.key)
        query, plan = made_now
        if len(request) <= MAX_INSTANCE_CHARS and self.parser.cache is not None:
            _put(self._instances, request, _Instance(command_offset, shape.key, query, plan), self.size)
        return query, plan

    async def learn(self, query: ast.Query, plan: PullPlan, command_offset: int) -> None:
        """Keep ``query`` (parsed and planned as ``plan``) as the template of its shape, if it
        is a key lookup whose key is one literal of its text."""
        keys = plan.table.key_columns
        if plan.partition is None or len(keys) != 1 or len(query.text) > MAX_TEXT_CHARS:
            return  # (a key of several columns has several literals: not a template of one)
        key = key_equality(query.where, keys[0].name)
        shape = shape_of(query.text)
        known = self._templates.get(shape.key)
        if key is None or (known is not None and known.command_offset == command_offset) \
                or self._refused.get(shape.key) == command_offset:
            return
        places = [i for i in range(len(shape.literals)) if shape.value(i) == key]
        if len(places) != 1:
            return
        template = LookupTemplate(shape, places[0], query, key, plan, command_offset)
        if await self._proven(template):
            _put(self._templates, shape.key, template, self.size)
        else:
            _put(self._refused, shape.key, command_offset, self.size)

    async def _proven(self, template: LookupTemplate) -> bool:
        """Whether the template's text with a probe value for its key parses to the
        template's statement with the probe's value for the key."""
        literals = list(template.shape.literals)
        string = literals[template.key_index].startswith("'")
        probe = next(p for p in _PROBES if p.startswith("'") == string and p != literals[template.key_index])
        literals[template.key_index] = probe
        text = template.shape.text(tuple(literals))
        try:
            made = template.instance(shape_of(text), text)
            parsed = await self.parser.parse_one(text)
        except MillpondError:
            return False  # a probe that does not parse or plan proves nothing
        return made is not None and parsed == made[0]
