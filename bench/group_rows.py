"""What a GROUP BY table's row costs a worker when its columns compute over its aggregates
(``SUM(v) / COUNT(*)``, ``ROUND(AVG(v), 2)``: evaluated in Python over the aggregates' values,
``task.computed_rows``), against a row of the same aggregates selected as they are (the path
every such row took before), in the same run. A worker makes a row for each group a batch
changed (sink, changelog) and for each pull and standby read of the table.

Each table reads one stream ``r (id INT KEY, v INT)`` and groups by ``id``; its rows are made by
production code (``task.group_rows``) from stored states, one core:

- ``plain``: ``COUNT(*) AS n, SUM(v) AS s, AVG(v) AS a`` (the baseline);
- ``mean``: ``COUNT(*) AS n, SUM(v) / COUNT(*) AS mean`` (SUM held apart);
- ``doubled``: ``COUNT(*) AS n, COUNT(*) * 2 AS twice``;
- ``rounded``: ``COUNT(*) AS n, ROUND(AVG(v), 2) AS a`` (ROUND's exact decimal rounding);
- ``four``: ``COUNT(*) AS n``, ``mean``, ``ROUND(AVG(v), 2)``, ``CONCAT`` over MAX;
- ``having``: ``plain`` with ``HAVING MIN(v) > 0`` (MIN held apart).

``python -m bench.group_rows [--rows 300000] [--repeats 3]``
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.common import arguments, emit, ratio
from millpond.services.worker.task import group_rows
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.sql.parser import parse_statement

SOURCE = "CREATE STREAM r (id INT KEY, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')"
TABLES = {
    "plain": "COUNT(*) AS n, SUM(v) AS s, AVG(v) AS a",
    "mean": "COUNT(*) AS n, SUM(v) / COUNT(*) AS mean",
    "doubled": "COUNT(*) AS n, COUNT(*) * 2 AS twice",
    "rounded": "COUNT(*) AS n, ROUND(AVG(v), 2) AS a",
    "four": "COUNT(*) AS n, SUM(v) / COUNT(*) AS mean, ROUND(AVG(v), 2) AS a, "
            "CONCAT(CAST(id AS VARCHAR), ':', CAST(MAX(v) AS VARCHAR)) AS tag",
    "having": "COUNT(*) AS n, SUM(v) AS s, AVG(v) AS a",
}
"""Each table's aggregate columns (after ``id``)."""
PARTIALS = {"COUNT": lambda i: [3 + i % 5], "SUM": lambda i: [10 * i], "AVG": lambda i: [10.0 * i, 3 + i % 5],
            "MAX": lambda i: [i % 1000], "MIN": lambda i: [1 + i % 7]}
"""A stored partial state per aggregate, by row number (an AVG keeps its sum and count)."""


def measure(name: str, rows: int, repeats: int) -> dict[str, Any]:
    """Rows per second making ``rows`` rows of the table ``name``, best of ``repeats``."""
    meta = Metastore()
    meta.apply(parse_statement(SOURCE), 0)
    having = " HAVING MIN(v) > 0" if name == "having" else ""
    meta.apply(parse_statement(f"CREATE TABLE t AS SELECT id, {TABLES[name]} FROM r GROUP BY id{having}"), 1)
    query = next(iter(meta.queries.values()))
    row = group_rows(query, meta.source("T"))
    states = [[PARTIALS[a.function](i) for a in query.plan.aggregates] for i in range(min(rows, 1000))]
    keys = [i.to_bytes(4, "big") for i in range(len(states))]
    made, seconds = 0, []
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(rows):
            made += row(keys[i % len(keys)], states[i % len(states)]) is not None
        seconds.append(time.perf_counter() - started)
    best = min(seconds)
    return {"table": name, "columns": TABLES[name] + having, "aggregates": [a.column for a in query.plan.aggregates],
            "rows": rows, "rows_made": made // repeats, "best_s": round(best, 4), "median_s": round(statistics.median(seconds), 4),
            "rows_per_s": round(rows / best), "us_per_row": round(best / rows * 1e6, 2),
            "sample": row(keys[1], states[1])}


def main() -> None:
    args = arguments(__doc__, rows=300_000, repeats=3)
    rows = 2_000 if args.smoke else args.rows
    results = [measure(name, rows, args.repeats) for name in TABLES]
    plain = results[0]
    for result in results:
        result["cost_to_plain"] = ratio(result["best_s"], plain["best_s"])
    emit({"benchmark": "group_rows", "tables": results,
          "baseline_plain_rows": {"rows_per_s": plain["rows_per_s"], "us_per_row": plain["us_per_row"]}})


if __name__ == "__main__":
    main()
