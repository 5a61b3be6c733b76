"""The worker's Scan over real RocksDB stores: bounded by max_scan_rows (refused past it,
RESOURCE_EXHAUSTED), page by page so the serving loop keeps running through a large scan,
and holding no iterator between pages, so a store can close and reopen mid-scan."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from millpond.services.worker import serving
from millpond.services.worker.servicer import WorkerServicer
from millpond.services.worker.serving import LocalCopy
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state
from millpond.shared.errors import UnavailableError
from millpond.worker.v1 import worker_pb2


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, details)
        self.code, self.details = code, details


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class Tables:
    """One store per partition, each counting the rows it hands out."""

    def __init__(self, root: Path, rows_per_partition: dict[int, int]):
        self.read = 0
        self.stores: dict[int, PartitionStore] = {}
        for partition, count in rows_per_partition.items():
            store = self.stores[partition] = PartitionStore(root / str(partition))
            store.write({b"k%06d" % i: encode_state([i]) for i in range(count)}, {INPUT_OFFSET: 100 + partition})
            store.page = self._counted(store.page)  # type: ignore[method-assign]

    def _counted(self, page: Any) -> Any:
        def counted(after: bytes | None, count: int) -> list[tuple[bytes, list[Any]]]:
            items: list[tuple[bytes, list[Any]]] = page(after, count)
            self.read += len(items)
            return items
        return counted

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        store = self.stores[partition]
        if store._db is None:
            raise UnavailableError(f"partition {partition} is not here")
        return LocalCopy(store, lambda key, state: [key.decode(), state[0]], 100 + partition)

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        raise AssertionError("a scan never pauses a standby's replay")

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


def scan(tables: Tables, max_rows: int, limit: int = 0, partitions: tuple[int, ...] = (0, 1)) -> Any:
    servicer = WorkerServicer(tables, max_scan_rows=max_rows)
    request = worker_pb2.ScanRequest(table="T", partitions=partitions, limit=limit)
    return servicer.Scan(request, Context())  # type: ignore[arg-type]


def test_a_scan_over_more_rows_than_the_cap_is_refused_having_read_one_more(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 800, 1: 800})
    with pytest.raises(Aborted) as info:
        asyncio.run(scan(tables, max_rows=1000))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_scan_rows" in info.value.details and "LIMIT" in info.value.details
    assert tables.read == 1001
    tables.close()


def test_a_scan_within_its_limit_or_the_cap_answers_every_partition(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 800, 1: 800})
    whole = asyncio.run(scan(tables, max_rows=1600))
    assert len(whole.rows) == 1600 and dict(whole.input_offsets) == {0: 100, 1: 101}
    assert [r.values[0].string_value for r in whole.rows[798:802]] == ["k000798", "k000799", "k000000", "k000001"]
    tables.read = 0
    limited = asyncio.run(scan(tables, max_rows=1000, limit=900))
    assert len(limited.rows) == 900 and tables.read == 900 and dict(limited.input_offsets) == {0: 100, 1: 101}
    tables.close()


def test_the_loop_keeps_running_through_a_large_scan(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 6000, 1: 4000})

    async def scan_while_ticking() -> tuple[int, int]:
        ticks = 0
        job = asyncio.ensure_future(scan(tables, max_rows=20_000))
        while not job.done():
            ticks += 1
            await asyncio.sleep(0)
        return ticks, len((await job).rows)

    ticks, rows = asyncio.run(scan_while_ticking())
    assert rows == 10_000
    assert ticks >= 10_000 // serving.SCAN_PAGE_ROWS  # a turn of the loop per page, not one for the whole scan
    tables.close()


def test_a_store_that_closes_mid_scan_can_reopen_and_the_scan_says_ask_again(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 3000})

    async def scan_while_moving_the_task() -> Any:
        job = asyncio.ensure_future(scan(tables, max_rows=10_000, partitions=(0,)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not job.done()
        tables.stores[0].close()  # the task stops; its next copy opens the same store at once
        PartitionStore(tmp_path / "0").close()
        return await job

    with pytest.raises(Aborted) as info:
        asyncio.run(scan_while_moving_the_task())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
