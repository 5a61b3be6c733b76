"""A stream-stream join's expected output, by brute force over the records in the order the
join reads them (the rule of ``millpond.services.worker.stream_joining``, written again
another way): pairs of records of the two sides with the same key within the window, both
on time; and, for an outer side, each on-time record that nothing joined, once stream time
passed its window's close."""

from __future__ import annotations

from typing import Any

Record = tuple[int, str, Any, int]
"""(side: 0 left, 1 right, key, value, event time), in the order the join reads them."""
Joined = tuple[str, Any, Any, int]
"""(key, left value or None, right value or None, result time)."""


def expected_stream_join(records: list[tuple[int, str, Any, int]], before: int, after: int, grace: int,
                         kind: str, behind: int = 0) -> list[Joined]:
    """The join's results, sorted. ``behind``: how much later than the grace period a left
    record is late (the rows a stream-stream stage before wrote)."""
    stream_time: int | None = None
    on_time: list[tuple[int, str, Any, int]] = []
    for side, key, value, time in records:
        stream_time = time if stream_time is None else max(stream_time, time)
        if time >= stream_time - grace - (behind if side == 0 else 0):
            on_time.append((side, key, value, time))
    out: list[Joined] = []
    matched: set[int] = set()
    lefts = [(i, r) for i, r in enumerate(on_time) if r[0] == 0]
    rights = [(i, r) for i, r in enumerate(on_time) if r[0] == 1]
    for i, (_, key, left, lt) in lefts:
        for j, (_, other, right, rt) in rights:
            if other == key and lt - before <= rt <= lt + after:
                out.append((key, left, right, max(lt, rt)))
                matched |= {i, j}
    outer = {"INNER": (), "LEFT": (0,), "RIGHT": (1,), "FULL": (0, 1)}[kind]
    for i, (side, key, value, time) in enumerate(on_time):
        reach = after if side == 0 else before + behind
        if side in outer and i not in matched and stream_time is not None and time + reach + grace < stream_time:
            out.append((key, value, None, time) if side == 0 else (key, None, value, time))
    return sorted(out, key=repr)
