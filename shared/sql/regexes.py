"""ksqlDB's regular expression functions (REGEXP_EXTRACT, REGEXP_EXTRACT_ALL, REGEXP_REPLACE,
REGEXP_SPLIT_TO_ARRAY) over Java's patterns, as Spark runs them for the persistent queries and
Python does for pulls.

A pattern (and a replacement) is written as it is, and Python reads it as java.util.regex does
or the call is refused when the statement is run: ``java_pattern`` rewrites the constructs whose
meaning differs (``.`` and ``$`` stop at Java's five line terminators, ``\\z``, ``\\Z``, ``\\Q..\\E``,
``(?<name>``, ``\\k<name>``, escapes Python lacks, ``\\b`` and ``\\B`` by the JVM's letters and digits,
``\\p{..}``'s categories and scripts by the JVM's Unicode, POSIX's classes) and refuses those it cannot
give Java's meaning (a block's ``\\p{In..}``, nested classes and ``&&``, ``(?x)``, ...). Python
matches with ``re.ASCII``: ``\\d``, ``\\w``, ``\\s`` and case-insensitive matching are ASCII's, as
Java's default.

Python's ``re`` checks a pattern (it takes what Java takes, or less: a look-behind of fixed
width; an empty group stands in for a word boundary, whose reading looks behind by a varying
width); the ``regex`` module, which reads the same syntax the same way, matches it, within
``MATCH_TIMEOUT_S`` a call: a pattern that backtracks without end (``(a|aa)+c``) stops with an
error for the pull that asked (``PatternTimeout``) instead of holding the service. Spark's calls
have the same time (``SPARK_FUNCTIONS``): over it a record is set aside.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import regex

from millpond.shared.errors import StatementError
from millpond.shared.sql import java_unicode
from millpond.shared.sql.ast import Literal, literal_text, to_sql
from millpond.shared.sql.java_text import utf16_halves

_TERMINATORS = "\\n\\r\\x85\\u2028\\u2029"
_ANY = f"[^{_TERMINATORS}]"
"""Java's ``.`` without DOTALL: any character but a line terminator."""
_END = r"(?:(?=\r\n\Z|[\r\x85\u2028\u2029]\Z|\Z)|(?<!\r)(?=\n\Z))"
"""Java's ``$`` and ``\\Z`` without MULTILINE: the end, or before a last line terminator (not
between the ``\\r`` and ``\\n`` of a last ``\\r\\n``)."""
_LINE_END = r"(?:\Z|(?=[\r\x85\u2028\u2029])|(?<!\r)(?=\n))"
"""Java's ``$`` with MULTILINE: the end, or before any line terminator (not between a ``\\r\\n``'s two)."""
_LINE_START = r"(?:(?!\Z)(?:\A|(?<=[\n\x85\u2028\u2029])|(?<=\r)(?!\n)))"
"""Java's ``^`` with MULTILINE: the start, or after any line terminator (not between a ``\\r\\n``'s
two), but never at the end (Java's, as Perl's: not even after a last line terminator)."""
_KEPT_ESCAPES = frozenset("dDsSwWtnrfaA")
"""Escapes Python (with ``re.ASCII``) reads as Java does."""
_NEGATED_ESCAPES = frozenset({"\\D", "\\S", "\\W"})
_REFUSED_ESCAPES = {"b": "Java refuses it inside a class", "B": "Java refuses it inside a class"}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")
_SUPPLEMENTARY_ESCAPE = re.compile(r"\\x\{0*[1-9a-fA-F][0-9a-fA-F]{4,5}\}")
_QUANTIFIER = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")
_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")




def _ranges(ranges: tuple[tuple[int, int], ...], bmp: bool = False) -> str:
    """A class's ranges as the inside of a Python regex class (only the BMP's with ``bmp``)."""
    def escaped(c: int) -> str:
        return f"\\u{c:04X}" if c <= 0xFFFF else f"\\U{c:08X}"
    return "".join(escaped(a) if a == b else f"{escaped(a)}-{escaped(b)}"
                   for a, b in ((a, min(b, 0xFFFF) if bmp else b) for a, b in ranges if not bmp or a <= 0xFFFF))


