"""How the Kafka Streams baseline reads its application's stdout: state changes, counts, and
the moment it first ran (the start of its own throughput)."""

from __future__ import annotations

import asyncio

from bench.baselines.kafka_streams import Progress, follow_progress


async def _read(*lines: bytes) -> Progress:
    stdout = asyncio.StreamReader()
    stdout.feed_data(b"".join(lines))
    stdout.feed_eof()
    progress = Progress()
    await follow_progress(stdout, progress)
    return progress


async def test_states_and_counts_are_followed_and_the_first_running_is_kept() -> None:
    progress = await _read(b'{"state": "REBALANCING"}\n', b'{"state": "RUNNING"}\n', b'{"counted": 10, "keys": 5}\n',
                           b'{"state": "REBALANCING"}\n', b'{"state": "RUNNING"}\n', b'{"counted": 40, "keys": 8}\n')
    assert (progress.state, progress.counted, progress.keys) == ("RUNNING", 40, 8)
    assert progress.running_at is not None


async def test_a_count_printed_before_the_running_state_starts_the_clock() -> None:
    progress = await _read(b'{"state": "REBALANCING"}\n', b'{"counted": 3, "keys": 3}\n')
    assert progress.running_at is not None and progress.state == "REBALANCING"


async def test_lines_that_are_not_progress_are_skipped() -> None:
    progress = await _read(b"OpenJDK 64-Bit Server VM warning: something\n", b'{"state": "CREATED"}\n')
    assert progress.running_at is None and progress.counted == 0
