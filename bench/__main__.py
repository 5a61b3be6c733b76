"""Run every benchmark, one after the other (each starts and stops its own cluster), and
write a markdown report with plots under ``bench/results/<time>/`` (not committed).

``python -m bench [--smoke] [--only aggregation,pull_queries]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BENCHMARKS = ("aggregation", "scaling", "pull_queries", "scans", "failover", "restore", "freshness", "inserts",
              "micro_batch", "json_read", "group_rows", "idle", "command_log", "beats", "fuzz", "soak")
RESULTS = Path(__file__).resolve().parent / "results"


def run(name: str, smoke: bool) -> dict[str, Any]:
    """One benchmark in its own process; its JSON result (or the error)."""
    started = time.monotonic()
    command = [sys.executable, "-m", f"bench.{name}", *(["--smoke"] if smoke else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"benchmark": name, "error": (done.stderr or done.stdout).strip().splitlines()[-5:],
                "wall_s": round(time.monotonic() - started, 1)}
    return {**json.loads(lines[-1]), "wall_s": round(time.monotonic() - started, 1)}


def _bar(path: Path, title: str, values: dict[str, float], unit: str) -> str:
    figure, axes = plt.subplots(figsize=(7, 3.2))
    names = list(values)
    axes.barh(names, [values[n] for n in names], color=["#2b6cb0" if i == 0 else "#a0aec0" for i in range(len(names))])
    axes.set_xlabel(unit)
    axes.set_title(title)
    for i, name in enumerate(names):
        axes.text(values[name], i, f" {values[name]:,.0f}", va="center", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path.name


def _figures(results: dict[str, dict[str, Any]], out: Path) -> list[str]:
    """PNG plots of the main figures against their baselines; markdown image lines."""
    images = []
    aggregation = results.get("aggregation", {})
    if "events_per_s" in aggregation:
        values = {"millpond aggregation": aggregation["events_per_s"],
                  "aiokafka consumer": aggregation["baseline_aiokafka_consumer"]["records_per_s"]}
        if "records_per_s" in aggregation["baseline_kafka_perf_consumer"]:
            values["kafka-consumer-perf-test"] = aggregation["baseline_kafka_perf_consumer"]["records_per_s"]
        if "records_per_s" in aggregation.get("baseline_kafka_streams", {}):
            values["kafka streams aggregation"] = aggregation["baseline_kafka_streams"]["records_per_s"]
        if "windowed_events_per_s" in aggregation:
            values["millpond 1-minute windows"] = aggregation["windowed_events_per_s"]
        if "records_per_s" in aggregation.get("baseline_kafka_streams_windowed", {}):
            values["kafka streams 1-minute windows"] = aggregation["baseline_kafka_streams_windowed"]["records_per_s"]
        images.append(_bar(out / "aggregation.png", "Aggregation throughput", values, "events (records) per second"))
    pulls = results.get("pull_queries", {})
    if "levels" in pulls:
        figure, axes = plt.subplots(figsize=(7, 3.2))
        levels = pulls["levels"]
        concurrency = [str(level["concurrency"]) for level in levels]
        axes.plot(concurrency, [level["qps"] for level in levels], marker="o", label="pull via router")
        axes.plot(concurrency, [level["baseline_health_check"]["qps"] for level in levels], marker="o",
                  label="router health check (same generator)")
        axes.set_xlabel("concurrency")
        axes.set_ylabel("queries per second")
        axes.set_title("Pull queries")
        axes.legend()
        figure.tight_layout()
        figure.savefig(out / "pull_queries.png", dpi=110)
        plt.close(figure)
        images.append("pull_queries.png")
    scans = results.get("scans", {})
    if "whole" in scans:
        values = {"whole table through the router": scans["whole"]["rows_per_s"],
                  "filtered (WHERE) through the router": scans["filtered"]["rows_per_s"],
                  "rocksdict iteration of the same stores": scans["baseline_rocksdict_iteration"]["rows_per_s"]}
        images.append(_bar(out / "scans.png", f"Scans of a {scans['keys']:,}-row table", values, "rows per second"))
    memory = aggregation.get("peak_rss_mib")
    if memory:
        images.append(_bar(out / "memory.png", "Peak RSS during the aggregation", memory, "MiB"))
    return [f"![{name}]({name})" for name in images]


def report(results: dict[str, dict[str, Any]], out: Path, smoke: bool) -> Path:
    lines = [f"# Millpond benchmarks{' (smoke sizes: the figures mean nothing)' if smoke else ''}", "",
             f"Run at {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on this machine; every figure has its "
             "baseline from the same run.", ""]
    for name, result in results.items():
        lines += [f"## {name}", "", f"Wall time {result.get('wall_s')} s.", "", "```json",
                  json.dumps({k: v for k, v in result.items() if k != "wall_s"}, indent=2), "```", ""]
    lines += ["## Plots", "", *_figures(results, out), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes, to check every benchmark runs.")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="Comma-separated benchmarks to run.")
    parser.add_argument("--out", type=Path, default=None, help="Results folder (default bench/results/<time>).")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        raise SystemExit(f"unknown benchmarks {sorted(unknown)}; choose from {', '.join(BENCHMARKS)}")
    out = args.out or RESULTS / datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = run(name, args.smoke)
        (out / "results.json").write_text(json.dumps(results, indent=2))
    path = report(results, out, args.smoke)
    print(json.dumps({"report": str(path), "failed": [n for n, r in results.items() if "error" in r]}))
    if any("error" in r for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
