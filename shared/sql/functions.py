"""The scalar functions of the dialect: signature, result type, Spark SQL name and a Python
implementation (for pull queries and for checking Spark's results in tests).

Each function is declared once here; the type checker, the Spark compiler and the Python
evaluator all read this table, so they cannot disagree on which functions exist. The Python
forms of a family of functions live beside it (``arrays``, ``times``, ``regexes``,
``json_paths``, ``json_text``, ``json_variant``, ``texts``), what values are to Spark in ``kinds``.
"""

from __future__ import annotations

import math
import operator
import random
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

from millpond.shared.sql import arrays, ast, json_paths, json_text, json_variant, regexes, texts, times
from millpond.shared.sql.ast import Literal, SqlType, literal_text, to_sql
from millpond.shared.sql.kinds import (
    MAX_DECIMAL_DIGITS,
    MAX_PADDED_CHARS,
    common_type,
    is_nan,
    spark_compare,
    spark_ranked,
)

INT, BIGINT, DOUBLE, VARCHAR = SqlType("INT"), SqlType("BIGINT"), SqlType("DOUBLE"), SqlType("VARCHAR")
KIND_SHOWN = {"string": "VARCHAR", "boolean": "BOOLEAN", "numeric": "number", "integer": "INT or BIGINT",
              "code": "INT, BIGINT or VARCHAR",
              "bigint": "INT or BIGINT", "array": "ARRAY", "map": "MAP", "timestamp": "TIMESTAMP", "date": "DATE",
              "listable": "any but a MAP"}
"""A parameter kind as SHOW FUNCTIONS writes it (``any`` and ``orderable`` as they are)."""
TIMESTAMP, DATE = SqlType("TIMESTAMP"), SqlType("DATE")


@dataclass(frozen=True)
class ScalarFunction:
    """One scalar function."""

    name: str
    params: tuple[str, ...]
    """Kinds of the required parameters, in order."""
    optional: tuple[str, ...] = ()
    """Kinds of optional parameters after the required ones."""
    variadic: str | None = None
    """Kind of any number of further parameters."""
    result: Callable[[list[SqlType]], SqlType | None] = lambda _: VARCHAR
    """The result type from the argument types (None: the arguments do not mix)."""
    spark: str = ""
    """The Spark SQL function that computes it."""
    python: Callable[..., Any] = lambda *_: None
    """The same function in Python."""
    spark_of: Callable[..., str] | None = None
    """The Spark SQL of a call from its arguments' Spark SQL (and, ``typed``, their types), where
    it is not ``spark`` of the same arguments."""
    refuses: Callable[[tuple[Any, ...], list[SqlType]], str | None] | None = None
    """Why Spark's analyzer would refuse a call of these arguments (their syntax trees) and types
    (a persistent query then fails on its worker), or None: checked when the call is typed."""
    typed: bool = False
    """Its Python form takes the arguments' types after them (``Call.arg_types``), its
    ``spark_of`` the list of them after the arguments' Spark SQL."""

    def arity(self) -> str:
        """The accepted argument counts, for error messages."""
        low, high = len(self.params), len(self.params) + len(self.optional)
        if self.variadic:
            return f"at least {low}"
        return str(low) if low == high else f"{low} to {high}"

    def signature(self) -> str:
        """How a call is written, each parameter by what it takes: ``ROUND(number[, INT or BIGINT])``."""
        text = ", ".join([*(KIND_SHOWN.get(k, k) for k in self.params),
                          *([f"{KIND_SHOWN.get(self.variadic, self.variadic)} ..."] if self.variadic else [])])
        for kind in self.optional:
            text += f"[, {KIND_SHOWN.get(kind, kind)}]" if text else f"[{KIND_SHOWN.get(kind, kind)}]"
        return f"{self.name}({text})"

    def kind_at(self, index: int) -> str | None:
        """The parameter kind at ``index``, or None past the last parameter."""
        fixed = self.params + self.optional
        if index < len(fixed):
            return fixed[index]
        return self.variadic


def _strict(fn: Callable[..., Any]) -> Callable[..., Any]:
    """SQL semantics: any NULL argument gives NULL."""
    return lambda *args: None if any(a is None for a in args) else fn(*args)


_SPARK_EQUAL = spark_compare(operator.eq)