def _halves(ranges: tuple[tuple[int, int], ...]) -> str:
    """The characters beyond the BMP in ``ranges`` as their two UTF-16 halves, an alternation: how
    they stand in a text split between its halves (``java_matches``), where Java reads them whole."""
    pairs = []
    for first, last in ((max(a, 0x10000), b) for a, b in ranges if b > 0xFFFF):
        for high in range(0xD800 + ((first - 0x10000) >> 10), 0xD800 + ((last - 0x10000) >> 10) + 1):
            low_first = 0xDC00 + ((first - 0x10000) & 0x3FF) if high == 0xD800 + ((first - 0x10000) >> 10) else 0xDC00
            low_last = 0xDC00 + ((last - 0x10000) & 0x3FF) if high == 0xD800 + ((last - 0x10000) >> 10) else 0xDFFF
            pairs.append(f"\\u{high:04X}[\\u{low_first:04X}-\\u{low_last:04X}]")
    return "|".join(pairs)


Ranges = tuple[tuple[int, int], ...]
"""Code points, each range its first and last."""


def _merged(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for first, last in ranges:
        if first > at:
            out.append((at, first - 1))
        at = last + 1
    return tuple(out + ([(at, 0x10FFFF)] if at <= 0x10FFFF else []))


_GROUPS = {"L": ("Lu", "Ll", "Lt", "Lm", "Lo"), "M": ("Mn", "Me", "Mc"), "N": ("Nd", "Nl", "No"), "Z": ("Zs", "Zl", "Zp"),
           "C": ("Cc", "Cf", "Co", "Cs", "Cn"), "P": ("Pd", "Ps", "Pe", "Pc", "Po", "Pi", "Pf"), "S": ("Sm", "Sc", "Sk", "So"),
           "LC": ("Lu", "Ll", "Lt"), "LD": ("Lu", "Ll", "Lt", "Lm", "Lo", "Nd")}
"""Java's categories of several general categories (``CharPredicates.forProperty``)."""


def _ranges_of(text: str) -> Iterable[tuple[int, int]]:
    """``java_unicode``'s text of a class: its ranges."""
    return ((int(first, 16), int(last, 16)) for first, last in (r.split("-") for r in text.split()))


@functools.lru_cache(maxsize=64)
def _category(name: str) -> Ranges:
    """A general category's characters by the JVM's Unicode, or a group of them (``_GROUPS``); () for none."""
    parts = _GROUPS.get(name, (name,))
    return _merged(r for part in parts for r in _ranges_of(java_unicode.CATEGORIES.get(part, "")))


_CASED = ("Lu", "Ll", "Lt")
"""Java's categories that match all three under (?i)."""
_ALPHA = ((0x41, 0x5A), (0x61, 0x7A))
_POSIX: dict[str, Ranges] = {
    "ASCII": ((0, 0x7F),), "Alnum": ((0x30, 0x39), *_ALPHA), "Alpha": _ALPHA, "Blank": ((0x9, 0x9), (0x20, 0x20)),
    "Cntrl": ((0, 0x1F), (0x7F, 0x7F)), "Digit": ((0x30, 0x39),), "Graph": ((0x21, 0x7E),), "Lower": ((0x61, 0x7A),),
    "Print": ((0x20, 0x7E),), "Punct": ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
    "Space": ((0x9, 0xD), (0x20, 0x20)), "Upper": ((0x41, 0x5A),), "XDigit": ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)),
    "L1": ((0, 0xFF),), "all": ((0, 0x10FFFF),)}
"""Java's POSIX classes (US-ASCII only, without UNICODE_CHARACTER_CLASS), Latin-1 and every character."""


