"""A TIMESTAMP_FORMAT pattern read in Python (``time_patterns``: a stream-table join's table
side) gives the time Spark's ``try_to_timestamp`` gives the persistent queries, or none where
Spark's gives NULL."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession

from millpond.shared.kafka.time_patterns import pattern_reader

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
