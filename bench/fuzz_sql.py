"""Fuzzed SQL for bench/fuzz: real statements (the parser's golden statements, the readings
example) cut into tokens and mutated, seeded so a run can be replayed.

The mutations keep most of a statement's shape, so the text gets past the first token and
reaches the parser's deeper rules, the planner, the metastore and the coordinator:
token deletion, duplication, swaps and replacements by other keywords; random identifiers
(quotes, backticks, newlines, path separators, NUL); huge and odd numbers; deep nesting;
long strings; random characters; truncation; splices of two statements; many statements in
one request; and the empty request.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (ROOT / "tests" / "unit" / "shared" / "sql" / "golden" / "statements.sql",
           ROOT / "src" / "millpond" / "cli" / "readings.sql")

_TOKEN = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|--[^\n]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+
                        |\w+|->|<>|!=|<=|>=|\|\||\S""", re.VERBOSE)
_WORD = re.compile(r"\w+|\"[^\"]*\"|`[^`]*`")

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "PARTITION", "EMIT", "CHANGES", "LIMIT", "CREATE", "OR", "REPLACE",
    "STREAM", "TABLE", "IF", "NOT", "EXISTS", "AS", "WITH", "INSERT", "INTO", "VALUES", "DROP", "DELETE", "TOPIC",
    "TERMINATE", "ALL", "SHOW", "LIST", "DESCRIBE", "EXTENDED", "EXPLAIN", "SET", "UNSET", "KEY", "PRIMARY", "AND",
    "TOPICS", "STREAMS", "TABLES", "QUERIES",
    "IS", "NULL", "BETWEEN", "LIKE", "IN", "CASE", "WHEN", "THEN", "ELSE", "END", "CAST", "TRUE", "FALSE", "INT",
    "BIGINT", "VARCHAR", "DOUBLE", "DECIMAL", "ARRAY", "MAP", "STRUCT", "BYTES", "DATE", "TIMESTAMP", "COUNT", "AVG",
    "SUM", "COLLECT_LIST", "UCASE", "SUBSTRING", "ROUND", "(", ")", ",", ";", "*", "=", "!=", "<>", "<", ">=", "+",
    "-", "/", "%", "||", "->", "[", "]", ".", "'", '"', "`", "--",
)
IDENTIFIERS = (
    '"a""b"', '"it\'s"', "`back``tick`", '"new\nline"', '"nul\x00"', '"tab\tname"', '"x/../../tmp/evil"',
    '"\\\\server\\share"', '"ünïcødé"', '"😀"', '""', "``", '"' + "n" * 300 + '"', "`a'b`", '"a;DROP STREAM x"',
    "_x", "x1", "SELECT", '"SELECT"', "`FROM`", "readings", "avg_readings", "sensor", "no_such_thing",
)
NUMBERS = (
    "0", "-1", "2147483647", "2147483648", "-2147483649", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "1" + "0" * 40, "9" * 400, "1e308", "1e309", "-1e309", "1e-400", "0.0000000001",
    "00000000000000000001", "1.", ".5", "0x10", "1_000", "NaN", "Infinity", "3.14159265358979323846264338327950288",
)
STRINGS = ("''", "''''", "'\\'", "'\\''", "'\n'", "'\x00'", "'%'", "'_'", "'😀'", "'a''b''c'")


