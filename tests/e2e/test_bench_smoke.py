"""The load-test harness and the benchmarks in smoke mode (tiny sizes), so they keep
working: each benchmark starts its own cluster on real Kafka, Spark, RocksDB and gRPC, prints
its JSON, and the suite writes its report with plots. The figures are not checked (a smoke
run's sizes make them meaningless), their presence and their baselines are.

``make test`` runs the harness on the session's cluster; the tests marked ``slow`` (the harness
under a kill, the soak in short, the benchmarks: a minute each, mostly their clusters' and
baselines' fixed costs) keep ``make test`` within its 15 minutes and run with ``make test-all``.
The faults the soak combines each have their own e2e test (a SIGKILL: test_aggregation,
test_joins, test_cluster; a frozen worker: test_router; the coordinator leader killed:
test_cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from millpond.deploy.local.launcher import LocalCluster


def loadtest(*options: str) -> dict[str, Any]:
    """``millpond loadtest`` with ``options``; its JSON summary."""
    done = subprocess.run([sys.executable, "-m", "millpond.cli.main", "loadtest", *options],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def benchmarks(out: Path, only: str) -> dict[str, Any]:
    """``python -m bench --smoke --only <only>``; its results."""
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--only", only, "--out", str(out)],
                          capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


@pytest.mark.slow  # 14-17 s; make test's fresh-clone CI took 14:51 of its 15 minutes on 2026-12-01; make test-all runs it
def test_loadtest_drives_a_running_cluster(cluster: LocalCluster) -> None:
    summary = loadtest("--server", cluster.router, "--kafka", cluster.bootstrap, "--stream", "loadtest_e2e",
                       "--duration", "4", "--events-per-s", "200", "--keys", "20", "--partitions", "2",
                       "--pull-concurrency", "2")
    assert summary["events_produced"] > 500 and summary["pulls_ok"] > 50, summary
    assert summary["latency"]["p50_ms"] > 0 and summary["latency"]["max_ms"] >= summary["latency"]["p99_ms"]
    assert summary["faults"] == [] and summary["errors"] == {}, summary


@pytest.mark.slow
def test_loadtest_survives_a_killed_worker_with_standby_reads(tmp_path: Path) -> None:
    summary = loadtest("--local", "--workers", "2", "--standbys", "1", "--data-dir", str(tmp_path / "cluster"),
                       "--duration", "14", "--events-per-s", "100", "--keys", "20", "--partitions", "2",
                       "--pull-concurrency", "2", "--fault", "kill:worker-1@6")
    assert summary["events_produced"] > 500 and summary["pulls_ok"] > 50
    assert summary["latency"]["p50_ms"] > 0 and summary["latency"]["max_ms"] >= summary["latency"]["p99_ms"]
    (fault,) = summary["faults"]
    assert fault["fault"] == "kill:worker-1@6.0"
    assert fault["coordinator_detected_s"] is not None and fault["router_detected_s"] is not None
    assert fault["processing_back_s"] is not None, "the moved partitions never caught up"
    assert fault["moved_partitions"] and fault["moved_first_commit_s"] is not None, "their new owners never committed"
    assert fault["processing_again_s"] == max(fault["processing_back_s"], fault["moved_first_commit_s"])
    # One standby and standby reads on: the kill costs no pull query.
    assert fault["failed_pulls_after"] == 0 and summary["errors"] == {}, summary


@pytest.mark.slow
def test_the_soak_in_short_loses_nothing_and_serves_nothing_stale(tmp_path: Path) -> None:
    # Issue 19's soak with one fault of each kind but the broker restart (a worker killed, a
    # worker frozen past the failure detector, the coordinator leader killed, a CPU hog).
    done = subprocess.run([sys.executable, "-m", "bench.soak", "--smoke"],
                          capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [f["fault"].split(":")[0] for f in result["faults"]].count("kill") == 2, result["faults"]
    assert result["events_acknowledged"] > 1000 and result["pulls_ok"] > 0, result
    assert result["unknown_sends"] == 0 and result["keys_wrong"] == 0, result["wrong_samples"]
    assert result["stale_pulls"] == 0 and result["zombie_commits_accepted"] == 0, result
    assert result["tracebacks_in_logs"] == 0, result["log_samples"]


@pytest.mark.slow
def test_the_aggregation_benchmark_reports_its_baselines_and_plots(tmp_path: Path) -> None:
    aggregation = benchmarks(tmp_path, "aggregation")["aggregation"]
    assert aggregation["events_per_s"] > 0 and aggregation["baseline_aiokafka_consumer"]["records"] == 20_000
    assert aggregation["baseline_kafka_perf_consumer"]["records_per_s"] > 0
    assert aggregation["baseline_kafka_streams"]["counted"] == 20_000, aggregation["baseline_kafka_streams"]
    assert aggregation["baseline_kafka_streams"]["threads"] == 1 and aggregation["ratio_to_kafka_streams"] > 0
    assert aggregation["windowed_events_per_s"] > 0 and aggregation["windowed_ratio_to_group_by"] > 0
    windowed = aggregation["baseline_kafka_streams_windowed"]
    assert windowed["counted"] == 20_000 and windowed["window_ms"] == 60_000, windowed
    assert aggregation["windowed_ratio_to_kafka_streams"] > 0
    assert aggregation["join_events_per_s"] > 0 and aggregation["join_table_rows"] == 1_000
    assert aggregation["table_join_rows"] == 2_000 and aggregation["table_join_rows_per_s"] > 0
    assert aggregation["fk_join_rows"] == 1_097 and aggregation["fk_join_rows_per_s"] > 0
    assert aggregation["stream_join_records"] == 22_000 and aggregation["stream_join_records_per_s"] > 0
    assert aggregation["table_aggregation_rows"] == 1_000 and aggregation["table_aggregation_exact"] is True
    assert aggregation["table_aggregation_rows_per_s"] > 0 and aggregation["table_aggregation_updates_per_s"] > 0
    assert {"coordinator", "router", "worker-1", "kafka"} <= set(aggregation["peak_rss_mib"])
    report = (tmp_path / "report.md").read_text()
    assert "![aggregation.png](aggregation.png)" in report and (tmp_path / "aggregation.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_other_benchmarks_run_and_report_their_baselines(tmp_path: Path) -> None:
    # failover is the harness above under a kill, and scaling is the aggregation twice.
    results = benchmarks(tmp_path, "pull_queries,scans,restore,freshness,inserts,micro_batch,json_read,group_rows,command_log,"
                                   "beats")
    assert [level["concurrency"] for level in results["pull_queries"]["levels"]] == [1, 16, 64]
    for level in results["pull_queries"]["levels"]:  # ghz's counts: every lookup answered OK
        assert level["count"] > 0 and level["errors"] == 0 and level["baseline_health_check"]["qps"] > 0
    for level in results["pull_queries"]["colocated"]["levels"]:  # the same asked of the owning worker
        assert level["count"] > 0 and level["errors"] == 0
    assert results["restore"]["restored_records"] >= 5_000 and results["restore"]["restore_records_per_s"]
    assert results["freshness"]["insert_to_visible_ms"]["p50"] > 0 and results["freshness"]["scan_with_token_ms"]["p50"] > 0
    assert results["pull_queries"]["path"]["layers"]["router_pull"]["p50_us"] > 0
    for level in results["inserts"]["levels"]:  # every INSERT answered, and its row in the topic
        assert level["count"] > 0 and level["errors"] == 0 and level["answered"] <= level["rows_in_topic"]
    (size,) = results["micro_batch"]["sizes"]
    assert size["batch_records"] == 1000 and size["reduce_ms"] > 0 and size["kafka_read_ms"] > 0
    reads = results["json_read"]["reads"]  # both statements' records in each spelling, every record read
    assert len(reads) == 12 and all(read["records_unread"] == 0 and read["read_to_plain"] > 0 for read in reads)
    tables = results["group_rows"]["tables"]  # each table's rows made by the production row maker, every one kept
    assert [t["table"] for t in tables] == ["plain", "mean", "doubled", "rounded", "four", "having"]
    assert all(t["rows_made"] == t["rows"] and t["cost_to_plain"] > 0 for t in tables)
    waits = [run["fetch_max_wait_ms"] for run in results["command_log"]["runs"]]  # every statement applied, or it exits
    assert waits == [25, 500, 25, 500] and all(run["catch_up_ms_median"] > 0 for run in results["command_log"]["runs"])
    # Each stream stayed open throughout (or the benchmark exits); CPU ticks over a smoke run's 2 s may be none.
    assert [run["mode"] for run in results["beats"]["runs"]] == ["quiet", "beats", "pings", "pair_apart", "pair_grid"]
    router = results["pull_queries"]["profile"]["router"]
    assert router["samples"] > 0 and any("services/router/" in f for f in router["inclusive_pct_millpond_functions"])
    scans = results["scans"]  # every row of the table through the router, and a filtered and a limited scan
    assert scans["whole"]["rows"] == scans["keys"] == scans["baseline_rocksdict_iteration"]["rows"]
    assert 0 < scans["filtered"]["rows"] < scans["keys"] and scans["limit_100"]["rows"] == 100
    assert scans["whole"]["cpu_ms_per_scan"]["router"] > 0 and scans["profile"]["router"]["samples"] > 0
    report = (tmp_path / "report.md").read_text()
    assert "![pull_queries.png](pull_queries.png)" in report and "![scans.png](scans.png)" in report
