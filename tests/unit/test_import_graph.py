"""The structure's import rules, read from the source (nothing is imported):

- no import cycle among ``millpond.*`` modules (imports under ``TYPE_CHECKING`` count: a
  cycle there is the same tangle, only hidden from the interpreter);
- the runtime services never import the developer tooling (``millpond.deploy.local``);
- no module imports its own service's wiring (``app``) module, but the entry point
  (``__main__``) that runs it.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

# The repository root is the nearest folder above holding src/millpond (wherever this file sits).
ROOT = next(p / "src" / "millpond" for p in Path(__file__).resolve().parents if (p / "src" / "millpond").is_dir())


def _modules() -> dict[str, Path]:
    """Every handwritten and generated module of the namespace, by dotted name."""
    out: dict[str, Path] = {}
    paths = [Path(d, f) for d, _, files in os.walk(ROOT, followlinks=True)  # the folders are symlinks
             for f in files if f.endswith(".py")]
    for path in paths:
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(("millpond", *parts))] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The ``millpond`` modules ``name`` imports (the deepest known module of each import)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("millpond.") and target != name:
                yield target


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: set(_imports(name, path, known)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_checker_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_millpond_modules() -> None:
    graph = _graph()
    assert "millpond.services.router.app" in graph, "the namespace was not found"
    assert _cycles(graph) == []


def test_runtime_services_never_import_the_developer_tooling() -> None:
    offenders = {name: sorted(i for i in imports if i.startswith("millpond.deploy.local"))
                 for name, imports in _graph().items() if name.startswith("millpond.services")}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_no_service_module_imports_its_wiring_module() -> None:
    offenders = {}
    for name, imports in _graph().items():
        if name.startswith("millpond.services.") and name.count(".") >= 3 and not name.endswith(".__main__"):
            app = ".".join(name.split(".")[:3]) + ".app"
            if app in imports:
                offenders[name] = app
    assert offenders == {}