def _property(p: str, i: int, caseless: bool) -> tuple[Ranges, int, bool]:
    """The characters of the ``\\p`` or ``\\P`` class at ``p[i]`` (its letter), as java.util.regex reads
    it (``Pattern.family``: a general category or a script by the JVM's Unicode, ``java_unicode``,
    or a POSIX class, US-ASCII's), the index after it, and whether Java's search then goes from
    character to character (``JavaPattern.by_code_point``: a category, a script, or any
    ``\\P``). Under (?i) Lu, Ll and Lt are each all three, and Lower and Upper are Alpha, as Java's."""
    if p.startswith("{", i + 1):
        end = p.find("}", i + 2)
        if end < 0:
            raise PatternError(f"\\{p[i]}{{ is not closed with }}")
        name, after = p[i + 2:end], end + 1
    elif i + 1 < len(p):
        name, after = p[i + 1], i + 2
    else:
        raise PatternError(f"\\{p[i]} needs a class name after it")
    key, _, value = name.partition("=")
    script = None
    if value and key in ("gc", "general_category"):
        name = value
    elif value and key in ("sc", "script"):
        script = _script(value)
    elif name.startswith("Is") and _category(name[2:]):
        name = name[2:]
    elif name.startswith("Is"):
        script = _script(name[2:])
    elif (not _category(name) and name not in _POSIX) or value:
        script = ""
    if script is not None:
        if script in java_unicode.SCRIPTS:
            letters = _merged(_ranges_of(java_unicode.SCRIPTS[script]))
            return letters if p[i] == "p" else _complement(letters), after, True
        raise PatternError(f"\\{p[i]}{{{name}}} is not read here: a general category (\\p{{L}}, \\p{{Lu}}, \\p{{IsLu}}, "
                           "\\p{gc=Lu}), a script (\\p{IsLatin}, \\p{sc=Grek}) or a POSIX class (\\p{Alpha}, \\p{Punct}) is, "
                           "or write the class in [...]")
    if caseless and name in _CASED:
        name = "LC"
    elif caseless and name in ("Lower", "Upper"):
        name = "Alpha"
    ranges = _category(name) or _POSIX.get(name)
    if not ranges:
        raise PatternError(f"\\{p[i]}{{{name}}} names no general category or POSIX class Java has")
    wide = p[i] == "P" or name not in _POSIX or name == "all"
    return ranges if p[i] == "p" else _complement(ranges), after, wide


def _script(name: str) -> str:
    """The script ``name`` names as ``Character.UnicodeScript.forName`` reads it (any case, an alias
    of four letters too), or '' for none."""
    upper = name.upper()
    return java_unicode.SCRIPT_ALIASES.get(upper, upper if upper in java_unicode.SCRIPTS else "")


@functools.cache
def _boundaries() -> tuple[str, str]:
    """Java 17's ``\\b`` and ``\\B`` (``Pattern.Bound``, without UNICODE_CHARACTER_CLASS): a side of
    a position is a word's when its character is a letter or digit of any script (the JVM's
    Unicode: ``java_unicode``) or ``_``, or a non-spacing mark after one (through more marks). That
    walk back goes a UTF-16 unit at a time: a mark or a letter beyond the BMP ends it, so such a
    character is no base (and a mark beyond the BMP is one only where it is the character after
    the position, read whole). A character beyond the BMP split in two halves still reads whole
    on either side of the position (``_halves``)."""
    letter_or_digit, mark_ = _category("LD"), _category("Mn")  # Character.isLetterOrDigit, NON_SPACING_MARK
    word = f"[{_ranges(letter_or_digit)}_]|{_halves(letter_or_digit)}"
    based = f"[{_ranges(letter_or_digit, bmp=True)}][{_ranges(mark_, bmp=True)}]"
    mark = f"(?:[{_ranges(mark_)}]|{_halves(mark_)})"
    before, after = f"{word}|{based}+", f"{word}|(?<={based}*){mark}"
    left, not_left, right, not_right = f"(?<={before})", f"(?<!{before})", f"(?={after})", f"(?!{after})"
    return f"(?:{left}{not_right}|{not_left}{right})", f"(?:{left}{right}|{not_left}{not_right})"



MAX_REPEAT = 1000
"""The largest count of a repetition ``{n,m}``: Python builds the pattern that large when it is
read (``a{10000000}`` took 13 s and 2.7 GB)."""
MAX_SIZE = 100_000
"""The most items a pattern's nested repetitions may make (``(?:a{1000}){1000}`` is a million)."""
MATCH_TIMEOUT_S = 0.5
"""The longest one call of a REGEXP function may take, in Python and in Spark."""


class PatternError(ValueError):
    """Why a Java pattern has no Python reading here."""


class PatternTimeout(StatementError, ValueError):
    """A REGEXP call over ``MATCH_TIMEOUT_S``: the pull that asked fails with it (``evaluate``
    passes it on); where a value is computed for a table or a join, it cannot be (a ValueError)."""


@dataclass(frozen=True)
class JavaPattern:
    """A Java pattern as Python reads it, and its capturing groups."""

    regex: regex.Pattern[str]
    names: dict[str, int]
    text: str
    by_code_point: bool
    """Whether Java's search goes from character to character, never between the halves of one
    beyond the BMP (``Pattern.StartS``), rather than from UTF-16 unit to unit: when the pattern has
    such a character, or a class that can match one whole: any negated class (``[^a]``, ``\\W``,
    ``\\D``, ``\\S``, ``\\P{..}``), a general category (``\\p{L}``, not a POSIX class) or a range
    under (?i); a character, ``.``, ``\\w``, ``\\p{Alpha}`` or ``[a-z]`` leave it trying every unit
    (checked against Java 17, a pattern of each)."""


