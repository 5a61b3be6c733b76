"""A TIMESTAMP_FORMAT pattern read in Python (``time_patterns``: a stream-table join's table
side) gives the time Spark's ``try_to_timestamp`` gives the persistent queries, or none where
Spark's gives NULL; the time functions (``times``: pulls, pushes) write and read times in UTC and
in time zones as the Spark SQL of the persistent queries does."""

from __future__ import annotations

import datetime
import random
import re

import pytest
from pyspark.sql import SparkSession

from millpond.shared.errors import StatementError
from millpond.shared.kafka.time_patterns import pattern_reader
from millpond.shared.sql import ast, times
from millpond.shared.sql.expressions import evaluate, to_spark
from millpond.shared.sql.types import Scope, check, with_widths
from tests.unit.services.worker.test_expressions_as_spark import expression

PATTERNS = {
    "yyyy-MM-dd HH:mm:ss": ["2026-01-02 03:04:05", "2026-1-02 03:04:05", "2026-02-30 00:00:00", "2026-01-02 24:00:00",
                            "2026-01-02 03:04:05 ", "2026-01-02T03:04:05", "1969-12-31 23:59:59", "0999-01-01 00:00:00"],
    "yyyy-MM-dd'T'HH:mm:ss.SSS": ["2026-01-02T03:04:05.678", "2026-01-02T03:04:05.6", "2026-01-02t03:04:05.678",
                                  "2026-01-02T03:04:05", "2026-01-02T03:04:05.6789", "1969-12-31T23:59:59.999"],
    "yyyy-MM-dd'T'HH:mm:ssXXX": ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05+01:30", "2026-01-02T03:04:05-05:00",
                                 "2026-01-02T03:04:05+0130", "2026-01-02T03:04:05z", "2026-01-02T03:04:05+19:00"],
    "yyyy-MM-dd HH:mm:ss.SSSZ": ["2026-01-02 03:04:05.678+0200", "2026-01-02 03:04:05.678Z", "2026-01-02 03:04:05.678-0000"],
    "yyyyMMddHHmmss": ["20260102030405", "2026010203040", "202601020304056"],
    "dd/MM/yyyy HH:mm": ["02/01/2026 03:04", "2/1/2026 03:04", "31/04/2026 10:00"],
    "d/M/yy h:mm a": ["2/1/26 3:04 PM", "2/1/26 3:04 am", "12/12/26 12:00 AM", "2/1/26 13:04 PM", "2/1/26 0:04 AM"],
    "dd MMM yyyy": ["02 Jan 2026", "02 jan 2026", "02 JAN 2026", "02 January 2026", "30 Feb 2026"],
    "MMMM d, yyyy": ["January 2, 2026", "february 28, 2026", "Jan 2, 2026"],
    "yyyy-MM-dd": ["2026-01-02", "2026-13-01", "2026-00-10"],
    "HH:mm:ss": ["03:04:05", "23:59:59"],
    "yyyy-MM-dd HH:mm:ss.SSSSSS": ["2026-01-02 03:04:05.123456", "2026-01-02 03:04:05.1234"],
    "yyyy-MM-dd'T'HH:mm:ssX": ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05+01", "2026-01-02T03:04:05+0130"],
    "'at' HH:mm 'on' yyyy-MM-dd": ["at 03:04 on 2026-01-02", "AT 03:04 ON 2026-01-02"],
    "yyyy-MM-dd HH:mmx": ["2026-01-02 03:04+01", "2026-01-02 03:04+0130", "2026-01-02 03:04+0030", "2026-01-02 03:04Z"],
    "yyyy-MM-dd HH:mmxx": ["2026-01-02 03:04+0130", "2026-01-02 03:04+01:30", "2026-01-02 03:04+1830"],
    "yyyy-MM-dd HH:mmxxx": ["2026-01-02 03:04+01:30", "2026-01-02 03:04+18:00", "2026-01-02 03:04-18:01"],
    "yyyy-MM-dd HH:mmXX": ["2026-01-02 03:04Z", "2026-01-02 03:04+0130", "2026-01-02 03:04+01"],
    "yyyy-MM-dd HH:mmZZ": ["2026-01-02 03:04+0130", "2026-01-02 03:04-0000"],
    "yyyy-MM-dd 'x'": ["20260-01-02 x", "\uff12\uff10\uff12\uff16-01-02 x", "2026-01-02 X"],
}


