"""Co-located routing on the real cluster: a worker that also serves RouterService
(serve_router, on in the tests' cluster) answers pull queries like the router, reading the
partitions whose copy it holds in-process and asking the other worker for the rest; scans
with a WHERE, a SELECT list and a LIMIT, answered by the workers that hold the rows."""

from __future__ import annotations

from millpond.cli.client import RouterClient
from millpond.deploy.local.launcher import LocalCluster
from tests.e2e.helpers import pull_until, run
from tests.e2e.test_readings import scrape, total

SENSORS = 24


def hops(cluster: LocalCluster, worker: str) -> tuple[float, float]:
    samples = scrape(cluster.child(worker).metrics)
    return total(samples, "millpond_pull_hops_total", hop="local"), total(samples, "millpond_pull_hops_total", hop="remote")


def test_a_worker_answers_pulls_reading_its_own_copies_in_process(cluster: LocalCluster) -> None:
    stream, table = f"colo_{cluster.service_id}", f"colo_counts_{cluster.service_id}"
    run(cluster, f"CREATE STREAM {stream} (sensor VARCHAR KEY, reading INT) "
                 f"WITH (kafka_topic='{stream}', partitions=4, value_format='json');")
    run(cluster, f"CREATE TABLE {table} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM {stream} "
                 "GROUP BY sensor;")
    want = {f"s{k:02d}": [f"s{k:02d}", 2, 2 * k] for k in range(SENSORS)}
    for _ in range(2):
        run(cluster, ";\n".join(f"INSERT INTO {stream} (sensor, reading) VALUES ('s{k:02d}', {k})"
                                for k in range(SENSORS)) + ";")
    assert pull_until(cluster, f"SELECT * FROM {table};", want) == want

    local_before, remote_before = hops(cluster, "worker-1")
    client = RouterClient(cluster.child("worker-1").endpoint, timeout=60)
    try:
        for sensor, row in want.items():  # every key, whichever worker holds it
            (outcome,) = client.execute(f"SELECT * FROM {table} WHERE sensor = '{sensor}';")
            assert outcome.rows == [row]
        token = client.token
        assert token
        for sensor, row in want.items():  # again: each text as kept, and the token it came with back
            (outcome,) = client.execute(f"SELECT * FROM {table} WHERE sensor = '{sensor}';")
            assert outcome.rows == [row] and outcome.consistency_token == token
            (dropped,) = client.execute(f"SELECT * FROM {table} WHERE sensor = '{sensor}' AND n > 2;")
            assert dropped.rows == []
        (scan,) = client.execute(f"SELECT * FROM {table};")
        assert sorted(scan.rows) == sorted(want.values())
    finally:
        client.close()
    # Scans ship the statement: each worker filters, projects and cuts its own rows.
    for endpoint in (cluster.router, cluster.child("worker-1").endpoint):
        client = RouterClient(endpoint, timeout=60)
        try:
            (filtered,) = client.execute(f"SELECT sensor, total * 10 AS t10 FROM {table} WHERE total >= 30;")
            assert filtered.columns == [("SENSOR", "VARCHAR"), ("T10", "INT")]
            assert sorted(filtered.rows) == sorted([s, t * 10] for s, _, t in want.values() if t >= 30)
            (limited,) = client.execute(f"SELECT sensor FROM {table} WHERE n = 2 AND total > 0 LIMIT 5;")
            assert len(limited.rows) == 5 and all(want[s][2] > 0 for (s,) in limited.rows)
        finally:
            client.close()
    local_after, remote_after = hops(cluster, "worker-1")
    # 4 partitions on 2 workers: worker-1 read some keys itself and asked worker-2 for the others.
    assert local_after - local_before >= 1 and remote_after - remote_before >= 1
    assert (local_after - local_before) + (remote_after - remote_before) >= 3 * SENSORS + 1
