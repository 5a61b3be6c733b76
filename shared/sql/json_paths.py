"""ksqlDB's EXTRACTJSONFIELD: a value of JSON text at a path, as Spark's ``get_json_object`` finds
and writes it for the persistent queries, computed the same way in Python for pulls; and the
JSON functions Spark reads text for the same way (``json_array_length``, ``json_object_keys``).

Spark reads the text with Jackson, one token at a time, only as far as the path needs: the
containers along it to their ends (a fault there gives NULL), nothing after the value the text
starts with. Jackson's reading is JSON's with two allowances (single-quoted strings and names,
control characters unescaped in them), and without others (comments, NaN, leading zeros or
``+``, trailing commas). At the path, a string is its text as it is; any other value is written
again as compact JSON by Jackson's generator (a number with a point or an exponent as the Java
DOUBLE it reads as: ``1.50`` is ``1.5``, ``1e2`` is ``100.0``); a field whose value is null, or
that is not there, is NULL (the first field of a name that is not null counts).

Paths (written as they are): ``$``, then ``.name``, ``['name']`` and ``[n]``; Spark's
wildcards (``*``), whose writing depends on how many values match, are refused.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from millpond.shared.sql.java_text import java_double_text, java_string, utf16_halves

MAX_DEPTH = 1000
"""Jackson's deepest nesting (``StreamReadConstraints``): deeper text does not read."""
MAX_NUMBER_CHARS = 1000
"""Jackson's longest number."""
_PATH = re.compile(r"\.([^.\[\s*][^.\[]*)|\['([^'\s][^']*)'\]|\[([0-9]{1,18})\]")
"""A step: ``.name`` (not starting with white space, which Spark drops, nor ``*``, its wildcard),
``['name']``, ``[n]``."""
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_STOPS = {'"': re.compile(r'["\\]'), "'": re.compile(r"['\\]")}
"""Where a string's plain text stops: its closing quote or an escape."""
_CONTROL = re.compile("[\x00-\x1f]")
"""A character JSON's strings must escape (``strict``: Jackson's default refuses it unescaped)."""
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'"}
_WRITTEN = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
_IDENTIFIER_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Nd", "Mn", "Mc", "Pc", "Sc", "Cf"})


class PathError(ValueError):
    """Why a path is not one Millpond follows."""


class Unreadable(Exception):
    """Text Jackson would not read (or a value its generator would not write): NULL."""


@functools.lru_cache(maxsize=256)
def json_path(path: str) -> tuple[str | int, ...]:
    """A path's steps: a field's name, or an array's index; PathError for what Spark reads
    otherwise or not at all."""
    if not path.startswith("$"):
        raise PathError("a path starts with $")
    steps: list[str | int] = []
    at = 1
    while at < len(path):
        step = _PATH.match(path, at)
        if step is None:
            raise PathError(f"{path[at:]!r} is not a step: write .name, ['name'] or [n] (no wildcards, no space before a name)")
        name = step.group(1) if step.group(1) is not None else step.group(2)
        if name == "*":
            raise PathError("['*'] is Spark's wildcard, which Millpond does not follow")
        steps.append(int(step.group(3)) if name is None else name)
        at = step.end()
    return tuple(steps)


def _java_identifier_part(c: str) -> bool:
    """Java's ``Character.isJavaIdentifierPart``: Jackson's test of where a literal ends."""
    code = ord(c)
    return unicodedata.category(c) in _IDENTIFIER_CATEGORIES or code <= 8 or 0x0E <= code <= 0x1B or 0x7F <= code <= 0x9F


