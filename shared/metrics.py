"""Prometheus metrics of every service, served over HTTP on ``MILLPOND_METRICS_PORT``.

Each service is its own process with the default registry, so a metric defined here is
exported only by the services that touch it. Names follow Prometheus conventions: counters
end in ``_total``, durations are seconds. ``deploy/grafana/millpond.json`` charts them.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# ---- workers
RECORDS_PROCESSED = Counter("millpond_records_processed_total",
                            "Input records a task processed and committed.", ["query", "partition"])
RECORDS_FAILED = Counter("millpond_records_failed_total",
                         "Input records a task could not process (sent to the processing log).", ["query", "partition"])
RECORDS_LATE = Counter("millpond_records_late_total",
                       "Late records: a windowed aggregation's dropped for a window closed by its grace period "
                       "(each also in the processing log, one per record and window), and a stream-stream join's "
                       "past its retention when they came (not kept, though they join what is).", ["query", "partition"])
BATCH_SECONDS = Histogram("millpond_microbatch_seconds", "Time to process and commit one Spark micro-batch.",
                          ["query"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
CONSUMER_LAG = Gauge("millpond_task_consumer_lag",
                     "Input records of a task's partition not processed yet (at the last micro-batch).",
                     ["query", "partition"])
RESTORED = Gauge("millpond_restore_records", "Changelog records the current or last restore applied.",
                 ["query", "partition"])
TO_RESTORE = Gauge("millpond_restore_records_total_expected", "Changelog records the current or last restore had to apply.",
                   ["query", "partition"])
STORE_LAG = Gauge("millpond_store_lag", "Changelog records a local table copy is behind.",
                  ["query", "partition", "role"])
SPARK_DRIVER_RESTARTS = Counter("millpond_spark_driver_restarts_total",
                                "Times a worker found its Spark driver dead and started a new one.")
TASK_FAILURES = Counter("millpond_task_failures_total", "Times a query's tasks failed and were restarted.", ["query"])

# ---- coordinator
HEARTBEAT_AGE = Gauge("millpond_heartbeat_age_seconds", "Seconds since a worker's last heartbeat.", ["worker"])
VERDICTS = Counter("millpond_failure_detector_verdicts_total",
                   "Failure-detector verdicts on workers that missed heartbeats.", ["verdict"])
MEMBERS = Gauge("millpond_cluster_workers", "Workers that are members of the cluster.")

# ---- router
PULL_SECONDS = Histogram("millpond_pull_query_seconds", "Pull-query latency at the router.", ["outcome"],
                         buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
PULL_QUERIES = Counter("millpond_pull_queries_total", "Pull queries by outcome (OK or the gRPC status).", ["outcome"])
PULL_HOPS = Counter("millpond_pull_hops_total", "Lookups and scans a router asked of a table copy: in its own "
                    "worker's process (local, with serve_router) or over gRPC (remote).", ["hop"])
LOOKUP_BATCH = Histogram("millpond_router_lookup_batch_size", "Lookups a router sent a worker in one LookupStream "
                         "message (those that waited while its loop was busy go together).",
                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
PUSH_QUERIES = Gauge("millpond_push_queries", "Push queries this router streams now.")
PUSH_ROWS = Counter("millpond_push_rows_total", "Rows push queries delivered.")
HOST_ALIVE = Gauge("millpond_router_host_alive", "1 while the router's failure detector has the worker alive.",
                   ["worker"])


def serve(host: str, port: int | None) -> int | None:
    """Serve ``/metrics`` on ``host:port`` in a background thread (0 picks a free port);
    the port, or None when metrics are off."""
    if port is None:
        return None
    server, _ = start_http_server(port, addr=host)
    bound: int = server.server_port
    log.info("metrics served", extra={"endpoint": f"http://{host}:{bound}/metrics"})
    return bound
