"""Futures that failed and that no one has looked at: asyncio logs each as "Future exception
was never retrieved" once it is collected."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager


def _unseen() -> dict[int, asyncio.Future[object]]:
    return {id(o): o for o in gc.get_objects()
            if isinstance(o, asyncio.Future) and o.done() and not o.cancelled() and o._log_traceback}


@contextmanager
def unseen_errors() -> Iterator[list[BaseException]]:
    """The errors of the futures that failed in the block and that no one has retrieved when
    it ends (whether or not something still refers to them), in a list filled then."""
    before = _unseen()
    found: list[BaseException] = []
    yield found
    found += [f.exception() for key, f in _unseen().items() if key not in before]