def test_patterns_read_text_as_sparks_try_to_timestamp(spark: SparkSession) -> None:
    draw = random.Random(5)
    cases = [(pattern, text) for pattern, texts in PATTERNS.items() for text in texts]
    # Random times in the first pattern, some of them bent out of shape.
    for _ in range(200):
        text = (f"{draw.randint(1900, 2100):04d}-{draw.randint(0, 13):02d}-{draw.randint(0, 32):02d} "
                f"{draw.randint(0, 24):02d}:{draw.randint(0, 60):02d}:{draw.randint(0, 60):02d}")
        cases.append(("yyyy-MM-dd HH:mm:ss", text))
    rows = spark.createDataFrame(cases, "p STRING, t STRING").selectExpr("unix_millis(try_to_timestamp(t, p))").collect()
    python = {(pattern, text): reader(text) if (reader := pattern_reader(pattern)) is not None else "unread"
              for pattern, text in cases}
    assert python == {case: row[0] for case, row in zip(cases, rows, strict=True)}


@pytest.mark.parametrize("pattern", ["yyyy-MM-dd HH:mm z", "yyyy-MM-dd h:mm", "yyyy-yyyy", "D", "yyyy-MM-dd HH:mm VV",
                                     "G yyyy", "yyyy-MM-dd kk:mm", "yyyy-MM-dd HH:mm O"])
def test_a_pattern_with_a_letter_not_read_here_has_no_reader(pattern: str) -> None:
    assert pattern_reader(pattern) is None


def test_text_past_the_years_python_holds_reads_as_no_time() -> None:
    """An offset that takes the time past year 1 or 9999 in UTC: no time (the record keeps its
    own), not an error that would fail the join task on every retry."""
    read = pattern_reader("yyyy-MM-dd HH:mmXXX")
    assert read is not None
    assert read("0001-01-01 00:00+01:00") is None and read("9999-12-31 23:59-01:00") is None
    assert pattern_reader("yyyy-MM-dd[ HH:mm:ss]") is None, "optional sections are not read here"


TIMES = Scope("T", {"M": ast.SqlType("BIGINT"), "T": ast.SqlType("TIMESTAMP"), "S": ast.SqlType("VARCHAR"),
                    "D": ast.SqlType("DATE")})
WRITTEN = ["yyyy-MM-dd HH:mm:ss.SSS", "y yy yyy yyyy", "M MM MMM MMMM L LL LLL LLLL", "d dd D DD DDD", "Q QQ QQQ QQQQ q qq",
           "E EE EEE EEEE", "h hh a K KK k kk H HH", "m mm s ss", "S SS SSS SSSS SSSSS SSSSSS SSSSSSS SSSSSSSS SSSSSSSSS",
           "yyyy-MM-dd'T'HH:mm:ss 'at' '' -/,.:_", "dd/MMM/yyyy:HH:mm:ss",
           "X XX XXX x xx xxx Z ZZ ZZZ ZZZZ ZZZZZ", "z zz zzz zzzz VV O OOOO"]
ZONES = [None, "UTC", "America/Los_Angeles", "Asia/Kolkata", "Australia/Lord_Howe", "+05:45", "-03", "Asia/Tokyo", "GMT"]
"""UTC; zones with summer time (Lord Howe's by half an hour), without, offsets."""


def _calls(function: str, argument: str, patterns: list[str]) -> list[str]:
    return [f"{function}({argument}, '{p.replace(chr(39), chr(39) * 2)}'" + (f", '{zone}')" if zone else ")")
            for p in patterns for zone in ZONES if zone is None or not re.search("[XxZzVO]", p.replace("'", ""))]