@dataclass
class Reader:
    """Jackson's reading of JSON text, token by token: with ``get_json_object``'s two allowances,
    or (``strict``) without them, as Spark's ``parse_json`` reads (JSON's own strings only)."""

    text: str
    strict: bool = False
    at: int = 0
    depth: int = 0

    def _space(self) -> str | None:
        """The next character that is not JSON's white space (None at the end)."""
        text = self.text
        while self.at < len(text):
            c = text[self.at]
            if c in " \n\r\t":
                self.at += 1
            elif c < " ":
                raise Unreadable("a control character outside a string")
            else:
                return c
        return None

    def value(self) -> Any:
        """The next value's token: ``{`` or ``[`` (its container opened), else the value itself
        as ("string", text), ("number", text), ("literal", text). ``Unreadable`` otherwise."""
        c = self._space()
        if c is None:
            raise Unreadable("no value")
        if c in "{[":
            self.at += 1
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Unreadable("nested too deep")
            return c
        if c == '"' or (c == "'" and not self.strict):
            return "string", self._string(c)
        if c == "-" or "0" <= c <= "9":
            return "number", self._number()
        for word in ("true", "false", "null"):
            if self.text.startswith(word, self.at):
                self.at += len(word)
                after = self.text[self.at] if self.at < len(self.text) else None
                if after is not None and after >= "0" and after not in "]}" and _java_identifier_part(after):
                    raise Unreadable("a word that is not a literal")
                return "literal", word
        raise Unreadable(f"{c!r} starts no value")

    def _string(self, quote: str) -> str:
        text, out = self.text, []
        self.at += 1
        stop = _STOPS[quote]
        while True:
            found = stop.search(text, self.at)
            if found is None:
                raise Unreadable("a string is not closed")
            end = found.start()
            if self.strict and _CONTROL.search(text, self.at, end):
                raise Unreadable("a control character in a string")
            out.append(text[self.at:end])
            self.at = end + 1
            if text[end] == quote:
                return "".join(out)
            escaped = text[self.at] if self.at < len(text) else ""
            if escaped == "u":
                digits = text[self.at + 1:self.at + 5]
                if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise Unreadable("a \\u escape needs four hexadecimal digits")
                out.append(chr(int(digits, 16)))
                self.at += 5
            elif escaped in _ESCAPES and not (self.strict and escaped == "'"):
                out.append(_ESCAPES[escaped])
                self.at += 1
            else:
                raise Unreadable(f"\\{escaped} is no escape")

    def _number(self) -> str:
        found = _NUMBER.match(self.text, self.at)
        if found is None:
            raise Unreadable("not a number")
        after = self.text[found.end()] if found.end() < len(self.text) else ""
        if after != "" and after.isascii() and (after.isdigit() or after in ".eE"):
            raise Unreadable("a number goes on wrongly (a leading zero, a point or exponent without digits)")
        if found.end() - found.start() > MAX_NUMBER_CHARS:
            raise Unreadable("a number too long")
        if self.depth == 0 and after != "" and after not in " \n\r\t":
            raise Unreadable("a root value runs into what follows it")
        self.at = found.end()
        return found.group()

    def close_or_comma(self, closing: str) -> bool:
        """After a container's item: True when it closes, False for a comma (another item)."""
        c = self._space()
        if c == closing:
            self.at += 1
            self.depth -= 1
            return True
        if c != ",":
            raise Unreadable("an item is followed by neither , nor its container's end")
        self.at += 1
        return False

    def first_or_close(self, closing: str) -> bool:
        """After a container opens: True when it closes at once."""
        if self._space() == closing:
            self.at += 1
            self.depth -= 1
            return True
        return False

    def items(self, closing: str) -> Iterator[None]:
        """After a container opens: once per item, each read by the caller before the next (a
        field's name too, for an object), until the container closes."""
        if self.first_or_close(closing):
            return
        while True:
            yield
            if self.close_or_comma(closing):
                return

    def name(self) -> str:
        c = self._space()
        if c != '"' and (self.strict or c != "'"):
            raise Unreadable("a field name is not a string")
        name = self._string(c)
        if self._space() != ":":
            raise Unreadable("a field name is not followed by :")
        self.at += 1
        return name

    def skip(self, token: Any) -> None:
        """Read past the rest of a value whose token was ``token``."""
        self.written(token, _Discarded())

    def written(self, token: Any, out: list[str] | None = None) -> str:
        """The rest of the value whose token was ``token``, as Jackson's generator writes it (by
        a stack, not recursion: Jackson reads 1,000 levels)."""
        out = [] if out is None else out
        closings: list[str] = []
        while True:
            if token in ("{", "["):
                closing = "}" if token == "{" else "]"
                out.append(token)
                if self.first_or_close(closing):
                    out.append(closing)
                else:
                    closings.append(closing)
                    if closing == "}":
                        out.append(quoted(self.name()) + ":")
                    token = self.value()
                    continue
            elif not isinstance(out, _Discarded):
                kind, text = token
                out.append(quoted(text) if kind == "string" else _number_text(text) if kind == "number" else text)
            while closings:  # after a value: the next item, or the end of containers
                if not self.close_or_comma(closings[-1]):
                    out.append(",")
                    if closings[-1] == "}":
                        out.append(quoted(self.name()) + ":")
                    break
                out.append(closings.pop())
            if not closings:
                return "".join(out)
            token = self.value()


