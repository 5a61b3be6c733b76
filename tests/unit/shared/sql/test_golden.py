"""Golden test of every statement form: parse, apply to one metastore, render the outcome.

``golden/statements.sql`` runs in order; what each statement does (its syntax tree, the
change or error, the rows of SHOW / DESCRIBE / EXPLAIN, the record an INSERT produces) is
compared with ``golden/statements.golden``. After an intended change, rewrite the golden
file with ``MILLPOND_UPDATE_GOLDEN=1 pytest tests/unit/shared/sql/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

from millpond.services.coordinator import views
from millpond.shared.catalog.metastore import DDL, Metastore, check_sources
from millpond.shared.catalog.upgrades import check_upgrades
from millpond.shared.errors import MillpondError
from millpond.shared.results import Outcome
from millpond.shared.session import check_name, check_property
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.parser import parse_script
from millpond.shared.sql.planner import encode_insert, plan_select

HERE = Path(__file__).parent / "golden"


def _outcome(outcome: Outcome) -> list[str]:
    lines = [f"=> {outcome.message}"] if outcome.message else []
    if outcome.columns:
        lines.append("   | " + " | ".join(f"{n} {t}" for n, t in outcome.columns))
        lines += ["   | " + " | ".join("null" if v is None else str(v) for v in row) for row in outcome.rows]
    return lines


def _run(stmt: ast.Statement, metastore: Metastore, offset: int) -> list[str]:
    if not isinstance(stmt, DDL):  # as the services do (the metastore does it for DDL)
        stmt = custom_types.resolved(stmt, metastore.types)
    if isinstance(stmt, DDL):
        change = metastore.plan(stmt)
        check_upgrades(metastore.queries, change)  # as the coordinator does before appending
        check_sources(change)
        return [f"=> {metastore.apply(stmt, offset)}"]
    if isinstance(stmt, ast.InsertValues):
        record = encode_insert(stmt, metastore.insert_target(stmt.target))
        key = record.key.hex() if record.key is not None else None
        stamp = f" timestamp={record.timestamp}" if record.timestamp is not None else ""
        return [f"=> key={key} partition={record.partition} value={record.value.decode()}{stamp}"]
    if isinstance(stmt, ast.Query):
        plan = plan_select(stmt, metastore.source(stmt.source))
        return ["=> columns: " + ", ".join(f"{n} {t}" for n, t in plan.columns)]
    if isinstance(stmt, ast.SetProperty):
        check_property(stmt.name, stmt.value)
        return ["=> set"]
    if isinstance(stmt, ast.UnsetProperty):
        check_name(stmt.name)
        return ["=> unset"]
    if isinstance(stmt, ast.Show):
        return _outcome(views.show(metastore, stmt, {"auto.offset.reset": "latest"}, {}))
    if isinstance(stmt, ast.Describe):
        return _outcome(views.describe(metastore, stmt))
    if isinstance(stmt, ast.Explain):
        return _outcome(views.explain(metastore, stmt, {}, {}))
    raise AssertionError(f"no golden rendering for {type(stmt).__name__}")


def render(script: str) -> str:
    """What every statement of ``script`` does, as text."""
    metastore = Metastore()
    lines: list[str] = []
    for offset, stmt in enumerate(parse_script(script)):
        lines.append("")
        lines.append("-- " + " ".join(stmt.text.split()))
        lines.append(f"ast: {stmt!r}")
        digest = metastore.digest()
        try:
            lines += _run(stmt, metastore, offset)
        except MillpondError as err:
            lines.append(f"=> error {err.kind.name}: {err.message}")
            assert metastore.digest() == digest, "a rejected statement changed the metastore"
    lines.append("")
    lines.append(f"digest: {metastore.digest()}")
    return "\n".join(lines) + "\n"


def test_every_statement_form_matches_the_golden_file() -> None:
    actual = render((HERE / "statements.sql").read_text())
    golden = HERE / "statements.golden"
    if os.environ.get("MILLPOND_UPDATE_GOLDEN"):
        golden.write_text(actual)
    assert actual == golden.read_text()