def _differing(spark: SparkSession, texts: list[str], rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """Each call's value in Python and in Spark over ``rows``, where they differ."""
    exprs = [with_widths(expression(text), TIMES) for text in texts]
    rows = [{"D": None, **row} for row in rows]
    frame = spark.createDataFrame([(r["M"], r["T"] and datetime.datetime.fromisoformat(str(r["T"])), r["S"],
                                    r["D"] and datetime.date.fromisoformat(str(r["D"]))) for r in rows],
                                  "M BIGINT, T TIMESTAMP, S STRING, D DATE")
    spark_rows = frame.selectExpr(*(to_spark(e, TIMES) for e in exprs)).collect()
    return [(row, text, ours, theirs) for row, spark_row in zip(rows, spark_rows, strict=True)
            for text, e, theirs in zip(texts, exprs, spark_row, strict=True)
            if (ours := evaluate(e, row)) != (theirs.isoformat() if isinstance(theirs, datetime.date) else theirs)]


def test_times_are_written_as_sparks_date_format(spark: SparkSession) -> None:
    """TIMESTAMPTOSTRING and FORMAT_TIMESTAMP over random times of years 1 to 9999 and the ends
    of what they write (a millisecond past, NULL; in a zone a day in from each end), every letter
    they take, in UTC and in zones: as Spark's ``date_format`` (of ``from_utc_timestamp``)."""
    draw = random.Random(11)
    low, high = (times._millis(t) for t in times.FORMATTED)
    zoned_low, zoned_high = (times._millis(t) for t in times.IN_A_ZONE)
    millis = [0, -1, 1700000000123, low, high, low - 1, high + 1, zoned_low, zoned_high, zoned_low - 1, zoned_high + 1,
              2**63 - 1, -(2**63), *(draw.randint(low, high) for _ in range(40)),
              *(draw.randint(-(2**41), 2**41) for _ in range(40))]
    earliest, latest = (times._millis(t) * 1000 for t in (times.EARLIEST_TIMESTAMP, times.LATEST_TIMESTAMP))
    stamps = [times._EPOCH + datetime.timedelta(microseconds=draw.randint(earliest, latest)) for _ in range(len(millis) - 3)]
    stamps += [times.EARLIEST_TIMESTAMP, times.LATEST_TIMESTAMP, None]
    rows: list[dict[str, object]] = [{"M": m, "T": t and t.isoformat(), "S": None} for m, t in zip(millis, stamps, strict=True)]
    texts = _calls("TIMESTAMPTOSTRING", "m", WRITTEN) + _calls("FORMAT_TIMESTAMP", "t", WRITTEN)
    texts += ["TIMESTAMPADD(MILLISECONDS, m, t)", "TIMESTAMPSUB(MILLISECOND, m, t)", "TIMESTAMPADD(DAYS, m / 86400000, t)",
              "TIMESTAMPSUB(HOURS, m / 3600000, t)", "TIMESTAMPADD(minutes, 5, t)", "TIMESTAMPADD(SECONDS, -2, t)"]
    assert _differing(spark, texts, rows) == []
    assert evaluate(expression("TIMESTAMPTOSTRING(1700000000123, 'yyyy-MM-dd HH:mm:ss.SSS', 'America/Los_Angeles')"), {}) \
        == "2023-11-14 14:13:20.123"


def test_text_is_read_as_times_as_sparks_try_to_timestamp(spark: SparkSession) -> None:
    """STRINGTOTIMESTAMP and PARSE_TIMESTAMP, in UTC, by the text's offset and in zones, where a
    change of offset skips or repeats a wall time too (Los Angeles' and Lord Howe's summer time);
    UNIX_TIMESTAMP and FROM_UNIXTIME at the ends of the times Millpond holds."""
    draw = random.Random(13)
    texts_read = ["2024-03-10 02:30:00.123456", "2024-11-03 01:30:00", "2024-04-07 01:45:00", "2024-10-06 02:15:00",
                  "0001-01-01 00:00:00", "0001-01-02 05:00:00", "0000-06-01 00:00:00",
                  "0001-01-01 00:30:00", "9999-12-31 23:59:59.999999", "2024-02-30 00:00:00", "x", "",
                  *(f"{draw.randint(1, 9999):04d}-{draw.randint(1, 12):02d}-{draw.randint(1, 28):02d} "
                    f"{draw.randint(0, 23):02d}:{draw.randint(0, 59):02d}:{draw.randint(0, 59):02d}."
                    f"{draw.randint(0, 999999):06d}" for _ in range(40))]
    rows: list[dict[str, object]] = [{"M": None, "T": None, "S": text} for text in texts_read]
    rows += [{"M": m, "T": None, "S": t} for m, t in [
        (times._millis(times.EARLIEST_TIMESTAMP), "2026-01-02 03:04+0130"), (times._millis(times.EARLIEST_TIMESTAMP) - 1, None),
        (times._millis(times.LATEST_TIMESTAMP), "2026-01-02 03:04Z"), (times._millis(times.LATEST_TIMESTAMP) + 1, None),
        (2**63 - 1, None), (-(2**63), None)]]
    read = ["yyyy-MM-dd HH:mm:ss.SSSSSS", "yyyy-MM-dd HH:mm:ss"]
    texts = _calls("STRINGTOTIMESTAMP", "s", read) + _calls("PARSE_TIMESTAMP", "s", read)
    texts += ["STRINGTOTIMESTAMP(s, 'yyyy-MM-dd HH:mmXX')", "PARSE_TIMESTAMP(s, 'yyyy-MM-dd HH:mmXX')", "FROM_UNIXTIME(m)",
              "UNIX_TIMESTAMP(FROM_UNIXTIME(m))", "UNIX_TIMESTAMP(PARSE_TIMESTAMP(s, 'yyyy-MM-dd HH:mm:ss.SSSSSS', 'Asia/Tokyo'))"]
    assert _differing(spark, texts, rows) == []
    gap = expression("STRINGTOTIMESTAMP('2024-03-10 02:30', 'yyyy-MM-dd HH:mm', 'America/Los_Angeles')")
    assert evaluate(gap, {}) == 1710066600000, "a skipped wall time moves on by the change (10:30 UTC)"


def test_dates_are_written_and_read_as_sparks(spark: SparkSession) -> None:
    """FORMAT_DATE and PARSE_DATE over random dates of years 1 to 9999 with the date letters,
    FROM_DAYS and UNIX_DATE at the ends of what a DATE may be (a day past: NULL, not a failed batch)."""
    draw = random.Random(17)
    days = [times.FIRST_DAY, times.LAST_DAY, times.FIRST_DAY - 1, times.LAST_DAY + 1, 0, -1, 2**31, -(2**31) - 1, 2**63 - 1,
            *(draw.randint(times.FIRST_DAY, times.LAST_DAY) for _ in range(40))]
    dates = [datetime.date(1970, 1, 1) + datetime.timedelta(days=draw.randint(times.FIRST_DAY, times.LAST_DAY))
             for _ in range(len(days) - 3)] + [datetime.date(1, 1, 1), datetime.date(9999, 12, 31), None]
    texts_read = ["2024-02-29", "2023-02-29", "0001-01-01", "9999-12-31", "x", "0000-06-01", *(d.isoformat() for d in dates if d)]
    rows: list[dict[str, object]] = [{"M": m, "T": None, "S": s, "D": d and d.isoformat()}
                                     for m, d, s in zip(days, dates, texts_read + [None] * len(days), strict=False)]
    written = ["yyyy-MM-dd", "y yy yyy yyyy", "M MM MMM MMMM L LL LLL LLLL", "d dd D DD DDD", "Q QQ QQQ QQQQ q qq",
               "E EE EEE EEEE", "dd/MMM/yyyy 'day' D"]
    texts = [f"FORMAT_DATE(d, '{p.replace(chr(39), chr(39) * 2)}')" for p in written]
    texts += ["PARSE_DATE(s, 'yyyy-MM-dd')", "PARSE_DATE(s, 'yyyy-MM-dd''x''')", "FROM_DAYS(m)", "UNIX_DATE(d)",
              "UNIX_DATE(FROM_DAYS(m))", "FORMAT_DATE(PARSE_DATE(s, 'yyyy-MM-dd'), 'dd MMMM yyyy')", "DATEADD(DAYS, m, d)",
              "DATESUB(DAY, m, d)", "DATEADD(DAYS, 30, d)", "DATESUB(DAYS, -1, d)", "DATETOSTRING(m, 'yyyy-MM-dd')",
              "DATETOSTRING(m, 'dd MMM yyyy, EEEE')", "STRINGTODATE(s, 'yyyy-MM-dd')", "STRINGTODATE(s, 'yyyy-MM-dd''x''')"]
    assert _differing(spark, texts, rows) == []
    # ksqlDB's older forms: days from the epoch, written and read.
    assert evaluate(expression("DATETOSTRING(19782, 'yyyy-MM-dd')"), {}) == "2024-02-29"
    assert evaluate(expression("STRINGTODATE('2024-02-29', 'yyyy-MM-dd')"), {}) == 19782
    assert evaluate(expression("STRINGTODATE('2023-02-29', 'yyyy-MM-dd')"), {}) is None


def test_convert_tz_moves_wall_times_between_zones_as_spark(spark: SparkSession) -> None:
    """CONVERT_TZ over random times and the wall times a change of offset skips or repeats (Los
    Angeles' and Lord Howe's summer time), between regions, offsets and UTC, and at the ends of
    the times Millpond holds (past them, NULL): as Spark's ``to_utc_timestamp`` then
    ``from_utc_timestamp``."""
    draw = random.Random(19)
    earliest, latest = (times._millis(t) * 1000 for t in (times.EARLIEST_TIMESTAMP, times.LATEST_TIMESTAMP))
    stamps = [times._EPOCH + datetime.timedelta(microseconds=draw.randint(earliest, latest)) for _ in range(30)]
    stamps += [datetime.datetime(*moment) for moment in [(2024, 3, 10, 2, 30), (2024, 11, 3, 1, 30), (2024, 4, 7, 1, 45),
                                                          (2024, 10, 6, 2, 15), (1900, 1, 1), (1, 1, 2), (1, 1, 2, 17),
                                                          (9999, 12, 31, 23, 59, 59, 999999), (9999, 12, 31, 6)]]
    rows: list[dict[str, object]] = [{"M": None, "T": t.isoformat(), "S": None} for t in stamps] + [{"M": None, "T": None, "S": None}]
    pairs = [("America/Los_Angeles", "UTC"), ("UTC", "America/Los_Angeles"), ("Australia/Lord_Howe", "Asia/Kolkata"),
             ("+05:45", "-03"), ("-18:00", "+18:00"), ("+18:00", "-18:00"), ("Asia/Tokyo", "Asia/Tokyo"), ("GMT", "Europe/Paris")]
    texts = [f"CONVERT_TZ(t, '{source}', '{target}')" for source, target in pairs]
    assert _differing(spark, texts, rows) == []
    skipped = expression("CONVERT_TZ(FROM_UNIXTIME(1710037800000), 'America/Los_Angeles', 'UTC')")  # 02:30, skipped
    assert evaluate(skipped, {}) == "2024-03-10T10:30:00", "a skipped wall time moves on by the change"


def test_every_time_zone_python_knows_is_the_jvms(spark: SparkSession) -> None:
    """Every region of the pinned tz database (``tzdata``, which pulls read) is one Spark knows,
    with the same offsets from year 1 to 9999: a region Spark does not know would fail a
    persistent query's every batch, and one whose history differs would give pulls other times."""
    instants = [datetime.datetime(*moment) for moment in [(1, 1, 2), (1850, 6, 1, 12), (1900, 1, 1), (1945, 8, 1), (1970, 1, 1),
                                                           (2024, 3, 10, 10), (2024, 11, 3, 8), (2024, 7, 1), (2038, 1, 19, 3),
                                                           (2100, 7, 1), (9999, 12, 30)]]
    zones = sorted(times._regions())
    assert len(zones) > 500
    frame = spark.createDataFrame([(t,) for t in instants], "T TIMESTAMP")
    texts = [f"FORMAT_TIMESTAMP(t, 'yyyy-MM-dd HH:mm:ss', '{zone}')" for zone in zones]
    exprs = [with_widths(expression(text), TIMES) for text in texts]
    spark_rows = frame.selectExpr(*(to_spark(e, TIMES) for e in exprs)).collect()
    differing = [(zone, t, ours, theirs) for t, spark_row in zip(instants, spark_rows, strict=True)
                 for zone, e, theirs in zip(zones, exprs, spark_row, strict=True)
                 if (ours := evaluate(e, {"T": t.isoformat()})) != theirs]
    assert differing == []


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMPTOSTRING(m, s)", "TIMESTAMPTOSTRING's pattern must be text written as it is"),
    ("FORMAT_TIMESTAMP(t, NULL)", "FORMAT_TIMESTAMP's pattern must be text written as it is"),
    ("TIMESTAMPTOSTRING(m, 'yyyy-ww')", "TIMESTAMPTOSTRING cannot write the pattern 'yyyy-ww'"),
    ("TIMESTAMPTOSTRING(m, 'yyyyy')", "cannot write the pattern 'yyyyy'"),
    ("TIMESTAMPTOSTRING(m, 'HH''')", "cannot write the pattern \"HH'\""),
    ("FORMAT_TIMESTAMP(t, '''It''''s my'' yyyy')", "cannot write the pattern \"'It''s my' yyyy\""),
    ("STRINGTOTIMESTAMP(s, '''at'''' ''HH')", "STRINGTOTIMESTAMP cannot read the pattern"),
    ("FORMAT_TIMESTAMP(t, 'yyyy[-MM]')", "cannot write the pattern 'yyyy[-MM]'"),
    ("STRINGTOTIMESTAMP(s, 'yyyy-MM-dd EEE')", "STRINGTOTIMESTAMP cannot read the pattern 'yyyy-MM-dd EEE'"),
    ("PARSE_TIMESTAMP(s, 'yyyy', 'america/los_angeles')", "PARSE_TIMESTAMP's time zone must be written as it is"),
    ("PARSE_TIMESTAMP(s, 'yyyy', s)", "PARSE_TIMESTAMP's time zone must be written as it is"),
    ("TIMESTAMPTOSTRING(m, 'yyyy', 'PST')", "TIMESTAMPTOSTRING's time zone must be written as it is"),
    ("TIMESTAMPTOSTRING(m, 'yyyy', '+19:00')", "TIMESTAMPTOSTRING's time zone must be written as it is"),
    ("TIMESTAMPTOSTRING(m, 'HH:mm XXX', 'Asia/Tokyo')", "with a time zone cannot use the offset and zone letters"),
    ("STRINGTOTIMESTAMP(s, 'HH:mmZ', '+01:00')", "with a time zone cannot use the offset and zone letters"),
    ("TIMESTAMPTOSTRING(t, 'yyyy')", "argument 1 of TIMESTAMPTOSTRING must be bigint"),
    ("FORMAT_TIMESTAMP(m, 'yyyy')", "argument 1 of FORMAT_TIMESTAMP must be timestamp"),
    ("UNIX_TIMESTAMP(FROM_UNIXTIME(1), 2)", "UNIX_TIMESTAMP takes 0 to 1 argument(s), got 2"),
    ("FORMAT_DATE(d, 'yyyy-MM-dd HH:mm')", "FORMAT_DATE's pattern 'yyyy-MM-dd HH:mm' has letters of a time of day or a zone (Hm)"),
    ("PARSE_DATE(s, 'yyyy-MM-ddXXX')", "PARSE_DATE's pattern 'yyyy-MM-ddXXX' has letters of a time of day or a zone (X)"),
    ("FORMAT_DATE(t, 'yyyy')", "argument 1 of FORMAT_DATE must be date"),
    ("FROM_DAYS(s)", "argument 1 of FROM_DAYS must be bigint"),
    ("DATEADD(HOURS, 1, d)", "DATEADD's unit is one of DAYS (or the singular)"),
    ("TIMESTAMPADD(WEEKS, 1, t)", "TIMESTAMPADD's unit is one of MILLISECONDS, SECONDS, MINUTES, HOURS, DAYS"),
    ("TIMESTAMPSUB(s, 1, t)", "TIMESTAMPSUB's unit is one of"),
    ("TIMESTAMPADD(DAYS, s, t)", "argument 2 of TIMESTAMPADD must be bigint"),
    ("CONVERT_TZ(t, s, 'UTC')", "CONVERT_TZ's time zone must be written as it is"),
    ("CONVERT_TZ(t, 'UTC', 'PST')", "CONVERT_TZ's time zone must be written as it is: UTC, an offset ('+01:00') or a region"),
    ("CONVERT_TZ(m, 'UTC', 'UTC')", "argument 1 of CONVERT_TZ must be timestamp"),
])
def test_a_time_function_refuses_what_python_would_not_compute_as_spark(text: str, message: str) -> None:
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(text), TIMES)
    assert times.zone_of("Europe/Zagreb") is not None and times.zone_of("+18:00") is not None
