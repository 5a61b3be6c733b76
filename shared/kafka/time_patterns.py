"""Text read as a time with a TIMESTAMP_FORMAT pattern, in Python, as Spark's
``try_to_timestamp(text, pattern)`` reads it for the persistent queries: where Python reads a
source's records itself (a stream-table join's table side), its TIMESTAMP column's text gives the
same time the queries see.

Spark's datetime patterns are java.time's DateTimeFormatter letters, parsed case-insensitively
and strictly in the session's time zone (UTC here). This reads the letters a timestamp's text
commonly uses; a pattern with any other (a day-of-week name, a zone name, a week-based year,
...) has no reader here (``pattern_reader`` is None), and the caller does without:

- ``yyyy`` (four digits) and ``yy`` (two, 2000-2099); ``MM`` and ``M`` (one or two digits),
  ``MMM`` and ``MMMM`` (English names); ``dd`` and ``d``; ``HH`` and ``H``; ``hh`` and ``h``
  (1-12) with ``a`` (AM or PM); ``mm``, ``m``, ``ss``, ``s``; ``S`` up to nine times, a
  fraction of at most as many digits (Spark's parser takes fewer too);
- offsets: ``X`` (``Z`` or +hh, +hhmm), ``XX`` (``Z`` or +hhmm), ``XXX`` (``Z`` or +hh:mm),
  ``x``, ``xx``, ``xxx`` (the same without ``Z``), ``Z`` to ``ZZZ`` (+hhmm);
- text in single quotes (``''`` a quote) and any other character as itself.

Fields a pattern lacks take Spark's defaults: 1970, January, the 1st, midnight.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable

_EPOCH = datetime.datetime(1970, 1, 1)
EARLIEST_TIMESTAMP = datetime.datetime(1, 1, 2)
"""The earliest TIMESTAMP Millpond holds: PySpark cannot give a time of the first day of year 1
as a datetime (its conversion goes through a day before it)."""
LATEST_TIMESTAMP = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
_MONTHS = {name: n for n, name in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                              "august", "september", "october", "november", "december"), 1)}
"""English month names (the session's locale), whatever this process's locale is."""
_MONTHS_SHORT = {name[:3]: n for name, n in _MONTHS.items()}
_OFFSET = {("X", 1): r"Z|[+-][0-9]{2}(?:[0-9]{2})?", ("X", 2): r"Z|[+-][0-9]{4}",
           ("X", 3): r"Z|[+-][0-9]{2}:[0-9]{2}",
           # +00 is x's text of no offset, and java.time takes it first: "+0030" does not read.
           ("x", 1): r"\+00(?![0-9])|\+(?!00)[0-9]{2}(?:[0-9]{2})?|-[0-9]{2}(?:[0-9]{2})?",
           ("x", 2): r"[+-][0-9]{4}", ("x", 3): r"[+-][0-9]{2}:[0-9]{2}",
           ("Z", 1): r"[+-][0-9]{4}", ("Z", 2): r"[+-][0-9]{4}", ("Z", 3): r"[+-][0-9]{4}"}
_OPTIONAL = frozenset("[]{}#")
"""Pattern characters of optional sections and reserved ones, which this does not read."""
_NUMBERS = {"M": "month", "d": "day", "H": "hour", "h": "clock", "m": "minute", "s": "second"}
_TOKENS = re.compile(r"'(?:[^']|'')*'|''|([A-Za-z])\1*|.", re.DOTALL)


def _quoted_as_spark(token: str) -> bool:
    """Whether Spark reads a quoted token of a pattern as java.time does: ``''`` alone (a quote)
    or text in quotes without ``''`` inside (Spark finds the letters it rewrites by counting
    quotes, so ``'It''s my'`` has a letter ``y`` outside to it), and a quote that is closed."""
    return token == "''" or (len(token) > 1 and token.endswith("'") and "''" not in token[1:-1])


def _field(letter: str, count: int) -> tuple[str, str] | None:
    """The named group and regular expression of a run of one pattern letter; None when unread."""
    if letter == "y" and count in (2, 4):
        return "year", rf"[0-9]{{{count}}}"
    if letter == "M" and count == 3:
        return "month_name", "|".join(_MONTHS_SHORT)
    if letter == "M" and count == 4:
        return "month_name", "|".join(_MONTHS)
    if letter in _NUMBERS and count <= 2:
        return _NUMBERS[letter], r"[0-9]{1,2}" if count == 1 else r"[0-9]{2}"
    if letter == "S" and count <= 9:
        return "fraction", rf"[0-9]{{1,{count}}}"
    if letter == "a" and count == 1:
        return "half", "am|pm"
    if (letter, count) in _OFFSET:
        return "offset", _OFFSET[letter, count]
    return None


@functools.lru_cache(maxsize=64)
def pattern_reader(pattern: str) -> Callable[[str], int | None] | None:
    """A reader of text written in ``pattern`` to epoch milliseconds (its offset, else UTC),
    None for text that does not read as a time there, as Spark's ``try_to_timestamp``; None
    when the pattern uses a letter (or a letter twice) this does not read."""
    read = moment_reader(pattern)
    if read is None:
        return None

    def millis(text: str) -> int | None:
        moment = read(text)
        return None if moment is None else (moment - _EPOCH) // datetime.timedelta(milliseconds=1)

    return millis


@functools.lru_cache(maxsize=64)
def moment_reader(pattern: str) -> Callable[[str], datetime.datetime | None] | None:
    """``pattern_reader``'s reading as a time of day to the microsecond, Spark's: UTC where the
    text has an offset, else the time as written."""
    parts: list[str] = []
    seen: set[str] = set()
    for token in _TOKENS.finditer(pattern):
        text = token.group()
        if token.group(1) is not None:
            field = _field(text[0], len(text))
            if field is None or field[0] in seen:
                return None
            seen.add(field[0])
            parts.append(f"(?P<{field[0]}>{field[1]})")
        elif text.startswith("'"):
            if not _quoted_as_spark(text):
                return None
            parts.append(re.escape("'" if text == "''" else text[1:-1]))
        elif text in _OPTIONAL:
            return None
        else:
            parts.append(re.escape(text))
    if ("clock" in seen) != ("half" in seen) or ("hour" in seen and "half" in seen):
        return None  # an hour of the half day needs its AM or PM, and the reverse
    matcher = re.compile("".join(parts), re.IGNORECASE)

    def read(text: str) -> datetime.datetime | None:
        found = matcher.fullmatch(text)
        if found is None:
            return None
        fields = found.groupdict()
        try:
            year = int(fields["year"]) if fields.get("year") else 1970
            if fields.get("year") and len(fields["year"]) == 2:
                year += 2000
            name = (fields.get("month_name") or "").lower()
            month = _MONTHS.get(name) or _MONTHS_SHORT.get(name) or int(fields.get("month") or 1)
            hour = int(fields.get("hour") or 0)
            if fields.get("clock"):
                clock = int(fields["clock"])
                if not 1 <= clock <= 12:
                    return None
                hour = clock % 12 + (12 if fields["half"].lower() == "pm" else 0)
            fraction = fields.get("fraction") or ""
            moment = datetime.datetime(year, month, int(fields.get("day") or 1), hour, int(fields.get("minute") or 0),
                                       int(fields.get("second") or 0), int(fraction.ljust(9, "0")[:6] or 0))
        except ValueError:  # a month, day or hour that does not exist
            return None
        offset = fields.get("offset")
        if offset and offset.upper() != "Z":
            digits = offset[1:].replace(":", "").ljust(4, "0")
            hours, minutes = int(digits[:2]), int(digits[2:])
            shift = datetime.timedelta(hours=hours, minutes=minutes)
            if minutes > 59 or shift > datetime.timedelta(hours=18):  # java.time's bounds of an offset
                return None
            try:
                moment -= shift if offset[0] == "+" else -shift
            except OverflowError:  # past year 1 or 9999 in UTC
                return None
        return moment

    return read


_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTH_NAMES = tuple(name.capitalize() for name in _MONTHS)
_ORDINALS = ("1st", "2nd", "3rd", "4th")
_UTC_TEXT = {("X", 1): "Z", ("X", 2): "Z", ("X", 3): "Z", ("x", 1): "+00", ("x", 2): "+0000", ("x", 3): "+00:00",
             ("Z", 1): "+0000", ("Z", 2): "+0000", ("Z", 3): "+0000", ("Z", 4): "GMT", ("Z", 5): "Z",
             ("z", 1): "UTC", ("z", 2): "UTC", ("z", 3): "UTC", ("z", 4): "Coordinated Universal Time",
             ("V", 2): "UTC", ("O", 1): "GMT", ("O", 4): "GMT"}
"""What the letters of an offset or a zone write in Spark's session zone, UTC."""
ZONE_LETTERS = frozenset(letter for letter, _ in _UTC_TEXT)
_HOURS: dict[str, Callable[[int], int]] = {"H": lambda h: h, "h": lambda h: h % 12 or 12, "K": lambda h: h % 12,
                                           "k": lambda h: h or 24}


def _number(count: int, of: Callable[[datetime.datetime], int]) -> Callable[[datetime.datetime], str]:
    """A number in at least ``count`` digits (java.time's ``appendValue``; one: as many as it has)."""
    return lambda t: str(of(t)).zfill(count)


def _written(letter: str, count: int) -> Callable[[datetime.datetime], str] | None:
    """How a run of one pattern letter writes a time, as Spark's ``date_format``; None when unwritten."""
    if letter == "y" and count == 2:
        return lambda t: f"{t.year % 100:02d}"
    if letter == "y" and count <= 4:  # years up to 9999: never the sign java.time puts on five digits
        return _number(count, lambda t: t.year)
    if letter in "ML" and count <= 2:
        return _number(count, lambda t: t.month)
    if letter in "ML" and count <= 4:
        return lambda t: _MONTH_NAMES[t.month - 1][:3 if count == 3 else None]
    if letter == "d" and count <= 2:
        return _number(count, lambda t: t.day)
    if letter == "D" and count <= 3:
        return _number(count, lambda t: t.timetuple().tm_yday)
    if letter in "Qq" and count <= 2:
        return _number(count, lambda t: (t.month + 2) // 3)
    if letter == "Q" and count <= 4:
        return lambda t: f"Q{(t.month + 2) // 3}" if count == 3 else f"{_ORDINALS[(t.month - 1) // 3]} quarter"
    if letter == "E" and count <= 4:
        return lambda t: _DAYS[t.weekday()][:3 if count < 4 else None]
    if letter == "a" and count == 1:
        return lambda t: "AM" if t.hour < 12 else "PM"
    if letter in _HOURS and count <= 2:
        return _number(count, lambda t: _HOURS[letter](t.hour))
    if letter in "ms" and count <= 2:
        return _number(count, lambda t: t.minute if letter == "m" else t.second)
    if letter == "S" and count <= 9:
        return lambda t: f"{t.microsecond:06d}000"[:count]
    if (letter, count) in _UTC_TEXT:
        text = _UTC_TEXT[letter, count]
        return lambda _: text
    return None


@functools.lru_cache(maxsize=64)
def pattern_writer(pattern: str) -> Callable[[datetime.datetime], str] | None:
    """A writer of a time (of years 1 to 9999) in ``pattern``, as Spark's ``date_format`` in its
    session zone, UTC: the letters above and these (English names, Spark's locale):

    - ``y`` (as many digits as it has), ``yy`` (the last two), ``yyy``, ``yyyy`` (at least as
      many); ``M`` or ``L`` once or twice (a number), three times (``Nov``), four (``November``);
    - ``d``, ``dd``; ``D`` to ``DDD`` (the day of the year); ``Q`` and ``q`` (the quarter: ``4``,
      ``04``), ``QQQ`` (``Q4``), ``QQQQ`` (``4th quarter``); ``E`` to ``EEE`` (``Tue``), ``EEEE``
      (``Tuesday``); ``a``; ``H``, ``h``, ``K`` (0-11), ``k`` (1-24), ``m``, ``s``, each once or
      twice; ``S`` up to nine times (the fraction's first digits);
    - an offset's or a zone's letters, as they write UTC (``XXX`` ``Z``, ``xx`` ``+0000``, ``z``
      ``UTC``, ``O`` ``GMT``, ...).

    None when the pattern has another letter, a count of one Spark refuses or does not write
    as here, or an optional section (``[`` ``]``; ``{`` and ``#`` Spark refuses)."""
    parts: list[str | Callable[[datetime.datetime], str]] = []
    for token in _TOKENS.finditer(pattern):
        text = token.group()
        if token.group(1) is not None:
            written = _written(text[0], len(text))
            if written is None:
                return None
            parts.append(written)
        elif text.startswith("'"):
            if not _quoted_as_spark(text):
                return None
            parts.append("'" if text == "''" else text[1:-1])
        elif text in _OPTIONAL:
            return None
        else:
            parts.append(text)
    return lambda t: "".join(p if isinstance(p, str) else p(t) for p in parts)


def pattern_letters(pattern: str) -> frozenset[str]:
    """The letters a pattern uses (not those quoted)."""
    return frozenset(token.group(1) for token in _TOKENS.finditer(pattern) if token.group(1) is not None)
