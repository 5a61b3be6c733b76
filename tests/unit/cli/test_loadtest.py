"""The load-test harness's pure parts: fault schedules, key distributions, fault reports."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from aiokafka import ConsumerRecord

from millpond.cli.loadtest import (
    CommitWatch,
    Fault,
    Stats,
    commit_gaps_report,
    fault_report,
    key_chooser,
    percentiles,
    processing_again,
)
from millpond.shared.errors import MillpondError


def test_faults_parse_from_the_command_line() -> None:
    assert Fault.parse("kill:worker-1@10") == Fault(10.0, "kill", "worker-1")
    assert Fault.parse("stop:worker-2@2.5") == Fault(2.5, "stop", "worker-2")
    assert Fault.parse("add@15") == Fault(15.0, "add", "")
    assert Fault.parse("stop:worker-1@+10") == Fault(10.0, "stop", "worker-1", after_previous=True)
    for text in ("kill:worker-1@10.0", "add@15.0", "stop:worker-1@+10.0"):
        assert str(Fault.parse(text)) == text
    for bad in ("kill@10", "add:worker-1@3", "explode:worker-1@1", "kill:worker-1", "kill:worker-1@-1", "add@+", "add@soon"):
        with pytest.raises(MillpondError, match="write kill:WORKER@SECONDS"):
            Fault.parse(bad)


def test_a_fault_that_follows_the_one_before_it_is_due_after_that_one_finished() -> None:
    started, previous_finished = 100.0, 250.0
    assert Fault.parse("stop:worker-1@+12.5").due(started, previous_finished) == 262.5
    assert Fault.parse("stop:worker-1@12.5").due(started, previous_finished) == 112.5


def test_zipf_keys_are_skewed_and_uniform_keys_are_not() -> None:
    zipf_key, uniform_key = key_chooser(100, "zipf", random.Random(1)), key_chooser(100, "uniform", random.Random(1))
    zipf = Counter(zipf_key() for _ in range(20_000))
    uniform = Counter(uniform_key() for _ in range(20_000))
    assert set(zipf) <= {f"sensor-{k:05d}" for k in range(100)}
    # P(rank 1) = 1 / H(100) ~ 19 %; uniform gives every key ~1 %.
    assert 0.16 < zipf["sensor-00000"] / 20_000 < 0.22
    assert zipf["sensor-00000"] > 10 * zipf["sensor-00050"]
    assert max(uniform.values()) / 20_000 < 0.02
    with pytest.raises(MillpondError):
        key_chooser(10, "pareto", random.Random(1))


def test_a_fault_report_counts_errors_and_gaps_around_the_fault() -> None:
    stats = Stats()
    stats.successes = [1.0, 1.1, 1.2, 1.3, 3.3, 3.4]
    stats.failures = [1.5, 2.0, 3.0]
    stats.histogram.record_value(1500)
    report = fault_report(Fault(1.25, "kill", "worker-1"), 1.25, stats, 4.0)
    assert report == {"fault": "kill:worker-1@1.25", "failed_pulls_after": 3, "pulls_back_s": 1.75,
                      "longest_pull_gap_s": 2.0, "longest_pull_gap_before_s": 0.1, "processing_back_s": 4.0}
    assert percentiles(stats.histogram)["p50_ms"] == pytest.approx(1.5, rel=0.01)


def test_the_unmoved_partitions_longest_time_without_a_commit_spans_the_fault() -> None:
    """From each unmoved partition's last commit before the fault to its commits after, up to
    the end of the watch (later ones and the moved partitions' do not count); the baseline
    is the same over the ten seconds before. A moved partition's longest gap is its own figure."""
    watch = CommitWatch({0: [1.0, 1.2, 1.4, 1.6, 2.5, 2.7, 9.0], 1: [1.1, 1.3, 1.5, 1.7, 1.9, 2.1, 2.3, 2.5, 2.7, 2.9],
                         2: [1.0, 5.0]},
                        produced={0: [0.95, 1.1, 1.3, 1.5, 2.0, 2.6], 1: [1.0, 1.4, 1.8, 2.2, 2.6, 2.95]},
                        started=0.9, ended=20.0)
    report = commit_gaps_report([0, 1], [2], 1.65, 3.0, watch)
    assert report == {"unmoved_partitions": [0, 1], "moved_partitions": [2], "unmoved_longest_commit_gap_s": 0.9,
                      "unmoved_longest_commit_gap_before_s": 0.2, "commit_interval_before_p50_s": 0.2,
                      "commit_interval_before_p90_s": 0.2, "commit_interval_after_p50_s": 0.2,
                      "commit_interval_after_p90_s": 0.34,  # partition 0's 0.9 among eight of 0.2
                      "moved_longest_commit_gap_s": 2.0,  # partition 2: from its 1.0 to the window's end
                      "moved_longest_output_gap_s": 2.1,  # no output seen: from the watch's start
                      "unmoved_longest_output_gap_s": 0.6, "unmoved_longest_output_gap_before_s": 0.4,
                      "output_interval_before_p50_s": 0.2, "output_interval_before_p90_s": 0.34,
                      "output_interval_after_p50_s": 0.4, "output_interval_after_p90_s": 0.55}
    assert commit_gaps_report([], None, 1.65, 3.0, watch)["unmoved_longest_commit_gap_s"] is None
    assert commit_gaps_report(None, None, 1.65, 3.0, watch)["moved_longest_commit_gap_s"] is None


def test_a_partition_that_stops_committing_counts_until_the_watch_ends() -> None:
    """A stall from the fault on is the gap itself, however long, and a watch that ended
    before the window's end says by how much; the baseline starts after an earlier fault's window."""
    watch = CommitWatch({0: [1.0, 1.2, 1.4, 1.6], 1: [1.1, 1.3, 1.5, 1.7, 1.9, 2.1, 2.3, 2.5, 2.7, 2.9]},
                        started=0.9, ended=12.0)
    report = commit_gaps_report([0, 1], [], 1.65, 20.0, watch, since=1.25)
    assert report["unmoved_longest_commit_gap_s"] == 10.4  # partition 0: from 1.6 to the watch's end
    assert report["unmoved_watch_cut_short_s"] == 8.0
    assert report["unmoved_longest_commit_gap_before_s"] == 0.2 and report["commit_interval_before_p50_s"] == 0.2
    assert commit_gaps_report([1], [], 1.65, 2.0, CommitWatch({}, started=0.9, ended=12.0))["unmoved_longest_commit_gap_s"] == 1.1


def test_a_transaction_counts_once_when_its_worker_produced_its_first_record() -> None:
    """Offsets that follow on one another are one transaction, across fetches; a skipped
    offset (the commit marker) starts the next one; each at its record's timestamp."""
    watch = CommitWatch(wall_to_monotonic=-1000.0)
    watch.fetched(3, 5.0, [record(10, 1_001_000), record(11, 1_001_010)])
    watch.fetched(3, 5.2, [record(12, 1_001_020), record(14, 1_001_300), record(15, 1_001_310)])
    watch.fetched(3, 5.3, [])
    watch.fetched(3, 5.9, [record(17, 1_001_700)])
    assert watch.seen == {3: [5.0, 5.2, 5.9]}
    assert watch.produced == {3: pytest.approx([1.0, 1.3, 1.7])}
    assert watch.transactions == {3: [(pytest.approx(1.0), 5.0), (pytest.approx(1.3), 5.2), (pytest.approx(1.7), 5.9)]}


def test_moved_partitions_process_again_once_their_new_owners_commit_output_of_their_own() -> None:
    """A killed worker's last transaction, seen committed after the fault, is not the new
    owner's: the moved partitions process again at the new owners' first commit, or once the
    input that existed at the fault is processed if that is later."""
    watch = CommitWatch(transactions={2: [(1.5, 1.6), (1.95, 2.1), (3.1, 3.25), (3.5, 3.6)], 4: [(2.3, 2.4)]})
    assert processing_again(0.3, [2, 4], 2.0, 1.9, watch) == {"moved_first_commit_s": 1.35, "processing_again_s": 1.35}
    assert processing_again(1.6, [2, 4], 2.0, 1.9, watch)["processing_again_s"] == 1.6
    assert processing_again(0.3, [2, 5], 2.0, 1.9, watch) == {"moved_first_commit_s": None, "processing_again_s": None}
    assert processing_again(0.3, [2], None, 1.9, watch) == {"moved_first_commit_s": None, "processing_again_s": 0.3}
    assert processing_again(0.3, [], 2.0, 1.9, watch)["processing_again_s"] == 0.3


def record(offset: int, timestamp_ms: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("T", 3, offset, timestamp_ms, 0, b"k", b"v", None, 1, 1, [])
