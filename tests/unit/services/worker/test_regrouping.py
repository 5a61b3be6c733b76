"""A table aggregation's regrouped values, added and taken back."""

from __future__ import annotations

import json

import pytest

from millpond.services.worker.regrouping import retracted
from millpond.shared.catalog.topology import CHANGED_COLUMN, ROWTIME_COLUMN
from millpond.shared.errors import MillpondError


def test_a_retraction_is_the_added_row_with_sign_minus_one_at_the_changes_time() -> None:
    added = json.dumps({"_SIGN": 1, "OWNER": "o", "WEIGHT": 5, ROWTIME_COLUMN: 1_000}, separators=(",", ":")).encode()
    assert json.loads(retracted(added)) == {"_SIGN": -1, "OWNER": "o", "WEIGHT": 5, ROWTIME_COLUMN: 1_000}
    taken = retracted(added, 5_000)  # with the change that takes the row out; its own ROWTIME kept
    assert taken.startswith(b'{"_SIGN":-1,') and json.loads(taken) == {
        "_SIGN": -1, "OWNER": "o", "WEIGHT": 5, ROWTIME_COLUMN: 1_000, CHANGED_COLUMN: 5_000}
    with pytest.raises(MillpondError):
        retracted(b'{"OWNER":"o"}')
