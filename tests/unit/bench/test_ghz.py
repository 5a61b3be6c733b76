"""How bench reads ghz's JSON report (the fields of ghz v0.121's ``--format json``)."""

from __future__ import annotations

import subprocess
import sys

from bench.ghz import children_cpu_seconds, summary
from bench.pull_queries import loaded

REPORT = {
    "count": 5000, "total": 10_000_000_000, "average": 3_100_000, "fastest": 900_000, "slowest": 41_000_000,
    "rps": 499.87,
    "latencyDistribution": [{"percentage": 50, "latency": 2_500_000}, {"percentage": 99, "latency": 12_250_000}],
    "statusCodeDistribution": {"OK": 4990, "Unavailable": 7, "DeadlineExceeded": 3},
    "errorDistribution": {
        "rpc error: code = Unavailable desc = error reading from server: read tcp 127.0.0.1:1->127.0.0.1:2: "
        "use of closed network connection": 4,
        "rpc error: code = Unavailable desc = no worker could answer for partition 2": 3,
        "rpc error: code = DeadlineExceeded desc = context deadline exceeded": 3},
}


def test_a_report_gives_qps_percentiles_in_ms_and_the_failed_calls() -> None:
    """The calls ghz itself cuts when its time is up are counted apart from the server's errors."""
    got = summary(REPORT, concurrency=16)
    assert got["qps"] == 499.9 and got["count"] == 5000 and got["concurrency"] == 16
    assert got["p50_ms"] == 2.5 and got["p99_ms"] == 12.25 and got["mean_ms"] == 3.1 and got["max_ms"] == 41.0
    assert got["errors"] == 6 and got["cut_at_end"] == 4 and got["status_codes"]["Unavailable"] == 7


def test_no_more_calls_are_cut_at_the_end_than_there_are_workers() -> None:
    got = summary(REPORT, concurrency=1)
    assert got["cut_at_end"] == 1 and got["errors"] == 9


def test_a_report_without_latencies_reads_as_zero() -> None:
    got = summary({"count": 0, "rps": 0.0, "statusCodeDistribution": None, "latencyDistribution": None}, 1)
    assert got["p99_ms"] == 0.0 and got["errors"] == 0 and got["qps"] == 0.0


def test_the_cpu_of_a_child_that_ended_is_counted() -> None:
    """ghz's CPU is read as that of the children reaped around its run."""
    before = children_cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"],
                   check=True, timeout=60)
    assert children_cpu_seconds() - before >= 0.25


def test_the_load_generators_cpu_is_a_share_of_each_call_and_of_the_total() -> None:
    """With every core busy, QPS follows the CPU a call costs the processes measured, ghz included."""
    got = loaded({}, lambda: {**summary(REPORT, concurrency=16), "ghz_cpu_s": 0.5})
    assert got["cpu_us_per_call"] == {"ghz": 100.2, "total": 100.2}  # 0.5 s over the 4,990 calls answered
    assert "ghz_cpu_s" not in got
