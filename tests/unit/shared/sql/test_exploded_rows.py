"""EXPLODE's rows of one record (ksqlDB's table function): one per item, several EXPLODEs zipped."""

from __future__ import annotations

from millpond.shared.sql.planner import exploded_rows


def test_a_record_makes_a_row_of_each_item_and_explodes_are_zipped() -> None:
    assert list(exploded_rows(["k", [1, 2, 3], "v", ["a"]], [1, 3])) == [
        ["k", 1, "v", "a"], ["k", 2, "v", None], ["k", 3, "v", None]]
    assert list(exploded_rows(["k", None, []], [1, 2])) == []  # NULL and empty ARRAYs make no row
    assert list(exploded_rows(["k", [None]], [1])) == [["k", None]]  # a NULL item is a row
    assert list(exploded_rows(["k", 5], [])) == [["k", 5]]  # without EXPLODE the record is the row