class _Discarded(list[str]):
    """Output nobody reads: a skipped value's."""

    def append(self, _: str) -> None:
        pass


def _number_text(text: str) -> str:
    """A number as Jackson copies it: an integer's digits, else the DOUBLE it reads as (an
    infinite one a string, as Jackson writes it)."""
    if "." not in text and "e" not in text and "E" not in text:
        return str(int(text))
    number = float(text)
    return f'"{java_double_text(number)}"' if math.isinf(number) else java_double_text(number)


def quoted(text: str, halves: bool = True) -> str:
    """A string as Jackson's generator writes it: ``"`` and ``\\`` escaped, control characters
    as their short escapes or ``\\u00XX``, and (writing UTF-8 bytes, ``halves``) each UTF-16
    half of a character beyond the BMP (or a lone one) as ``\\uXXXX``; writing characters, such
    a character as it is."""
    return '"' + "".join(_WRITTEN.get(c) or (f"\\u{ord(c):04X}" if c < " " or "\ud800" <= c <= "\udfff" else
                                             "".join(f"\\u{h:04X}" for h in utf16_halves(c)) if halves and c > "\uffff"
                                             else c)
                         for c in text) + '"'


def whole(text: str) -> str:
    """Output as Spark gives it: a string with a lone surrogate half Jackson's generator cannot
    write (its UTF-8), a pair of halves the character they make."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise Unreadable("a lone surrogate") from None


def _follow(reader: Reader, token: Any, steps: tuple[str | int, ...]) -> str | None:
    """Spark's ``evaluatePath`` (without wildcards): the value at ``steps`` from the value whose
    token is ``token``, as written; None where there is none. Reads what Spark reads."""
    if not steps:
        if isinstance(token, tuple) and token[0] == "string":
            return str(token[1])
        return reader.written(token)
    step, rest = steps[0], steps[1:]
    if isinstance(step, str) and token == "{":
        found: str | None = None
        for _ in reader.items("}"):
            name = reader.name()
            value = reader.value()
            if found is None and name == step and value != ("literal", "null"):
                found = _follow(reader, value, rest)
            else:
                reader.skip(value)
        return found
    if isinstance(step, int) and token == "[":
        found = None
        for index, _ in enumerate(reader.items("]")):
            value = reader.value()
            if index == step:
                found = _follow(reader, value, rest)
            else:
                reader.skip(value)
        return found
    reader.skip(token)
    return None


def extract_json_field(text: str, path: str) -> str | None:
    """EXTRACTJSONFIELD: the value at ``path`` of the JSON ``text``, as Spark's ``get_json_object``."""
    reader = Reader(text)
    try:
        found = _follow(reader, reader.value(), json_path(path))
        return None if found is None else whole(found)
    except (Unreadable, RecursionError):
        return None


def is_json(text: str | None) -> bool:
    """IS_JSON_STRING: whether the text starts with a JSON value Spark's ``get_json_object`` reads
    (what follows it is not read, as ksqlDB's Jackson does not)."""
    return text is not None and extract_json_field(text, "$") is not None


def json_array_length(text: str) -> int | None:
    """JSON_ARRAY_LENGTH: the number of items of the array the text starts with (Spark's
    ``json_array_length``: each item read to its end, nothing after the array); NULL for other
    values and for text that does not read."""
    reader = Reader(text)
    try:
        if reader.value() != "[":
            return None
        count = 0
        for _ in reader.items("]"):
            reader.skip(reader.value())
            count += 1
        return count
    except (Unreadable, RecursionError):
        return None


def json_object_keys(text: str) -> list[str] | None:
    """JSON_KEYS: the names of the object the text starts with, in order, each time it is given
    (Spark's ``json_object_keys``); NULL for other values and for text that does not read."""
    reader = Reader(text)
    try:
        if reader.value() != "{":
            return None
        keys = []
        for _ in reader.items("}"):
            keys.append(java_string(reader.name()))
            reader.skip(reader.value())
        return keys
    except (Unreadable, RecursionError):
        return None

