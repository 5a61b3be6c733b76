"""The in-memory changelog that the worker's changelog readers read in these tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from millpond.services.worker.state import changelog as changelog_module
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer


@pytest.fixture
def changelog(monkeypatch: pytest.MonkeyPatch) -> Iterator[Changelog]:
    """The changelog every reader in the test reads (``FakeConsumer`` patched in)."""
    log = Changelog()
    monkeypatch.setattr(FakeConsumer, "changelog", log)
    monkeypatch.setattr(FakeConsumer, "seeks", [])
    monkeypatch.setattr(FakeConsumer, "chunks", [])
    monkeypatch.setattr(FakeConsumer, "observe", None)
    monkeypatch.setattr(changelog_module, "AIOKafkaConsumer", FakeConsumer)
    yield log