EARTH_RADII = {**dict.fromkeys(("mi", "mile", "miles"), 3959.0),
               **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres"), 6371.0)}
"""GEO_DISTANCE's units, as ksqlDB names them (in any case), and the Earth's radius in each."""
_GEO_BOUNDS = (90, 180, 90, 180)
"""The largest latitude, longitude, latitude and longitude GEO_DISTANCE takes (and their negatives)."""


_JAVA_BLANKS = "".join(map(chr, range(33)))
"""What Java's ``String.trim`` takes off: the characters up to the space."""


def _units(units: str) -> str:
    """GEO_DISTANCE's units as ksqlDB compares them: trimmed, in lower case."""
    return units.strip(_JAVA_BLANKS).lower()


def _date_to_string(days: int, pattern: str) -> str | None:
    """ksqlDB's DATETOSTRING: FORMAT_DATE of FROM_DAYS."""
    date = times.from_days(days)
    return None if date is None else times.format_date(date, pattern)


def _string_to_date(text: str, pattern: str) -> int | None:
    """ksqlDB's STRINGTODATE: UNIX_DATE of PARSE_DATE."""
    date = times.parse_date(text, pattern)
    return None if date is None else times.unix_date(date)


def _earth_radius(units: str | None) -> float:
    """The radius for GEO_DISTANCE's ``units`` (kilometres when none, or blank, as ksqlDB)."""
    return EARTH_RADII[_units(units)] if units is not None and _units(units) else EARTH_RADII["km"]


def geo_distance(lat1: Any, lon1: Any, lat2: Any, lon2: Any, units: str | None = None) -> float | None:
    """ksqlDB's GEO_DISTANCE: the great-circle distance between two points (latitude, longitude,
    in degrees) by the haversine formula, computed as ksqlDB computes it; NULL for a latitude
    beyond +-90 or a longitude beyond +-180 (ksqlDB's error, the row's column NULL)."""
    points = [float(v) for v in (lat1, lon1, lat2, lon2)]
    if any(abs(v) > bound for v, bound in zip(points, _GEO_BOUNDS, strict=True)):  # NaN is not beyond: NaN
        return None
    lat1, lon1, lat2, lon2 = points
    a = (math.pow(math.sin(math.radians(lat2 - lat1) / 2), 2)
         + math.pow(math.sin(math.radians(lon2 - lon1) / 2), 2) * math.cos(math.radians(lat1)) * math.cos(math.radians(lat2)))
    try:
        return 2 * math.asin(math.sqrt(a)) * _earth_radius(units)
    except ValueError:  # a rounded just past 1: NaN, as Java's asin
        return math.nan


def geo_distance_in_spark(args: list[str]) -> str:
    """Spark SQL of ``geo_distance``, each point's value evaluated once (an argument may be costly
    or random), a NaN not beyond the bounds (Spark ranks NaN above every number)."""
    # The units: a literal without quotes or backslashes (``_units_refusal``), or NULL.
    radius = _earth_radius(None if len(args) < 5 or args[4] == "NULL" else args[4][1:-1])

    def distance(points: list[str]) -> str:
        lat1, lon1, lat2, lon2 = points
        beyond = " OR ".join(f"(abs({v}) > {bound} AND NOT isnan({v}))" for v, bound in zip(points, _GEO_BOUNDS, strict=True))
        a = (f"pow(sin(radians({lat2} - {lat1}) / 2), 2) + pow(sin(radians({lon2} - {lon1}) / 2), 2) "
             f"* cos(radians({lat1})) * cos(radians({lat2}))")
        return f"CASE WHEN {beyond} THEN NULL ELSE 2 * asin(sqrt({a})) * {radius!r}D END"

    return arrays.evaluated_once([f"CAST({arg} AS DOUBLE)" for arg in args[:4]], distance)


def _units_refusal(args: tuple[Any, ...], _types: list[SqlType]) -> str | None:
    """GEO_DISTANCE's units are a text literal naming a unit ksqlDB knows."""
    if len(args) < 5:
        return None
    if isinstance(args[4], Literal) and args[4].value is None:  # kilometres, as ksqlDB's
        return None
    units = literal_text(args[4])
    if units is None or (_units(units) and _units(units) not in EARTH_RADII):
        return ("GEO_DISTANCE's units are a text literal, one of "
                f"{', '.join(repr(u) for u in EARTH_RADII)} (in any case): GEO_DISTANCE(lat1, lon1, lat2, lon2, 'km')")
    return None


def _nullif(value: Any, other: Any) -> Any:
    """ksqlDB's NULLIF as Spark's ``nullif``: NULL where the two are equal as Spark's ``=`` has
    them (``spark_compare``), else the first."""
    return value if value is None or other is None or not _SPARK_EQUAL(value, other) else None


def _field_in_spark(args: list[str]) -> str:
    """FIELD in Spark SQL: the place in an ARRAY of the others (each a STRING, so NULLs alone
    type), 0 for none and for a NULL text, as ksqlDB's."""
    texts = ", ".join(f"CAST({a} AS STRING)" for a in args[1:])
    return f"CAST(coalesce(array_position(array({texts}), {args[0]}), 0) AS INT)"


def _or_now(fn: Callable[[Any], Any], now: Callable[[], Any]) -> Callable[..., Any]:
    """A function of one optional argument: ``fn`` of it (NULL for NULL), ``now()`` without one."""
    strict = _strict(fn)
    return lambda *args: strict(*args) if args else now()


def _substring(s: str, pos: int, length: int | None = None) -> str:
    """Spark's ``substringSQL``: position 1 (or 0) is the first character, a negative one counts
    from the end; the length counts from there, before the start is clamped to the text."""
    start = pos - 1 if pos > 0 else len(s) + pos if pos < 0 else 0
    end = start + (2**31 - 1 if length is None else length)
    start = max(start, 0)
    return s[start:end] if start < end else ""


def _round(x: Any, digits: int = 0) -> Any:
    # Half away from zero, as Java's and Spark's ROUND (Python's round is half to even).
    if isinstance(x, float) and not math.isfinite(x):
        return x
    digits = max(min(digits, 400), -400)  # past a DOUBLE's or a BIGINT's digits either way, nothing changes more
    with localcontext(prec=1000):  # exact for any DOUBLE's or BIGINT's digits
        rounded = Decimal(str(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    # + 0.0: Java's BigDecimal has no negative zero, so Spark's ROUND(-0.4) is 0.0, not -0.0.
    return int(rounded) if isinstance(x, int) else float(rounded) + 0.0


TEXT_BUILDERS = frozenset({"LPAD", "RPAD", "CONCAT", "CONCAT_WS", "REPLACE", "REGEXP_REPLACE", "ARRAY_JOIN", "ARRAY_CONCAT"})
"""The functions that may build a text of ``MAX_PADDED_CHARS`` from short arguments."""


def _concat(*parts: str) -> str | None:
    return None if sum(map(len, parts)) > MAX_PADDED_CHARS else "".join(parts)


def _replace(s: str, old: str, new: str) -> str | None:
    if not old:
        return s
    if len(new) > len(old) and len(s) + s.count(old) * (len(new) - len(old)) > MAX_PADDED_CHARS:
        return None
    return s.replace(old, new)


def _pad(s: str, length: int, pad: str, left: bool) -> str | None:
    if length <= len(s):
        return s[:max(length, 0)]
    if not pad:
        return s
    if length > MAX_PADDED_CHARS:
        return None
    missing = length - len(s)
    fill = (pad * (missing // len(pad) + 1))[:missing]
    return fill + s if left else s + fill


def _exp(x: Any) -> float:
    try:
        return math.exp(x)
    except OverflowError:  # Spark's exp gives Infinity
        return math.inf


def _concat_ws(separator: str | None, *parts: str | None) -> str | None:
    """Spark's ``concat_ws`` (ksqlDB's CONCAT_WS): NULL for a NULL separator, NULL parts
    passed over (all of them NULL: an empty text); bounded as CONCAT is."""
    if separator is None:
        return None
    kept = [p for p in parts if p is not None]
    if sum(map(len, kept)) + len(separator) * max(len(kept) - 1, 0) > MAX_PADDED_CHARS:
        return None
    return separator.join(kept)


def _initcap(s: str) -> str:
    """Spark's ``initcap`` (ksqlDB's INITCAP): the first character of each word (after a space,
    U+0020, only: not a tab or a line break) in title case, by full case mapping (``ß`` becomes
    ``Ss``, ``ǆ`` ``ǅ``, ``İ`` stays), the rest in lower case as the word's (a final ``Σ`` is
    ``ς``)."""
    return " ".join(word[:1].title() + word.lower()[len(word[:1].lower()):] for word in s.split(" "))


def _double(fn: Callable[[float], float], overflow: Callable[[float], float] = lambda _: math.inf) -> Callable[[Any], float]:
    """A function of a DOUBLE as Java's ``Math`` answers it where Python's raises: NaN outside
    its domain (``ACOS(2)``, ``SIN`` of Infinity), ``overflow(x)`` past a DOUBLE's range."""
    def answer(x: Any) -> float:
        x = float(x)
        try:
            return fn(x)
        except ValueError:
            return math.nan
        except OverflowError:
            return overflow(x)
    return answer


def _odd_integer(y: float) -> bool:
    return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2) != 0


def _power(x: Any, y: Any) -> float:
    """Java's ``Math.pow`` (Spark's POWER), where C's differs: any power of NaN but the 0th and
    a NaN power are NaN, so is 1 or -1 to an infinite power; 0 to a negative power is Infinity
    (-Infinity for -0.0 to an odd one), NaN for a negative number to a fraction; past a DOUBLE's
    range, Infinity signed as the power's would be."""
    x, y = float(x), float(y)
    if y == 0:
        return 1.0
    if math.isnan(x) or math.isnan(y) or (abs(x) == 1 and math.isinf(y)):
        return math.nan
    try:
        return math.pow(x, y)
    except (ValueError, ZeroDivisionError):
        if x != 0:
            return math.nan
        return -math.inf if math.copysign(1, x) < 0 and _odd_integer(y) else math.inf
    except OverflowError:
        return -math.inf if x < 0 and _odd_integer(y) else math.inf


MASKS = ("X", "x", "n", "-")
"""MASK's replacements of an upper-case letter, a lower-case one, a digit and any other
character, by default (ksqlDB's)."""


def _mask(s: str | None, upper: str | None = "X", lower: str | None = "x", digit: str | None = "n",
          other: str | None = "-") -> str | None:
    """ksqlDB's MASK as Spark's ``mask``: each UTF-16 unit of ``s`` replaced by its class's
    character (Unicode's Lu, Ll, Nd, else other; a character beyond the BMP is two others), or
    kept where that is NULL."""
    if s is None:
        return None
    out = []
    for c in s:
        if ord(c) > 0xFFFF:
            out.append(c if other is None else other * 2)
            continue
        kind = unicodedata.category(c)
        by = upper if kind == "Lu" else lower if kind == "Ll" else digit if kind == "Nd" else other
        out.append(c if by is None else by)
    return "".join(out)


def _mask_in_spark(args: list[str]) -> str:
    defaults = [f"'{m}'" for m in MASKS[len(args) - 1:]]
    return f"mask({', '.join([*args, *defaults])})"


def _json_path_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    path = literal_text(args[1])
    if path is None:
        return f"EXTRACTJSONFIELD's path must be text written as it is ('$.a.b[0]'), not {to_sql(args[1])}"
    try:
        json_paths.json_path(path)
    except json_paths.PathError as error:
        return f"EXTRACTJSONFIELD cannot follow the path {path!r}: {error}"
    return None


def _mask_refusal(name: str, first: int) -> Callable[[tuple[Any, ...], list[SqlType]], str | None]:
    """Spark's ``mask`` takes one UTF-16 unit each, fixed when the query starts (the replacements
    are the arguments from ``first``)."""
    def refuses(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
        odd = next((a for a in args[first:] if not (isinstance(a, Literal) and (
            a.value is None or (isinstance(a.value, str) and len(a.value.encode("utf-16-le")) == 2)))), None)
        if odd is None:
            return None
        return (f"{name}'s replacement characters must each be one character written as it is ('X') or NULL (that "
                f"class kept), not {to_sql(odd)}")
    return refuses


_MASKED_ENDS: dict[str, tuple[bool, bool]] = {"MASK_LEFT": (True, True), "MASK_RIGHT": (False, True),
                                              "MASK_KEEP_LEFT": (True, False), "MASK_KEEP_RIGHT": (False, False)}
"""ksqlDB's masks of one end of a text: (whether the ``n`` characters are its left ones, whether
they are the masked ones)."""


def _mask_end(name: str) -> Callable[..., str | None]:
    """MASK_LEFT and its kin: ``n`` characters (code points, as Spark's ``left`` and ``right``) at
    one end masked, or all but them."""
    left, masked = _MASKED_ENDS[name]

    def mask_end(s: str | None, n: int | None, *replacements: str | None) -> str | None:
        if s is None or n is None:
            return None
        cut = min(max(n, 0), len(s)) if left else len(s) - min(max(n, 0), len(s))
        head, tail = s[:cut], s[cut:]
        if masked == left:
            return _mask(head, *replacements) + tail  # type: ignore[operator]
        return head + _mask(tail, *replacements)  # type: ignore[operator]
    return mask_end


def _mask_end_in_spark(name: str) -> Callable[[list[str]], str]:
    left, masked = _MASKED_ENDS[name]

    def in_spark(args: list[str]) -> str:
        s, n, replacements = args[0], f"CAST({args[1]} AS INT)", args[2:]  # a BIGINT as Spark takes it: its low bits
        rest = f"char_length({s}) - greatest({n}, 0)"
        head, tail = (f"left({s}, {n})", f"right({s}, {rest})") if left else (f"left({s}, {rest})", f"right({s}, {n})")
        if masked == left:
            return f"concat({_mask_in_spark([head, *replacements])}, {tail})"
        return f"concat({head}, {_mask_in_spark([tail, *replacements])})"
    return in_spark


def _cot(x: float) -> float:
    """Spark's COT: 1 / TAN (Infinity signed as the tangent of a zero)."""
    tangent = math.tan(x)
    return math.copysign(math.inf, tangent) if tangent == 0 else 1 / tangent


OF_A_DOUBLE: dict[str, Callable[[Any], float]] = {
    "SIN": _double(math.sin), "COS": _double(math.cos), "TAN": _double(math.tan), "COT": _double(_cot),
    "ASIN": _double(math.asin), "ACOS": _double(math.acos), "ATAN": _double(math.atan),
    "SINH": _double(math.sinh, lambda x: math.copysign(math.inf, x)), "COSH": _double(math.cosh), "TANH": _double(math.tanh),
    "DEGREES": _double(math.degrees), "RADIANS": _double(math.radians), "CBRT": _double(math.cbrt),
}
"""ksqlDB's functions of one DOUBLE that Spark has under the same name in lower case, each as
Java's ``Math`` answers it (Spark's; its last bit may differ from the C library's)."""


def _first(types: list[SqlType]) -> SqlType:
    return types[0]


def _whole(fn: Callable[[Any], int]) -> Callable[[Any], Any]:
    """FLOOR or CEIL; NaN and the infinities as they are, for the BIGINT they become to take
    them as Java's ``(long)`` cast does (``expressions.evaluate``: 0, the greatest, the least)."""
    return lambda x: x if isinstance(x, float) and not math.isfinite(x) else fn(x)


SATURATING = frozenset({"FLOOR", "CEIL"})
"""Functions whose INT or BIGINT result past its range is the nearest bound (Java's ``(long)``
of a double, as Spark's FLOOR and CEIL of a DOUBLE), not wrapped."""


def _floor_type(types: list[SqlType]) -> SqlType:
    if types[0].base == "DECIMAL" and types[0].params[1] > 0:  # one more whole digit: FLOOR(-9.5) is -10
        precision, scale = types[0].params
        return SqlType("DECIMAL", (min(precision - scale + 1, MAX_DECIMAL_DIGITS), 0))
    return types[0] if types[0].base in ("DECIMAL", "INT", "BIGINT") else BIGINT


def whole_constant(expr: ast.Expr) -> int | None:
    """The value of ``expr`` when it is a whole number of literals alone (``2``, ``1 + 1``,
    ``-(3 * 2)``), which Spark folds to a constant; None otherwise (a column, a call)."""
    if isinstance(expr, ast.Literal):
        return expr.value if isinstance(expr.value, int) and not isinstance(expr.value, bool) else None
    if isinstance(expr, ast.Unary) and expr.op == "-":
        inner = whole_constant(expr.operand)
        return None if inner is None else -inner
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
        left, right = whole_constant(expr.left), whole_constant(expr.right)
        if left is None or right is None:
            return None
        return left + right if expr.op == "+" else left - right if expr.op == "-" else left * right
    return None


def rounded_decimal(type_: SqlType, digits: int) -> SqlType:
    """The DECIMAL that ROUND of a ``type_`` to ``digits`` places gives, as Spark's: one more whole
    digit (ROUND(9.95, 1) is 10.0), the scale at most ``digits``."""
    precision, scale = type_.params
    whole = precision - scale + 1
    if digits < 0:
        return SqlType("DECIMAL", (min(max(whole, 1 - digits), MAX_DECIMAL_DIGITS), 0))
    kept = min(scale, digits)
    return SqlType("DECIMAL", (min(whole + kept, MAX_DECIMAL_DIGITS), kept))


FUNCTIONS: dict[str, ScalarFunction] = {f.name: f for f in (
    ScalarFunction("UCASE", ("string",), spark="upper", python=_strict(str.upper)),
    ScalarFunction("LCASE", ("string",), spark="lower", python=_strict(str.lower)),
    # Spark's trims take off spaces (U+0020) only, not tabs, line breaks or other white space.
    ScalarFunction("TRIM", ("string",), spark="trim", python=_strict(lambda s: s.strip(" "))),
    ScalarFunction("LTRIM", ("string",), spark="ltrim", python=_strict(lambda s: s.lstrip(" "))),
    ScalarFunction("RTRIM", ("string",), spark="rtrim", python=_strict(lambda s: s.rstrip(" "))),
    ScalarFunction("LEN", ("string",), result=lambda _: INT, spark="char_length", python=_strict(len)),
    ScalarFunction("CONCAT", ("string",), variadic="string", spark="concat",
                   python=_strict(_concat)),
    ScalarFunction("CONCAT_WS", ("string", "string"), variadic="string", spark="concat_ws", python=_concat_ws),
    ScalarFunction("INITCAP", ("string",), spark="initcap", python=_strict(_initcap)),
    ScalarFunction("SPLIT", ("string", "string"), result=lambda _: SqlType("ARRAY", (VARCHAR,)),
                   spark_of=texts.split_in_spark, python=_strict(texts.split)),
    ScalarFunction("SPLIT_TO_MAP", ("string", "string", "string"), result=lambda _: SqlType("MAP", (VARCHAR, VARCHAR)),
                   spark_of=texts.split_to_map_in_spark, python=_strict(texts.split_to_map)),
    ScalarFunction("CHR", ("code",), spark_of=texts.chr_in_spark, python=texts.character, typed=True),
    ScalarFunction("URL_ENCODE_PARAM", ("string",), spark="url_encode", python=_strict(texts.url_encode)),
    ScalarFunction("URL_DECODE_PARAM", ("string",), spark="try_url_decode", python=_strict(texts.url_decode)),
    ScalarFunction("MASK", ("string",), optional=("string",) * 4, spark_of=_mask_in_spark, python=_mask,
                   refuses=_mask_refusal("MASK", 1)),
    *(ScalarFunction(name, ("string", "integer"), optional=("string",) * 4, spark_of=_mask_end_in_spark(name),
                     python=_mask_end(name), refuses=_mask_refusal(name, 2)) for name in _MASKED_ENDS),
    ScalarFunction("EXTRACTJSONFIELD", ("string", "string"), spark="get_json_object",
                   python=_strict(json_paths.extract_json_field), refuses=_json_path_refusal),
    ScalarFunction("IS_JSON_STRING", ("string",), result=lambda _: SqlType("BOOLEAN"),
                   spark_of=lambda a: f"(get_json_object({a[0]}, '$') IS NOT NULL)", python=json_paths.is_json),
    ScalarFunction("JSON_ARRAY_LENGTH", ("string",), result=lambda _: INT, spark="json_array_length",
                   python=_strict(json_paths.json_array_length)),
    ScalarFunction("JSON_KEYS", ("string",), result=lambda _: SqlType("ARRAY", (VARCHAR,)), spark="json_object_keys",
                   python=_strict(json_paths.json_object_keys)),
    ScalarFunction("JSON_ITEMS", ("string",), result=lambda _: SqlType("ARRAY", (VARCHAR,)),
                   spark_of=json_variant.items_in_spark, python=_strict(json_variant.json_items)),
    ScalarFunction("JSON_RECORDS", ("string",), result=lambda _: SqlType("MAP", (VARCHAR, VARCHAR)),
                   spark_of=json_variant.records_in_spark, python=_strict(json_variant.json_records)),
    ScalarFunction("JSON_CONCAT", ("string",), variadic="string", spark_of=json_variant.concat_in_spark,
                   python=json_variant.json_concat),
    ScalarFunction("JSON_ARRAY_CONTAINS", ("string", "any"), result=lambda _: SqlType("BOOLEAN"),
                   spark_of=json_variant.contains_in_spark, python=json_variant.json_array_contains, typed=True,
                   refuses=json_variant.contains_refusal),
    ScalarFunction("TO_JSON_STRING", ("any",), spark_of=json_text.to_json_in_spark, python=json_text.to_json_string,
                   typed=True, refuses=json_text.refusal),
    ScalarFunction("REGEXP_EXTRACT", ("string", "string"), optional=("integer",),
                   spark_of=regexes.extract_in_spark,
                   python=_strict(regexes.regexp_extract), refuses=regexes.extract_refusal("REGEXP_EXTRACT")),
    ScalarFunction("REGEXP_EXTRACT_ALL", ("string", "string"), optional=("integer",), result=lambda _: SqlType("ARRAY", (VARCHAR,)),
                   spark_of=regexes.extract_all_in_spark,
                   python=_strict(regexes.regexp_extract_all), refuses=regexes.extract_refusal("REGEXP_EXTRACT_ALL")),
    ScalarFunction("REGEXP_REPLACE", ("string", "string", "string"), spark_of=regexes.replace_in_spark,
                   python=_strict(lambda s, p, r: regexes.regexp_replace(s, p, r, MAX_PADDED_CHARS)),
                   refuses=regexes.replace_refusal),
    ScalarFunction("REGEXP_SPLIT_TO_ARRAY", ("string", "string"), result=lambda _: SqlType("ARRAY", (VARCHAR,)),
                   spark_of=regexes.split_in_spark, python=_strict(regexes.regexp_split),
                   refuses=regexes.split_refusal),
    ScalarFunction("SUBSTRING", ("string", "integer"), optional=("integer",), spark="substring",
                   python=_strict(_substring)),
    ScalarFunction("REPLACE", ("string", "string", "string"), spark="replace",
                   python=_strict(_replace)),
    # ksqlDB's ELT and FIELD: the n-th text (NULL out of range), and the place of the first among the others (0: none).
    ScalarFunction("ELT", ("integer", "string"), variadic="string", spark="elt",
                   python=lambda n, *texts: texts[n - 1] if n is not None and 1 <= n <= len(texts) else None),
    ScalarFunction("FIELD", ("string", "string"), variadic="string", result=lambda _: INT, spark_of=_field_in_spark,
                   python=lambda s, *texts: next((i for i, t in enumerate(texts, 1) if s is not None and t == s), 0)),
    ScalarFunction("UUID", (), spark_of=lambda _: "uuid()", python=lambda: str(uuid.uuid4())),
    ScalarFunction("INSTR", ("string", "string"), result=lambda _: INT, spark="instr",
                   python=_strict(lambda s, sub: s.find(sub) + 1)),
    ScalarFunction("LPAD", ("string", "integer", "string"), spark="lpad",
                   python=_strict(lambda s, n, p: _pad(s, n, p, left=True))),
    ScalarFunction("RPAD", ("string", "integer", "string"), spark="rpad",
                   python=_strict(lambda s, n, p: _pad(s, n, p, left=False))),
    ScalarFunction("ABS", ("numeric",), result=_first, spark="abs", python=_strict(abs)),
    ScalarFunction("ROUND", ("numeric",), optional=("integer",), result=_first, spark="round",
                   python=_strict(_round)),
    ScalarFunction("FLOOR", ("numeric",), result=_floor_type, spark="floor", python=_strict(_whole(math.floor))),
    ScalarFunction("CEIL", ("numeric",), result=_floor_type, spark="ceil", python=_strict(_whole(math.ceil))),
    ScalarFunction("SQRT", ("numeric",), result=lambda _: DOUBLE, spark="sqrt",
                   python=_strict(lambda x: math.sqrt(x) if x >= 0 else math.nan)),
    ScalarFunction("EXP", ("numeric",), result=lambda _: DOUBLE, spark="exp", python=_strict(_exp)),
    ScalarFunction("LN", ("numeric",), result=lambda _: DOUBLE, spark="ln",
                   python=_strict(lambda x: None if x <= 0 else math.log(x))),  # NaN is not <= 0: NaN, as Spark
    ScalarFunction("SIGN", ("numeric",), result=lambda _: DOUBLE, spark="sign",
                   python=_strict(lambda x: float(x) if is_nan(x) or x == 0 else float((x > 0) - (x < 0)))),  # NaN, -0.0 as Spark
    *(ScalarFunction(name, ("numeric",), result=lambda _: DOUBLE, spark=name.lower(), python=_strict(fn))
      for name, fn in OF_A_DOUBLE.items()),
    # Spark adds 0.0 to each argument: ATAN2(-0.0, -0.0) is ATAN2(0.0, 0.0), 0.0 (Java's alone gives -pi).
    ScalarFunction("ATAN2", ("numeric", "numeric"), result=lambda _: DOUBLE, spark="atan2",
                   python=_strict(lambda y, x: math.atan2(float(y) + 0.0, float(x) + 0.0))),
    ScalarFunction("POWER", ("numeric", "numeric"), result=lambda _: DOUBLE, spark="power", python=_strict(_power)),
    ScalarFunction("PI", (), result=lambda _: DOUBLE, spark="pi", python=lambda: math.pi),
    ScalarFunction("GEO_DISTANCE", ("numeric", "numeric", "numeric", "numeric"), optional=("string",),
                   result=lambda _: DOUBLE, spark_of=geo_distance_in_spark, refuses=_units_refusal,
                   python=lambda *args: None if any(a is None for a in args[:4]) else geo_distance(*args)),
    ScalarFunction("GREATEST", ("orderable",), variadic="orderable", result=lambda t: common_type(t), spark="greatest",
                   python=lambda *a: max((x for x in a if x is not None), key=spark_ranked, default=None)),
    ScalarFunction("LEAST", ("orderable",), variadic="orderable", result=lambda t: common_type(t), spark="least",
                   python=lambda *a: min((x for x in a if x is not None), key=spark_ranked, default=None)),
    ScalarFunction("COALESCE", ("any",), variadic="any", result=lambda t: common_type(t), spark="coalesce",
                   python=lambda *a: next((x for x in a if x is not None), None)),
    ScalarFunction("IFNULL", ("any", "any"), result=lambda t: common_type(t), spark="ifnull",
                   python=lambda x, y: y if x is None else x),
    ScalarFunction("NULLIF", ("any", "any"), result=lambda t: t[0] if common_type(t) is not None else None, spark="nullif",
                   python=_nullif),
    ScalarFunction("RANDOM", (), result=lambda _: DOUBLE, spark_of=lambda _: "rand()", python=lambda: random.random()),
    ScalarFunction("ARRAY_CONTAINS", ("array", "any"), result=lambda t: SqlType("BOOLEAN") if arrays.same_elements(t) else None,
                   spark="array_contains", python=arrays.contains, refuses=arrays.array_refusal("ARRAY_CONTAINS")),
    ScalarFunction("ARRAY_REMOVE", ("array", "any"), result=lambda t: t[0] if arrays.same_elements(t) else None,
                   spark="array_remove", python=_strict(lambda items, value: [
                       x for x in items if x is None or spark_ranked(x) != spark_ranked(value)]),
                   refuses=arrays.array_refusal("ARRAY_REMOVE")),
    ScalarFunction("ARRAY_DISTINCT", ("array",), result=_first, spark="array_distinct", python=_strict(arrays.distinct),
                   refuses=arrays.array_refusal("ARRAY_DISTINCT")),
    ScalarFunction("ARRAY_SORT", ("array",), optional=("string",), result=_first, spark_of=arrays.array_sort_in_spark,
                   python=_strict(lambda items, direction="ASC": arrays.sorted_items(items, direction.upper() == "DESC")),
                   refuses=arrays.sort_refusal),
    ScalarFunction("ARRAY_MAX", ("array",), result=arrays.element, spark="array_max",
                   python=_strict(lambda items: max((x for x in items if x is not None), key=spark_ranked, default=None)),
                   refuses=arrays.array_refusal("ARRAY_MAX")),
    ScalarFunction("ARRAY_MIN", ("array",), result=arrays.element, spark="array_min",
                   python=_strict(lambda items: min((x for x in items if x is not None), key=spark_ranked, default=None)),
                   refuses=arrays.array_refusal("ARRAY_MIN")),
    ScalarFunction("ARRAY_LENGTH", ("array",), result=lambda _: INT, spark="array_size",
                   python=_strict(len)),
    ScalarFunction("ARRAY_CONCAT", ("array", "array"), result=_first, spark_of=arrays.array_concat_in_spark,
                   python=arrays.array_concat, refuses=arrays.two_arrays("ARRAY_CONCAT")),
    *(ScalarFunction(name, ("array", "array"), result=_first, spark=name.lower(), python=_strict(fn),
                     refuses=arrays.two_arrays(name)) for name, fn in arrays.SETS.items()),
    ScalarFunction("MAP_KEYS", ("map",), result=lambda t: SqlType("ARRAY", (t[0].params[0],)), spark="map_keys",
                   python=_strict(lambda m: list(m)), refuses=arrays.map_refusal("MAP_KEYS")),
    ScalarFunction("MAP_VALUES", ("map",), result=lambda t: SqlType("ARRAY", (t[0].params[1],)), spark="map_values",
                   python=_strict(lambda m: list(m.values())), refuses=arrays.map_refusal("MAP_VALUES")),
    ScalarFunction("MAP_UNION", ("map", "map"), result=_first, spark_of=arrays.map_union_in_spark, python=arrays.map_union,
                   refuses=arrays.map_union_refusal),
    ScalarFunction("ARRAY_JOIN", ("array",), optional=("string",), spark_of=arrays.array_join_in_spark, python=arrays.array_join,
                   refuses=arrays.join_refusal),
    ScalarFunction("ENTRIES", ("map", "boolean"), result=arrays.entries_type, spark_of=arrays.entries_in_spark,
                   python=_strict(arrays.entries), refuses=arrays.entries_refusal),
    ScalarFunction("AS_MAP", ("array", "array"), result=arrays.as_map_type, spark_of=arrays.as_map_in_spark,
                   python=_strict(arrays.as_map), refuses=arrays.as_map_refusal),
    ScalarFunction("GENERATE_SERIES", ("bigint", "bigint"), optional=("bigint",), result=arrays.series_type,
                   spark_of=arrays.generate_series_in_spark, python=_strict(arrays.generate_series),
                   refuses=arrays.series_refusal),
    ScalarFunction("TIMESTAMPTOSTRING", ("bigint", "string"), optional=("string",), spark_of=times.timestamp_to_string_in_spark,
                   python=_strict(times.timestamp_to_string), refuses=times.refusal("TIMESTAMPTOSTRING", 1, writes=True)),
    ScalarFunction("FORMAT_TIMESTAMP", ("timestamp", "string"), optional=("string",), spark_of=times.format_timestamp_in_spark,
                   python=_strict(times.format_timestamp), refuses=times.refusal("FORMAT_TIMESTAMP", 1, writes=True)),
    ScalarFunction("STRINGTOTIMESTAMP", ("string", "string"), optional=("string",), result=lambda _: BIGINT,
                   spark_of=times.string_to_timestamp_in_spark, python=_strict(times.string_to_timestamp),
                   refuses=times.refusal("STRINGTOTIMESTAMP", 1, writes=False)),
    ScalarFunction("PARSE_TIMESTAMP", ("string", "string"), optional=("string",), result=lambda _: TIMESTAMP,
                   spark_of=times.parse_timestamp_in_spark, python=_strict(times.parse_timestamp),
                   refuses=times.refusal("PARSE_TIMESTAMP", 1, writes=False)),
    ScalarFunction("FROM_UNIXTIME", ("bigint",), result=lambda _: TIMESTAMP, spark_of=times.from_unixtime_in_spark,
                   python=_strict(times.from_unixtime)),
    # With no argument: now (ksqlDB's), in a persistent query the micro-batch's time, as Spark's current_timestamp.
    ScalarFunction("UNIX_TIMESTAMP", (), optional=("timestamp",), result=lambda _: BIGINT,
                   spark_of=lambda a: f"unix_millis({a[0] if a else 'current_timestamp()'})",
                   python=_or_now(times.unix_timestamp, times.now_millis)),
    *(ScalarFunction(name, ("string", "bigint", "timestamp"), result=lambda _: TIMESTAMP, spark_of=times.timestamp_add_in_spark(sign),
                     python=_strict(lambda u, n, t, sign=sign: times.timestamp_add(u, n, t, sign)),
                     refuses=times.unit_refusal(name, dates=False)) for name, sign in (("TIMESTAMPADD", 1), ("TIMESTAMPSUB", -1))),
    *(ScalarFunction(name, ("string", "bigint", "date"), result=lambda _: DATE, spark_of=times.date_add_in_spark(sign),
                     python=_strict(lambda u, n, d, sign=sign: times.date_add(u, n, d, sign)),
                     refuses=times.unit_refusal(name, dates=True)) for name, sign in (("DATEADD", 1), ("DATESUB", -1))),
    ScalarFunction("CONVERT_TZ", ("timestamp", "string", "string"), result=lambda _: TIMESTAMP,
                   spark_of=times.convert_tz_in_spark, python=_strict(times.convert_tz),
                   refuses=times.zones_refusal("CONVERT_TZ", (1, 2))),
    ScalarFunction("FORMAT_DATE", ("date", "string"), spark="date_format", python=_strict(times.format_date),
                   refuses=times.refusal("FORMAT_DATE", 1, writes=True, dates=True)),
    ScalarFunction("PARSE_DATE", ("string", "string"), result=lambda _: DATE, spark_of=times.parse_date_in_spark,
                   python=_strict(times.parse_date), refuses=times.refusal("PARSE_DATE", 1, writes=False, dates=True)),
    # ksqlDB's older forms over days from the epoch: FORMAT_DATE(FROM_DAYS(d), f), UNIX_DATE(PARSE_DATE(s, f)).
    ScalarFunction("DATETOSTRING", ("bigint", "string"),
                   spark_of=lambda a: f"date_format({times.from_days_in_spark(a[:1])}, {a[1]})",
                   python=_strict(_date_to_string),
                   refuses=times.refusal("DATETOSTRING", 1, writes=True, dates=True)),
    ScalarFunction("STRINGTODATE", ("string", "string"), result=lambda _: INT,
                   spark_of=lambda a: f"unix_date({times.parse_date_in_spark(a)})",
                   python=_strict(_string_to_date),
                   refuses=times.refusal("STRINGTODATE", 1, writes=False, dates=True)),
    ScalarFunction("FROM_DAYS", ("bigint",), result=lambda _: DATE, spark_of=times.from_days_in_spark,
                   python=_strict(times.from_days)),
    ScalarFunction("UNIX_DATE", (), optional=("date",), result=lambda _: INT,
                   spark_of=lambda a: f"unix_date({a[0] if a else 'current_date()'})",
                   python=_or_now(times.unix_date, times.today_days)),
)}


TAKES_INT = frozenset(f.name for f in FUNCTIONS.values() if {"integer", "code"} & {*f.params, *f.optional, f.variadic})
"""Functions with an ``integer`` (or ``code``) parameter, which Spark takes as an INT: a BIGINT
argument is cast to it, keeping its low 32 bits (``SUBSTRING(s, 4294967298)`` starts at 2)."""


def lookup(name: str) -> ScalarFunction | None:
    """The scalar function called ``name``, if there is one."""
    return FUNCTIONS.get(name)