@dataclass
class StatementFuzzer:
    """Yields mutated statements from ``corpus``, deterministically for a given ``seed``."""

    corpus: list[str]
    seed: int = 0
    max_chars: int = 70_000
    """Longest text produced: a little over the router's 64 Ki characters, so the length
    check is exercised too."""
    rng: random.Random = field(init=False)
    kinds: dict[str, int] = field(init=False, default_factory=dict)
    """How many statements each mutation produced (the kind of the first one applied)."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._tokens = [_TOKEN.findall(text) for text in self.corpus]
        self._mutations: dict[str, Callable[[list[str]], list[str]]] = {
            "delete": self._delete, "duplicate": self._duplicate, "swap": self._swap, "keyword": self._keyword,
            "identifier": self._identifier, "number": self._number, "string": self._string, "nest": self._nest,
            "long_string": self._long_string, "random_chars": self._random_chars, "truncate": self._truncate,
            "splice": self._splice, "repeat": self._repeat,
        }

    def statement(self) -> str:
        """One fuzzed request text (may hold several statements, or none)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.01:
            kind, text = "empty", rng.choice(["", " ", ";", ";;", "\n", "-- only a comment", "/* */"])
        elif roll < 0.03:
            kind, text = "random_text", self._text(rng.randrange(1, 200))
        else:
            tokens = list(rng.choice(self._tokens))
            names = rng.sample(list(self._mutations), k=rng.choice((1, 1, 1, 2, 3)))
            kind = names[0]
            for name in names:
                tokens = self._mutations[name](tokens) or tokens
            text = " ".join(tokens)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        return text[:self.max_chars]

    def _pick(self, tokens: list[str]) -> int:
        return self.rng.randrange(len(tokens))

    def _delete(self, tokens: list[str]) -> list[str]:
        for _ in range(self.rng.randint(1, 3)):
            if len(tokens) > 1:
                del tokens[self._pick(tokens)]
        return tokens

    def _duplicate(self, tokens: list[str]) -> list[str]:
        i = self._pick(tokens)
        return tokens[:i] + [tokens[i]] * self.rng.choice((2, 2, 3, 50)) + tokens[i + 1:]

    def _swap(self, tokens: list[str]) -> list[str]:
        i, j = self._pick(tokens), self._pick(tokens)
        tokens[i], tokens[j] = tokens[j], tokens[i]
        return tokens

    def _keyword(self, tokens: list[str]) -> list[str]:
        i = self._pick(tokens)
        if self.rng.random() < 0.5:
            tokens[i] = self.rng.choice(KEYWORDS)
        else:
            tokens.insert(i, self.rng.choice(KEYWORDS))
        return tokens

    def _identifier(self, tokens: list[str]) -> list[str]:
        words = [i for i, t in enumerate(tokens) if _WORD.fullmatch(t)]
        i = self.rng.choice(words) if words else self._pick(tokens)
        name = self.rng.choice(IDENTIFIERS) if self.rng.random() < 0.6 else self._random_name()
        tokens[i] = name
        return tokens

    def _random_name(self) -> str:
        body = self._text(self.rng.randrange(0, 24))
        quote = self.rng.choice(('"', "`", ""))
        if quote:
            body = body.replace(quote, quote * 2) if self.rng.random() < 0.7 else body
        return f"{quote}{body}{quote}"

    def _number(self, tokens: list[str]) -> list[str]:
        numbers = [i for i, t in enumerate(tokens) if t[:1].isdigit()]
        i = self.rng.choice(numbers) if numbers else self._pick(tokens)
        tokens[i] = self.rng.choice(NUMBERS) if self.rng.random() < 0.8 else str(self.rng.randint(-64, 64))
        return tokens

    def _string(self, tokens: list[str]) -> list[str]:
        strings = [i for i, t in enumerate(tokens) if t.startswith("'")]
        i = self.rng.choice(strings) if strings else self._pick(tokens)
        tokens[i] = self.rng.choice(STRINGS) if self.rng.random() < 0.7 else "'" + self._text(12).replace("'", "''") + "'"
        return tokens

    def _nest(self, tokens: list[str]) -> list[str]:
        depth = self.rng.choice((2, 50, 199, 200, 201, 1000, 5000, 30_000))
        i = self._pick(tokens)
        j = self.rng.randrange(i, len(tokens))
        opener, closer = self.rng.choice((("(", ")"), ("[", "]"), ("ARRAY[", "]"), ("CAST(", " AS INT)"),
                                          ("-", ""), ("NOT ", "")))
        return [*tokens[:i], opener * depth, *tokens[i:j + 1], closer * depth, *tokens[j + 1:]]

    def _long_string(self, tokens: list[str]) -> list[str]:
        size = self.rng.choice((1_000, 60_000, 66_000))
        tokens[self._pick(tokens)] = "'" + "x" * size + "'"
        return tokens

    def _random_chars(self, tokens: list[str]) -> list[str]:
        tokens.insert(self._pick(tokens), self._text(self.rng.randrange(1, 8)))
        return tokens

    def _truncate(self, tokens: list[str]) -> list[str]:
        text = " ".join(tokens)
        return [text[:self.rng.randrange(len(text))]] if text else tokens

    def _splice(self, tokens: list[str]) -> list[str]:
        other = self.rng.choice(self._tokens)
        return tokens[:self._pick(tokens)] + other[self.rng.randrange(len(other)):]

    def _repeat(self, tokens: list[str]) -> list[str]:
        count = self.rng.choice((2, 3, 10, 100))
        body = " ".join(tokens).rstrip(";")
        return [";\n".join([body] * count) + ";"]

    def _text(self, length: int) -> str:
        """Random characters: mostly printable ASCII, some control characters and other
        planes (never a lone surrogate, which UTF-8 and so protobuf cannot carry)."""
        out = []
        for _ in range(length):
            roll = self.rng.random()
            if roll < 0.7:
                out.append(chr(self.rng.randrange(0x20, 0x7F)))
            elif roll < 0.85:
                out.append(chr(self.rng.randrange(0, 0x20)))
            else:
                code = self.rng.randrange(0x80, 0x110000)
                out.append(chr(code) if not 0xD800 <= code <= 0xDFFF else "?")
        return "".join(out)


def load_corpus() -> list[str]:
    """The seed statements: every statement of the golden file and the readings example."""
    from millpond.shared.errors import StatementError
    from millpond.shared.sql.parser import parse_script

    statements: list[str] = []
    for path in SOURCES:
        text = path.read_text()
        try:
            statements += [s.text for s in parse_script(text)]
        except StatementError:  # a file the parser refuses as a whole: split it by hand
            statements += [s.strip() for s in text.split(";") if s.strip()]
    return statements
