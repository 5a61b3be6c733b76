"""A micro-batch's group rows summed into each partition's slice: the first and last
offset and the record count cover every row of the partition, whatever its kind."""

from __future__ import annotations

from services.worker.query_runner import _slices


def test_each_partition_spans_all_its_rows_and_counts_them() -> None:
    rows = [
        {"_partition": 0, "_lo": 10, "_hi": 40, "_n": 25},  # one key's GOOD records
        {"_partition": 0, "_lo": 5, "_hi": 5, "_n": 1},  # a bad record before them
        {"_partition": 0, "_lo": 12, "_hi": 44, "_n": 4},  # records the WHERE skipped
        {"_partition": 3, "_lo": 100, "_hi": 100, "_n": 1},
    ]
    slices = _slices(rows)
    assert sorted(slices) == [0, 3]
    assert (slices[0].first_offset, slices[0].last_offset, slices[0].count) == (5, 44, 30)
    assert (slices[3].first_offset, slices[3].last_offset, slices[3].count) == (100, 100, 1)
    assert _slices([]) == {}
