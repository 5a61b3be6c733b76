"""ksqlDB's time functions: epoch milliseconds, TIMESTAMPs and DATEs written as text and read from it
with java.time's pattern letters, in UTC or a time zone, as Spark computes them for the persistent
queries and as Python does for pulls (``time_patterns`` writes and reads the letters as Spark's
``date_format`` and ``try_to_timestamp``).

A TIMESTAMP is Python's ISO text of its UTC time here, and a DATE its ISO text, as a table's stores
keep them. A pattern and
a zone are written as they are (Spark's functions take any text, but Python must know before the
query runs that it writes and reads them as Spark does).
"""

from __future__ import annotations

import datetime
import functools
import re
import time
import zoneinfo
from collections.abc import Callable
from importlib import resources
from typing import Any

from millpond.shared.kafka.time_patterns import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ZONE_LETTERS,
    moment_reader,
    pattern_letters,
    pattern_writer,
)
from millpond.shared.sql.ast import literal_text, to_sql

_EPOCH = datetime.datetime(1970, 1, 1)
_MILLI = datetime.timedelta(milliseconds=1)
_MICRO = datetime.timedelta(microseconds=1)
_DAY = datetime.timedelta(days=1)
FORMATTED = (datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999))
"""The times written as text in UTC (Python's datetime's); in a zone, a day less at each end, so
that the zone's time stays a datetime. Outside, the text is NULL."""
IN_A_ZONE = (FORMATTED[0] + _DAY, FORMATTED[1] - _DAY)
_FORMATTED_MICROS = tuple((t - _EPOCH) // _MICRO for t in FORMATTED)
_OFFSET = re.compile(r"([+-])([0-9]{2})(?::([0-9]{2}))?")


def _millis(moment: datetime.datetime) -> int:
    return (moment - _EPOCH) // _MILLI


@functools.cache
def _regions() -> frozenset[str]:
    """The tz database's regions (``Area/City``) in the pinned ``tzdata``."""
    return frozenset(name for name in resources.files("tzdata").joinpath("zones").read_text().split() if "/" in name)


def _region(name: str) -> datetime.tzinfo:
    """A region's rules as ``tzdata`` has them: the JVM's tz database is built the same way (its
    links made one zone, no history before 1970 kept apart), where the system's may not be."""
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as rules:
        return zoneinfo.ZoneInfo.from_file(rules, key=name)


@functools.lru_cache(maxsize=256)
def zone_of(name: str) -> datetime.tzinfo | None:
    """A time zone as Spark reads its name (java.time's ``ZoneId``): ``UTC``, ``GMT`` or ``Z``, an
    offset (``+01``, ``-05:30``), or a region (``America/Los_Angeles``, by the tz database);
    None for a name this does not read the same way."""
    if name in ("UTC", "GMT", "Z"):
        return datetime.UTC
    offset = _OFFSET.fullmatch(name)
    if offset is not None:
        shift = datetime.timedelta(hours=int(offset[2]), minutes=int(offset[3] or 0))
        if shift > datetime.timedelta(hours=18) or int(offset[3] or 0) > 59:
            return None
        return datetime.timezone(shift if offset[1] == "+" else -shift)
    return _region(name) if name in _regions() else None


def _in_zone(moment: datetime.datetime, zone: str | None) -> datetime.datetime | None:
    """A UTC time as the wall clock of ``zone`` shows it (Spark's ``from_utc_timestamp``)."""
    low, high = FORMATTED if zone is None else IN_A_ZONE
    if not low <= moment <= high:
        return None
    if zone is None:
        return moment
    tz = zone_of(zone)
    assert tz is not None, zone  # the call was refused otherwise
    return moment.replace(tzinfo=datetime.UTC).astimezone(tz).replace(tzinfo=None)


def _written(moment: datetime.datetime | None, pattern: str, zone: str | None) -> str | None:
    local = None if moment is None else _in_zone(moment, zone)
    writer = pattern_writer(pattern)
    assert writer is not None, pattern
    return None if local is None else writer(local)


def timestamp_to_string(millis: int, pattern: str, zone: str | None = None) -> str | None:
    """TIMESTAMPTOSTRING: epoch milliseconds as text."""
    try:
        moment = _EPOCH + millis * _MILLI
    except OverflowError:
        moment = None
    return _written(moment, pattern, zone)


def format_timestamp(timestamp: str, pattern: str, zone: str | None = None) -> str | None:
    """FORMAT_TIMESTAMP: a TIMESTAMP (its ISO text) as text."""
    return _written(datetime.datetime.fromisoformat(timestamp), pattern, zone)


def _read(text: str, pattern: str, zone: str | None) -> int | None:
    """Text read as a time in ``pattern``, in microseconds from the epoch: its offset's, else the
    zone's (java.time's: a wall time a change of offset skips moves on by the change, one it
    repeats takes the earlier offset; Python's first ``fold`` gives the same instants), else UTC."""
    reader = moment_reader(pattern)
    assert reader is not None, pattern
    moment = reader(text)
    if moment is None:
        return None
    micros = (moment - _EPOCH) // _MICRO
    if zone is not None:
        tz = zone_of(zone)
        assert tz is not None, zone
        offset = tz.utcoffset(moment)
        micros -= 0 if offset is None else offset // _MICRO
    return micros


def string_to_timestamp(text: str, pattern: str, zone: str | None = None) -> int | None:
    """STRINGTOTIMESTAMP: text as epoch milliseconds (Spark's ``unix_millis``: floored), NULL
    outside years 1 to 9999 in UTC (as the Spark SQL is guarded: Spark reads a year 0)."""
    micros = _read(text, pattern, zone)
    low, high = _FORMATTED_MICROS
    return None if micros is None or not low <= micros <= high else micros // 1000


def _timestamp(micros: int | None) -> str | None:
    """A TIMESTAMP's ISO text, NULL outside the times Millpond holds (as the Spark SQL is guarded)."""
    if micros is None:
        return None
    try:
        moment = _EPOCH + micros * _MICRO
    except OverflowError:
        return None
    return moment.isoformat() if EARLIEST_TIMESTAMP <= moment <= LATEST_TIMESTAMP else None


def parse_timestamp(text: str, pattern: str, zone: str | None = None) -> str | None:
    """PARSE_TIMESTAMP: text as a TIMESTAMP."""
    return _timestamp(_read(text, pattern, zone))


def from_unixtime(millis: int) -> str | None:
    """FROM_UNIXTIME: epoch milliseconds as a TIMESTAMP."""
    return _timestamp(millis * 1000)


def now_millis() -> int:
    """UNIX_TIMESTAMP(): the epoch milliseconds now."""
    return time.time_ns() // 1_000_000


def today_days() -> int:
    """UNIX_DATE(): today's days from the epoch (UTC, the sessions' time zone)."""
    return now_millis() // 86_400_000


def unix_timestamp(timestamp: str) -> int:
    """UNIX_TIMESTAMP: a TIMESTAMP's epoch milliseconds."""
    return _millis(datetime.datetime.fromisoformat(timestamp))


_EPOCH_DAY = datetime.date(1970, 1, 1)
FIRST_DAY, LAST_DAY = (datetime.date(1, 1, 1) - _EPOCH_DAY).days, (datetime.date(9999, 12, 31) - _EPOCH_DAY).days
"""The days from the epoch a DATE may be (Python's date's years); outside, NULL."""


def format_date(date: str, pattern: str) -> str | None:
    """FORMAT_DATE: a DATE (its ISO text) as text."""
    return _written(datetime.datetime.fromisoformat(date), pattern, None)


def parse_date(text: str, pattern: str) -> str | None:
    """PARSE_DATE: text as a DATE."""
    reader = moment_reader(pattern)
    assert reader is not None, pattern
    moment = reader(text)
    return None if moment is None else moment.date().isoformat()


def from_days(days: int) -> str | None:
    """FROM_DAYS: days from the epoch as a DATE."""
    return (_EPOCH_DAY + datetime.timedelta(days=days)).isoformat() if FIRST_DAY <= days <= LAST_DAY else None


def unix_date(date: str) -> int:
    """UNIX_DATE: a DATE's days from the epoch."""
    return (datetime.date.fromisoformat(date) - _EPOCH_DAY).days


def from_days_in_spark(args: list[str]) -> str:
    return _guarded(args[0], str(FIRST_DAY), str(LAST_DAY), f"date_from_unix_date(CAST({args[0]} AS INT))")


def parse_date_in_spark(args: list[str]) -> str:
    """A date Python's holds (Spark reads a year 0: ``'0000-06-01'``), else NULL."""
    read = f"CAST(try_to_timestamp({args[0]}, {args[1]}) AS DATE)"
    return _guarded(read, "DATE'0001-01-01'", "DATE'9999-12-31'", read)


def _spark_time(moment: datetime.datetime) -> str:
    return f"TIMESTAMP'{moment.isoformat(' ')}'"


def _guarded(value: str, low: str, high: str, then: str) -> str:
    return f"CASE WHEN {value} BETWEEN {low} AND {high} THEN {then} END"


def _millis_span(span: tuple[datetime.datetime, datetime.datetime]) -> tuple[str, str]:
    low, high = span
    return str(_millis(low)), str(_millis(high))


def _time_of_millis(millis: str, span: tuple[datetime.datetime, datetime.datetime]) -> str:
    """Spark SQL of epoch milliseconds as a timestamp, NULL outside ``span`` (beyond a long's
    microseconds ``timestamp_millis`` fails the batch, whatever the ANSI mode)."""
    return _guarded(millis, *_millis_span(span), f"timestamp_millis({millis})")


def _format_in_spark(time: str, args: list[str]) -> str:
    """``date_format`` of a timestamp (within ``IN_A_ZONE`` when a zone is given) in UTC or the zone."""
    local = time if len(args) < 3 else f"from_utc_timestamp({time}, {args[2]})"
    return f"date_format({local}, {args[1]})"


def timestamp_to_string_in_spark(args: list[str]) -> str:
    return _format_in_spark(_time_of_millis(args[0], FORMATTED if len(args) < 3 else IN_A_ZONE), args)


def format_timestamp_in_spark(args: list[str]) -> str:
    low, high = map(_spark_time, IN_A_ZONE)
    time = args[0] if len(args) < 3 else _guarded(args[0], low, high, args[0])
    return _format_in_spark(time, args)


def _read_in_spark(args: list[str]) -> str:
    read = f"try_to_timestamp({args[0]}, {args[1]})"
    return read if len(args) < 3 else f"to_utc_timestamp({read}, {args[2]})"


def string_to_timestamp_in_spark(args: list[str]) -> str:
    read = _read_in_spark(args)
    low, high = map(_spark_time, FORMATTED)
    return _guarded(read, low, high, f"unix_millis({read})")


def parse_timestamp_in_spark(args: list[str]) -> str:
    read = _read_in_spark(args)
    return _guarded(read, _spark_time(EARLIEST_TIMESTAMP), _spark_time(LATEST_TIMESTAMP), read)


def from_unixtime_in_spark(args: list[str]) -> str:
    return _time_of_millis(args[0], (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP))


WRITTEN_LETTERS = ("y M L d D Q q E a H h K k m s S, once or twice (y, M, L, Q and E up to four times, D three, "
                   "S nine), and the offset and zone letters X x Z z V O, which write UTC")
READ_LETTERS = ("yyyy yy M MM MMM MMMM d dd H HH h hh (with a) m mm s ss, S up to nine times, "
                "and offsets X XX XXX x xx xxx Z ZZ ZZZ")


TIME_OF_DAY_LETTERS = frozenset("aHhKkmsS") | ZONE_LETTERS


def refusal(name: str, pattern_at: int, writes: bool, dates: bool = False) -> Callable[[tuple[Any, ...], list[Any]], str | None]:
    """Why a call of the time function ``name`` is refused: its pattern (argument ``pattern_at``)
    or its zone (the one after) not written as it is, a pattern with a letter Python does not
    write (or read) as Spark, or a zone with a pattern of offset letters (Spark's zone functions
    move the wall clock, not the offset such a pattern writes or reads); for ``dates``, a letter
    of the time of day (a DATE has none: java.time refuses it, as ksqlDB's do)."""
    def refuses(args: tuple[Any, ...], _types: list[Any]) -> str | None:
        pattern = literal_text(args[pattern_at])
        if pattern is None:
            return f"{name}'s pattern must be text written as it is ('yyyy-MM-dd HH:mm:ss'), not {to_sql(args[pattern_at])}"
        if dates and pattern_letters(pattern) & TIME_OF_DAY_LETTERS:
            used = "".join(sorted(pattern_letters(pattern) & TIME_OF_DAY_LETTERS))
            return f"{name}'s pattern {pattern!r} has letters of a time of day or a zone ({used}), which a DATE has not"
        if (pattern_writer if writes else moment_reader)(pattern) is None:
            letters = WRITTEN_LETTERS if writes else READ_LETTERS
            return (f"{name} cannot {'write' if writes else 'read'} the pattern {pattern!r}: use the letters {letters}, "
                    "other characters, and text in single quotes ('T'; '' alone for a quote, none inside)")
        if len(args) <= pattern_at + 1:
            return None
        unread = _zone_refusal(name, args[pattern_at + 1])
        if unread is not None:
            return unread
        if pattern_letters(pattern) & ZONE_LETTERS:
            return f"{name} with a time zone cannot use the offset and zone letters (X x Z z V O) in its pattern {pattern!r}"
        return None
    return refuses


def _zone_refusal(name: str, arg: Any) -> str | None:
    """Why the zone ``arg`` of a call of ``name`` is refused: not written as it is, or a name
    Python does not read as Spark (``zone_of``)."""
    zone = literal_text(arg)
    if zone is None or zone_of(zone) is None:
        return (f"{name}'s time zone must be written as it is: UTC, an offset ('+01:00') or a region of the tz "
                f"database ('America/Los_Angeles', as spelled there), not {to_sql(arg)}")
    return None


def zones_refusal(name: str, zones_at: tuple[int, ...]) -> Callable[[tuple[Any, ...], list[Any]], str | None]:
    """Why a call of ``name`` is refused: a zone (the arguments at ``zones_at``) it cannot read."""
    def refuses(args: tuple[Any, ...], _types: list[Any]) -> str | None:
        return next((why for at in zones_at if (why := _zone_refusal(name, args[at])) is not None), None)
    return refuses


_IN_A_ZONE_MICROS = tuple((t - _EPOCH) // _MICRO for t in IN_A_ZONE)


def convert_tz(timestamp: str, source: str, target: str) -> str | None:
    """CONVERT_TZ: the wall time ``timestamp`` of the zone ``source`` as the zone ``target``'s
    wall clock shows that moment (Spark's ``to_utc_timestamp``, then ``from_utc_timestamp``: a
    wall time a change of offset skips moves on by the change, one it repeats takes the earlier
    offset, as ``_read``); NULL past the times Millpond holds."""
    moment = datetime.datetime.fromisoformat(timestamp)
    source_tz, target_tz = zone_of(source), zone_of(target)
    assert source_tz is not None and target_tz is not None, (source, target)  # the call was refused otherwise
    offset = source_tz.utcoffset(moment)
    micros = (moment - _EPOCH) // _MICRO - (0 if offset is None else offset // _MICRO)
    # The target's offset at that moment; one past a datetime's years is the last day's (no zone
    # changes its offset at the new year).
    low, high = _IN_A_ZONE_MICROS
    at = (_EPOCH + min(max(micros, low), high) * _MICRO).replace(tzinfo=datetime.UTC).astimezone(target_tz)
    shift = at.utcoffset()
    return _timestamp(micros + (0 if shift is None else shift // _MICRO))


def convert_tz_in_spark(args: list[str]) -> str:
    moved = f"from_utc_timestamp(to_utc_timestamp({args[0]}, {args[1]}), {args[2]})"
    return _guarded(moved, _spark_time(EARLIEST_TIMESTAMP), _spark_time(LATEST_TIMESTAMP), moved)


UNIT_MICROS = {name: micros for names, micros in (
    (("MILLISECOND", "MILLISECONDS"), 1_000), (("SECOND", "SECONDS"), 1_000_000), (("MINUTE", "MINUTES"), 60_000_000),
    (("HOUR", "HOURS"), 3_600_000_000), (("DAY", "DAYS"), 86_400_000_000)) for name in names}
"""ksqlDB's time units (TIMESTAMPADD(MINUTES, 5, ts)), in microseconds: a duration, as ksqlDB adds it."""
UNIT_FIRST = frozenset({"TIMESTAMPADD", "TIMESTAMPSUB", "DATEADD", "DATESUB"})
"""Functions whose first argument is a unit written as a word (the parser makes it text)."""
_SPAN_MICROS = (LATEST_TIMESTAMP - EARLIEST_TIMESTAMP) // _MICRO
_SPAN_DAYS = LAST_DAY - FIRST_DAY


def timestamp_add(unit: str, amount: int, timestamp: str, sign: int = 1) -> str | None:
    """TIMESTAMPADD (TIMESTAMPSUB with ``sign`` -1): a TIMESTAMP moved by ``amount`` units; NULL
    past the times Millpond holds."""
    if abs(amount) > _SPAN_MICROS // UNIT_MICROS[unit.upper()]:
        return None
    return _timestamp((datetime.datetime.fromisoformat(timestamp) - _EPOCH) // _MICRO + sign * amount * UNIT_MICROS[unit.upper()])


def date_add(unit: str, amount: int, date: str, sign: int = 1) -> str | None:
    """DATEADD (DATESUB with ``sign`` -1): a DATE moved by ``amount`` days."""
    return from_days(unix_date(date) + sign * amount) if abs(amount) <= _SPAN_DAYS else None


def timestamp_add_in_spark(sign: int) -> Callable[[list[str]], str]:
    def in_spark(args: list[str]) -> str:
        unit, amount, timestamp = args
        micros = UNIT_MICROS[_unit_of(unit)]
        moved = f"timestamp_micros(unix_micros({timestamp}) + {'-' if sign < 0 else ''}CAST({amount} AS BIGINT) * {micros})"
        low, high = _spark_time(EARLIEST_TIMESTAMP), _spark_time(LATEST_TIMESTAMP)
        bound = _SPAN_MICROS // micros
        return f"CASE WHEN {amount} BETWEEN -{bound} AND {bound} AND {moved} BETWEEN {low} AND {high} THEN {moved} END"
    return in_spark


def date_add_in_spark(sign: int) -> Callable[[list[str]], str]:
    def in_spark(args: list[str]) -> str:
        _, amount, date = args
        days = f"(CAST(unix_date({date}) AS BIGINT) {'-' if sign < 0 else '+'} CAST({amount} AS BIGINT))"
        return f"CASE WHEN {amount} BETWEEN -{_SPAN_DAYS} AND {_SPAN_DAYS} THEN {from_days_in_spark([days])} END"
    return in_spark


def _unit_of(spark_text: str) -> str:
    """A unit's name from its Spark SQL literal (``'MINUTES'``)."""
    return spark_text.strip("'").upper()


def unit_refusal(name: str, dates: bool) -> Callable[[tuple[Any, ...], list[Any]], str | None]:
    units = ("DAYS",) if dates else ("MILLISECONDS", "SECONDS", "MINUTES", "HOURS", "DAYS")

    def refuses(args: tuple[Any, ...], _types: list[Any]) -> str | None:
        unit = literal_text(args[0])
        if unit is None or unit.upper() not in UNIT_MICROS or (dates and UNIT_MICROS[unit.upper()] != UNIT_MICROS["DAYS"]):
            return f"{name}'s unit is one of {', '.join(units)} (or the singular), written as a word: {name}({units[-1]}, 1, ...)"
        return None
    return refuses
