"""A stand-in for the worker's Spark session where a test of its task assignment needs none."""

from __future__ import annotations

from types import SimpleNamespace

COLD_SPARK = SimpleNamespace(ready=False)
"""A ``LazySession`` not started yet: the assignment makes no plan ahead from its copies, and
nothing else of it is used."""
