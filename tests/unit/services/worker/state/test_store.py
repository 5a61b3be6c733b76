"""The partition store read from the serving thread while the processing thread closes it:
a read then says the store is gone (UNAVAILABLE, ask again), never an internal error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, StoreClosed, encode_state
from millpond.shared.errors import UnavailableError


def test_reads_racing_a_close_on_another_thread_end_in_store_closed(tmp_path: Path) -> None:
    for attempt in range(10):
        store = PartitionStore(tmp_path / str(attempt))
        store.write({b"k%d" % i: encode_state([[i]]) for i in range(500)}, {INPUT_OFFSET: 500})
        errors: list[BaseException] = []
        reading = threading.Event()
        thread = threading.Thread(target=_read_until_it_fails, args=(store, reading, errors))
        thread.start()
        reading.wait(5)
        store.close()
        thread.join(5)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], StoreClosed), errors
        assert isinstance(errors[0], UnavailableError)
        with pytest.raises(StoreClosed):
            store.get(b"k7")


def _read_until_it_fails(store: PartitionStore, reading: threading.Event, errors: list[BaseException]) -> None:
    try:
        while True:
            reading.set()
            assert store.get(b"k7") == [[7]]
            sum(1 for _ in store.items())
    except BaseException as error:
        errors.append(error)