def _escaped_char(p: str, i: int, in_class: bool) -> tuple[str, int]:
    """The Python text of the escape at ``p[i]`` (after its backslash) that stands for one
    character or an ASCII class, and the index after it."""
    if i >= len(p):
        raise PatternError("it ends with a lone backslash")
    c = p[i]
    if c in _KEPT_ESCAPES and not (in_class and c == "A"):
        return "\\" + c, i + 1
    if c == "e":
        return "\\x1b", i + 1
    if c == "0":  # Java's octal: \0n, \0nn, \0mnn (m at most 3)
        digits = re.match(r"[0-3][0-7]{2}|[0-7]{1,2}", p[i + 1:])
        if digits is None:
            raise PatternError("\\0 needs an octal number after it")
        return re.escape(chr(int(digits.group(), 8))), i + 1 + len(digits.group())
    if c == "x":
        braced = re.match(r"\{([0-9a-fA-F]{1,6})\}|([0-9a-fA-F]{2})", p[i + 1:])
        if braced is None:
            raise PatternError("\\x needs two hexadecimal digits or {digits}")
        return _code_point(int(braced.group(1) or braced.group(2), 16)), i + 1 + len(braced.group())
    if c == "u":
        digits = re.match(r"[0-9a-fA-F]{4}", p[i + 1:])
        if digits is None:
            raise PatternError("\\u needs four hexadecimal digits")
        return _code_point(int(digits.group(), 16)), i + 5
    if c == "c":
        if i + 1 >= len(p) or p[i + 1] == "\\":  # Java takes \Q...\E out first: \c\Q. is \c\. to it
            raise PatternError("\\c needs a character after it, not a backslash")
        return re.escape(chr(ord(p[i + 1]) ^ 64)), i + 2
    if c.isascii() and c.isalnum():
        raise PatternError(f"\\{c} is not an escape Millpond reads as Java does"
                           + (f" ({_REFUSED_ESCAPES[c]})" if c in _REFUSED_ESCAPES else ""))
    return re.escape(c), i + 1


def _code_point(value: int) -> str:
    if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF:
        raise PatternError(f"the code point {value:#x} is a surrogate or past Unicode: write the character itself")
    return re.escape(chr(value))


def _quoted(p: str, i: int) -> tuple[str, int]:
    """``\\Q...\\E`` from ``p[i]`` (after the ``Q``): its text as it is."""
    end = p.find("\\E", i)
    text = p[i:] if end < 0 else p[i:end]
    return "".join(re.escape(c) for c in text), len(p) if end < 0 else end + 2


def _class(p: str, i: int, caseless: bool) -> tuple[str, int, bool]:
    """A character class from ``p[i]`` (after its ``[``) as Python's, the index after it, and
    whether Java's search then goes from character to character (``JavaPattern.by_code_point``)."""
    out = ["["]
    wide = p.startswith("^", i)
    if wide:
        out.append("^")
        i += 1
    first = True
    while True:
        if i >= len(p):
            raise PatternError("a character class is not closed with ]")
        c = p[i]
        if c == "]" and not first:
            return "".join(out) + "]", i + 1, wide
        if c == "[":
            raise PatternError("a class inside a class (Java's union) is not read here: escape the [ as \\[")
        if p.startswith(("&&", "--", "~~", "||"), i):
            raise PatternError(f"{p[i:i + 2]} inside a class (Java's intersection, or a set operation to Python) is not "
                               "read here: escape the characters")
        if c == "\\":
            if p.startswith("Q", i + 1):
                text, i = _quoted(p, i + 2)
                out.append(text)
            elif p.startswith(("p", "P"), i + 1):
                ranges, i, by_property = _property(p, i + 1, caseless)
                out.append(_ranges(ranges))
                wide = wide or by_property
            else:
                text, i = _escaped_char(p, i + 1, in_class=True)
                out.append(text)
                wide = wide or text in _NEGATED_ESCAPES
        else:
            wide = wide or (caseless and c == "-" and not first and not p.startswith("]", i + 1))  # a range, (?i)
            out.append(re.escape(c) if c in "]\\" else c)
            i += 1
        first = False


