"""A stream-stream join's expected output, by brute force over the records in the order the
join reads them (the rule of ``millpond.services.worker.stream_joining``, written again
another way): each record joins the earlier records of the other side with its key within
the window that are still kept when it comes (at most the retention behind their side's
largest time then, and when they came); an outer side's record that nothing joined when it came is
emitted alone at once if its window had closed (or, ``eager``, always), else when stream time
first passes its window's close plus the grace, unless something joined it before that."""

from __future__ import annotations

from typing import Any

Record = tuple[int, str, Any, int]
"""(side: 0 left, 1 right, key, value, event time), in the order the join reads them."""
Joined = tuple[str, Any, Any, int]
"""(key, left value or None, right value or None, result time)."""


def expected_stream_join(records: list[tuple[int, str, Any, int]], before: int, after: int, grace: int,
                         kind: str, behind: int = 0, eager: bool = False) -> list[Joined]:
    """The join's results, sorted. ``behind``: how far behind their stream time the rows of a
    stream-stream stage before (the left side) may come."""
    retention = before + after + grace + behind
    times = []  # stream time once each record is read
    side_times: list[list[int | None]] = []  # each side's largest time once each record is read
    for side, _, _, time in records:
        times.append(time if not times else max(times[-1], time))
        latest = list(side_times[-1]) if side_times else [None, None]
        latest[side] = time if latest[side] is None else max(time, latest[side])  # type: ignore[type-var]
        side_times.append(latest)
    out: list[Joined] = []
    joined_by: dict[int, list[int]] = {i: [] for i in range(len(records))}  # the later records that joined each
    joined_when_read: set[int] = set()
    for j, (side, key, value, time) in enumerate(records):
        for i in range(j):
            other_side, other_key, other, other_time = records[i]
            if other_side == side or other_key != key:
                continue
            left_time, right_time = (time, other_time) if side == 0 else (other_time, time)
            if not left_time - before <= right_time <= left_time + after:
                continue
            kept_until = side_times[j][other_side]  # its side's largest time when record j came
            if other_time < side_times[i][other_side] - retention or other_time < kept_until - retention:  # type: ignore[operator]
                continue  # never kept, or let go by the time record j came
            out.append((key, value, other, max(time, other_time)) if side == 0 else (key, other, value, max(time, other_time)))
            joined_by[i].append(j)
            joined_when_read.add(j)
    outer = {"INNER": (), "LEFT": (0,), "RIGHT": (1,), "FULL": (0, 1)}[kind]
    for i, (side, key, value, time) in enumerate(records):
        if side not in outer or i in joined_when_read:
            continue
        closes = time + (after if side == 0 else before + behind)
        if eager or closes < times[i]:
            alone = True
        else:
            passed = [c for c in range(i, len(records)) if times[c] > closes + grace]
            alone = bool(passed) and not any(j < passed[0] for j in joined_by[i])
        if alone:
            out.append((key, value, None, time) if side == 0 else (key, None, value, time))
    return sorted(out, key=repr)
