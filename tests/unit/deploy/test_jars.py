"""A cached build (the jar bundles, bench's Kafka Streams baseline) becomes its folder only
when it completed: a failed one leaves nothing behind, a finished one is never made again;
its folder's name changes with the project's pom and sources, and with nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from millpond.deploy.jars import build_once, project_digest
from millpond.shared.errors import SetupError


def test_a_build_runs_once_and_later_calls_only_look(tmp_path: Path) -> None:
    built: list[Path] = []

    def make(staging: Path) -> None:
        built.append(staging)
        (staging / "app.jar").write_text("jar")

    target = tmp_path / "cache" / "app-1234"
    assert build_once(target, make) == target
    assert build_once(target, make) == target
    assert len(built) == 1 and built[0] != target and not built[0].exists()
    assert (target / "app.jar").read_text() == "jar"
    assert [p.name for p in target.parent.iterdir()] == ["app-1234"]


def test_a_failed_build_leaves_nothing_and_the_next_call_builds_again(tmp_path: Path) -> None:
    def fail(staging: Path) -> None:
        (staging / "half.jar").write_text("half")
        raise SetupError("Maven said no")

    target = tmp_path / "app-1234"
    with pytest.raises(SetupError, match="Maven said no"):
        build_once(target, fail)
    assert list(tmp_path.iterdir()) == []
    build_once(target, lambda staging: (staging / "app.jar").write_text("jar"))
    assert (target / "app.jar").exists() and not (target / "half.jar").exists()


def test_a_projects_digest_covers_its_pom_and_sources_only(tmp_path: Path) -> None:
    source = tmp_path / "src" / "main" / "java" / "A.java"
    source.parent.mkdir(parents=True)
    (tmp_path / "pom.xml").write_text("<project/>")
    source.write_text("class A {}")
    first = project_digest(tmp_path)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "A.class").write_text("built")  # a build's output is not a source
    assert project_digest(tmp_path) == first
    source.write_text("class A { int a; }")
    changed = project_digest(tmp_path)
    assert changed != first
    source.rename(source.with_name("B.java"))  # the same text under another name is another project
    assert project_digest(tmp_path) not in (first, changed)
    (tmp_path / "pom.xml").write_text("<project><version>2</version></project>")
    assert len({first, changed, project_digest(tmp_path)}) == 3