def _group(p: str, i: int, modes: str, groups: list[str | None]) -> tuple[str, int, str]:
    """A group's opening from ``p[i]`` (its ``(``): its Python text, the index after it, and
    the modes inside it (``s``: ``.`` matches every character; ``m``: ``^`` and ``$`` match at
    every line's start and end), ``modes`` those around it."""
    if not p.startswith("(?", i):
        groups.append(None)
        return "(", i + 1, modes
    for opening in ("(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>"):
        if p.startswith(opening, i):
            return opening, i + len(opening), modes
    if p.startswith("(?<", i):
        name = _NAME.match(p, i + 3)
        if name is None or not p.startswith(">", name.end()):
            raise PatternError("a named group is (?<name>...), its name a letter and letters or digits")
        if name.group() in groups:
            raise PatternError(f"the group name {name.group()} is used twice")
        groups.append(name.group())
        return f"(?P<{name.group()}>", name.end() + 1, modes
    flags = _FLAGS.match(p, i)
    if flags is None:
        raise PatternError(f"the group {p[i:i + 4]!r}... is not read here")
    on, off, end = flags.group(1), flags.group(2) or "", flags.group(3)
    if set(on) & set(off):
        raise PatternError(f"the flags {flags.group()!r} turn one flag both on and off")
    if set(on + off) - set("ism"):
        raise PatternError(f"the flags {on + off!r} are not read here: only i (ASCII case), s (. matches every character) "
                           "and m (^ and $ at each line)")
    inner = "".join(m for m in "ism" if (m in modes or m in on) and m not in off)
    if end == ")":
        if i != 0:
            raise PatternError("flags for the rest of a pattern, (?i), (?s) or (?m), are read at its start only: "
                               "write (?i:...) around a part")
        return ("(?i)" if "i" in on else ""), flags.end(), inner
    case = ("i" if "i" in on else "") + ("-i" if "i" in off else "")
    return f"(?{case}:", flags.end(), inner


