"""The startup heap is collected, then frozen out of later collections."""

from __future__ import annotations

import gc
import weakref

from millpond.shared.heap import freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_startup_garbage_is_collected_and_the_rest_frozen() -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first  # a cycle only the collector frees
    gone = weakref.ref(first)
    kept = _Node()
    del first, second
    try:
        freeze_startup_objects()
        assert gone() is None, "the startup garbage was frozen instead of collected"
        assert gc.get_freeze_count() > 0
        assert not gc.is_tracked(kept) or all(o is not kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