@functools.lru_cache(maxsize=256)
def java_pattern(pattern: str) -> JavaPattern:
    """``pattern`` (java.util.regex's syntax) as a Python regex with Java's meaning; PatternError
    when it uses a construct this does not read as Java does, or Java would refuse it."""
    out: list[str] = []
    groups: list[str | None] = []
    modes = [""]  # each open group's (``_group``)
    behind = [False]  # inside a look-behind, where Java refuses a back reference (its length is unknown)
    size = [[0, 0]]  # each open group's: the pattern's size built so far, and its last item's
    checked: list[str] = []  # ``out`` as Python's re reads it (where the two differ, ``check``)
    wide = False  # a class that has Java's search go from character to character (``JavaPattern.by_code_point``)
    i = 0
    while i < len(pattern):
        c = pattern[i]
        check = None
        if c == "\\" and behind[-1] and (pattern.startswith("k<", i + 1) or pattern[i + 1:i + 2] in tuple("123456789")):
            raise PatternError("a back reference inside a look-behind (Java needs the look-behind's longest length)")
        if c == "\\":
            if pattern.startswith("Q", i + 1):
                text, i = _quoted(pattern, i + 2)
            elif pattern.startswith(("z", "Z"), i + 1):
                text, i = ("\\Z" if pattern[i + 1] == "z" else _END), i + 2
            elif pattern.startswith(("p", "P"), i + 1):
                ranges, i, by_property = _property(pattern, i + 1, "i" in modes[-1])
                text, wide = f"[{_ranges(ranges)}]", wide or by_property
            elif pattern.startswith(("b", "B"), i + 1):
                if pattern.startswith("{", i + 2):
                    raise PatternError("\\b{g}, a grapheme cluster's boundary, is not read here")
                # Python's re, which checks the pattern, reads no look-behind of a varying width, nor a
                # quantified \b (Java's \b? is a boundary or none): an empty group stands in for it.
                text, check, i = _boundaries()[pattern[i + 1] == "B"], "(?:)", i + 2
            elif pattern.startswith("k<", i + 1):
                name = _NAME.match(pattern, i + 3)
                if name is None or not pattern.startswith(">", name.end()) or name.group() not in groups:
                    raise PatternError("\\k<name> must name a group opened before it")
                text, i = f"(?P={name.group()})", name.end() + 1
            elif i + 1 < len(pattern) and pattern[i + 1] in "123456789":
                number = int(pattern[i + 1])
                if number > len(groups) or (i + 2 < len(pattern) and pattern[i + 2].isdigit()):
                    raise PatternError(f"the back reference \\{pattern[i + 1:i + 3]}... must be one digit naming a group "
                                       "opened before it")
                text, i = f"(?:\\{number})", i + 2
            else:
                text, i = _escaped_char(pattern, i + 1, in_class=False)
                wide = wide or text in _NEGATED_ESCAPES
        elif c == "[":
            text, i, by_class = _class(pattern, i + 1, "i" in modes[-1])
            wide = wide or by_class
        elif c == ".":
            text, i = ("(?s:.)" if "s" in modes[-1] else _ANY), i + 1
        elif c == "$":
            text, i = (_LINE_END if "m" in modes[-1] else _END), i + 1
        elif c == "^" and "m" in modes[-1]:
            text, i = _LINE_START, i + 1
        elif c == "(":
            text, i, inner = _group(pattern, i, modes[-1], groups)
            if text.startswith("(") and not (text.startswith("(?") and text.endswith(")")):
                modes.append(inner)
                behind.append(behind[-1] or text in ("(?<=", "(?<!"))
                size.append([0, 0])
            else:  # (?s), (?m) at the start: the whole pattern
                modes[0] = inner
        elif c == ")":
            if len(modes) == 1:
                raise PatternError("a ) closes no group")
            modes.pop()
            behind.pop()
            inside = size.pop()[0]
            size[-1] = [size[-1][0] + inside, inside]
            text, i = ")", i + 1
        elif c == "{":
            quantifier = _QUANTIFIER.match(pattern, i)
            if quantifier is None:
                raise PatternError("a { starts a repetition {n}, {n,} or {n,m} (escape it as \\{ for the character)")
            times = max(int(n) for n in re.findall("[0-9]+", quantifier.group()))
            if times > MAX_REPEAT:
                raise PatternError(f"a repetition counts at most {MAX_REPEAT} times (the pattern is built that large)")
            size[-1][0] += size[-1][1] * (times - 1)
            size[-1][1] *= times
            text, i = quantifier.group(), quantifier.end()
        elif c in "*+?|^":
            text, i = c, i + 1
        else:
            text, i = re.escape(c), i + 1
        if c not in "(){*+?|^":
            size[-1] = [size[-1][0] + 1, 1]
            if size[-1][0] > MAX_SIZE:
                raise PatternError(f"the pattern's repetitions make it over {MAX_SIZE} items large")
        elif c == "{" and size[-1][0] > MAX_SIZE:
            raise PatternError(f"the pattern's repetitions make it over {MAX_SIZE} items large")
        out.append(text)
        checked.append(text if check is None else check)
    if len(modes) != 1:
        raise PatternError("a ( is not closed")
    try:
        re.compile("".join(checked), re.ASCII)
    except re.error as error:
        raise PatternError(str(error)) from None
    return JavaPattern(regex.compile("".join(out), regex.ASCII | regex.V0),
                       {name: n for n, name in enumerate(groups, 1) if name is not None}, pattern,
                       wide or any(ord(c) > 0xFFFF for c in pattern) or _SUPPLEMENTARY_ESCAPE.search(pattern) is not None)


def _pattern_refusal(name: str, value: Any) -> str | None:
    pattern = literal_text(value)
    if pattern is None:
        return f"{name}'s pattern must be text written as it is ('[0-9]+'), not {to_sql(value)}"
    try:
        java_pattern(pattern)
    except PatternError as error:
        return f"{name} cannot read the pattern {pattern!r} as Java does: {error}"
    return None


def _group_refusal(name: str, pattern: str, group: Any) -> str | None:
    count = java_pattern(pattern).regex.groups
    if isinstance(group, Literal) and isinstance(group.value, int) and 0 <= group.value <= count:
        return None
    return f"{name}'s group must be a number from 0 (the whole match) to {count} written as it is, not {to_sql(group)}"


def extract_refusal(name: str) -> Callable[[tuple[Any, ...], list[Any]], str | None]:
    """REGEXP_EXTRACT(_ALL)'s pattern (its first argument) and group (its third) as Spark takes them:
    a group past the pattern's fails the batch."""
    def refuses(args: tuple[Any, ...], _types: list[Any]) -> str | None:
        refused = _pattern_refusal(name, args[0])
        if refused is None and len(args) > 2:
            return _group_refusal(name, args[0].value, args[2])
        return refused
    return refuses


def replacement_parts(replacement: str, pattern: JavaPattern) -> list[str | int]:
    """A replacement as Java's ``appendReplacement`` reads it: text, and groups (``$1``, ``${name}``;
    ``\\`` takes the next character as it is); PatternError where Java would fail the batch."""
    parts: list[str | int] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            if i + 1 >= len(replacement):
                raise PatternError("it ends with a lone backslash (write \\\\ for one)")
            parts.append(replacement[i + 1])
            i += 2
        elif c == "$":
            if replacement.startswith("{", i + 1):
                name = _NAME.match(replacement, i + 2)
                if name is None or not replacement.startswith("}", name.end()) or name.group() not in pattern.names:
                    raise PatternError("${name} must name a group of the pattern")
                parts.append(pattern.names[name.group()])
                i = name.end() + 1
                continue
            if i + 1 >= len(replacement) or not replacement[i + 1].isdigit() or not replacement[i + 1].isascii():
                raise PatternError("a $ is a group, $1 or ${name} (write \\$ for the character)")
            number, i = int(replacement[i + 1]), i + 2
            # Java takes more digits while they still name a group: with one group, $11 is $1 then 1.
            groups = pattern.regex.groups
            while i < len(replacement) and replacement[i] in "0123456789" and number * 10 + int(replacement[i]) <= groups:
                number, i = number * 10 + int(replacement[i]), i + 1
            if number > pattern.regex.groups:
                raise PatternError(f"${number} names no group of the pattern (it has {pattern.regex.groups})")
            parts.append(number)
        else:
            parts.append(c)
            i += 1
    return parts


def replace_refusal(args: tuple[Any, ...], _types: list[Any]) -> str | None:
    refused = _pattern_refusal("REGEXP_REPLACE", args[1])
    if refused is not None:
        return refused
    replacement = literal_text(args[2])
    if replacement is None:
        return f"REGEXP_REPLACE's replacement must be text written as it is ('[$1]'), not {to_sql(args[2])}"
    try:
        replacement_parts(replacement, java_pattern(args[1].value))
    except PatternError as error:
        return f"REGEXP_REPLACE cannot take the replacement {replacement!r}: {error}"
    return None


def split_refusal(args: tuple[Any, ...], _types: list[Any]) -> str | None:
    return _pattern_refusal("REGEXP_SPLIT_TO_ARRAY", args[1])


class _Budget:
    """What is left of one call's ``MATCH_TIMEOUT_S``."""

    def __init__(self, pattern: JavaPattern):
        self.pattern = pattern
        self.deadline = time.monotonic() + MATCH_TIMEOUT_S

    def search(self, text: str, at: int, anchored: bool = False) -> regex.Match[str] | None:
        try:
            find = self.pattern.regex.match if anchored else self.pattern.regex.search
            return find(text, at, timeout=max(self.deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise PatternTimeout(f"the pattern {self.pattern.text!r} took over {MATCH_TIMEOUT_S} s on a text of "
                                 f"{len(text)} characters (it backtracks too much; Java's would too): simplify it") from None


def java_matches(pattern: JavaPattern, text: str) -> Iterator[regex.Match[str]]:
    """The matches Java's ``Matcher.find`` gives one after another (each in ``match.string``).

    After an empty match the next search starts one UTF-16 unit on (Python's ``finditer`` first
    tries a longer match where it was, so ``a*?`` over ``a`` gives it an ``a`` Java's never does).
    Before a character beyond the BMP that is between its two halves; and Java's search tries
    there too, unless the pattern itself has such a character (``Pattern.StartS``). Where the
    pattern matches there (``x*``, ``(?<!^).``), the text goes on with that character as its two
    lone surrogates, as Java then sees it, which Spark's text writes as ``?`` each (``java_text``)."""
    budget = _Budget(pattern)
    at = 0
    while at <= len(text):
        found = budget.search(text, at)
        if not pattern.by_code_point:
            # Java tries every UTF-16 unit: between the halves of a character beyond the BMP too.
            for astral in _ASTRAL.finditer(text, at, len(text) if found is None else found.start()):
                split = _split(text, astral.start())
                between = budget.search(split, astral.start() + 1, anchored=True)
                if between is not None:
                    text, found = split, between
                    break
        if found is None:
            return
        yield found
        at = found.end()
        if found.end() == found.start():
            if at < len(text) and ord(text[at]) > 0xFFFF:
                split = _split(text, at)
                if budget.search(split, at + 1, anchored=True) is not None:  # else Java goes on after the character
                    text = split
            at += 1


def _split(text: str, at: int) -> str:
    """``text`` with its character at ``at`` (beyond the BMP) as its two UTF-16 halves."""
    return text[:at] + "".join(map(chr, utf16_halves(text[at]))) + text[at + 1:]


def java_text(text: str) -> str:
    """Text as Spark gives a Java string back: a lone surrogate is ``?``."""
    return text.encode("utf-8", "replace").decode() if any(0xD800 <= ord(c) <= 0xDFFF for c in text) else text


SPARK_FUNCTIONS = {
    "millpond_regexp_extract": ("io.millpond.spark.Regexps$Extract", "string"),
    "millpond_regexp_extract_all": ("io.millpond.spark.Regexps$ExtractAll", "array<string>"),
    "millpond_regexp_replace": ("io.millpond.spark.Regexps$Replace", "string"),
    "millpond_regexp_split": ("io.millpond.spark.Regexps$Split", "array<string>"),
}
"""The Spark functions the persistent queries' REGEXP calls are (name: Java class, result type),
which the workers' sessions register: Spark's own regexp_extract, regexp_extract_all,
regexp_replace and split as each computes it, with ``MATCH_TIMEOUT_S`` a call (their last
argument, in milliseconds; java.util.regex has no limit of its own, nor stops for a task's
interrupt), over which the call fails its task with a ``SPARK_TIMEOUT`` and the worker sets its
record aside (the extension's io.millpond.spark.Regexps)."""
SPARK_TIMEOUT = "io.millpond.spark.Regexps$PatternTimeout"
_BUDGET_MS = round(MATCH_TIMEOUT_S * 1000)


def extract_in_spark(args: list[str]) -> str:
    """REGEXP_EXTRACT as Spark SQL: NULL without a match (Spark's ``regexp_extract`` gives ''),
    the whole match by default (Spark's takes group 1)."""
    return f"millpond_regexp_extract({args[1]}, {args[0]}, {args[2] if len(args) > 2 else 0}, {_BUDGET_MS})"


def extract_all_in_spark(args: list[str]) -> str:
    return f"millpond_regexp_extract_all({args[1]}, {args[0]}, {args[2] if len(args) > 2 else 0}, {_BUDGET_MS})"


def replace_in_spark(args: list[str]) -> str:
    return f"millpond_regexp_replace({args[0]}, {args[1]}, {args[2]}, {_BUDGET_MS})"


def split_in_spark(args: list[str]) -> str:
    """REGEXP_SPLIT_TO_ARRAY as Spark's ``split(text, pattern, -1)``."""
    return f"millpond_regexp_split({args[0]}, {args[1]}, {_BUDGET_MS})"


def _found(match: regex.Match[str], group: int) -> str:
    """A group's text, empty where it took no part (as Spark's ``regexp_extract``)."""
    return match.group(group) or ""


def regexp_extract(pattern: str, text: str, group: int = 0) -> str | None:
    """REGEXP_EXTRACT: the group of the first match, NULL where none (ksqlDB's)."""
    found = next(java_matches(java_pattern(pattern), text), None)
    return None if found is None else java_text(_found(found, group))


def regexp_extract_all(pattern: str, text: str, group: int = 0) -> list[str]:
    """REGEXP_EXTRACT_ALL: the group of every match."""
    return [java_text(_found(found, group)) for found in java_matches(java_pattern(pattern), text)]


def regexp_replace(text: str, pattern: str, replacement: str, most: int) -> str | None:
    """REGEXP_REPLACE: every match replaced (Java's replacement syntax); NULL past ``most`` characters."""
    compiled = java_pattern(pattern)
    parts = replacement_parts(replacement, compiled)
    out: list[str] = []
    size, at = 0, 0
    for found in java_matches(compiled, text):
        text = found.string
        pieces = [text[at:found.start()], *(p if isinstance(p, str) else found.group(p) or "" for p in parts)]
        size += sum(map(len, pieces))
        if size > most:
            return None
        out += pieces
        at = found.end()
    if size + len(text) - at > most:
        return None
    return java_text("".join(out) + text[at:])


def regexp_split(text: str, pattern: str) -> list[str]:
    """REGEXP_SPLIT_TO_ARRAY as Spark's ``split(text, pattern, -1)``: Java's ``String.split``, which
    drops the empty first part a zero-width match at the start makes and keeps the others; an
    empty pattern splits into characters."""
    if pattern == "":
        return list(text) or [""]
    parts, at = [], 0
    for found in java_matches(java_pattern(pattern), text):
        text = found.string
        if found.end() == 0:
            continue
        parts.append(java_text(text[at:found.start()]))
        at = found.end()
    return [*parts, java_text(text[at:])]
