"""The shape of the code: data flows one way, so no module imports one that imports it back.

Imports inside functions count too: deferring an import hides a cycle from Python's loader,
not from the reader. Imports under ``if TYPE_CHECKING:`` do not: they name a type for an
annotation and never run.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import forensics

ROOT = Path(forensics.__file__).resolve().parent


def module_names() -> set[str]:
    return {"forensics"} | {
        m.name for m in pkgutil.walk_packages(forensics.__path__, prefix="forensics.")
    }


def module_path(name: str) -> Path:
    parts = name.split(".")[1:]
    base = ROOT.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def imports_of(name: str, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its body."""
    tree = ast.parse(module_path(name).read_text(encoding="utf-8"))
    package = name if module_path(name).name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING":
            block.body = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from pkg import mod`` imports a module; ``from mod import name`` the module.
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    # A package's own __init__ is loaded on the way to any of its modules: not an edge.
    return {t for t in found if not (t == "forensics" or name.startswith(t + "."))}


def import_graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports_of(name, known) for name in sorted(known)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert graph["forensics.cli"] >= {"forensics.app", "forensics.commands.report"}
    assert cycles(graph) == []


def test_nothing_below_the_commands_imports_them():
    for name, targets in import_graph().items():
        if name.startswith("forensics.commands") or name == "forensics.cli":
            continue
        upward = {t for t in targets if t.startswith("forensics.commands") or t == "forensics.cli"}
        assert not upward, f"{name} imports {upward}"


def test_the_pipeline_steps_do_not_call_back_up():
    """ingest -> detect -> scope -> report: a step never imports a later one."""
    graph = import_graph()
    order = ["forensics.ingest", "forensics.detect", "forensics.scope", "forensics.report"]

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    for i, step in enumerate(order):
        later = set(order[i + 1 :])
        below = {m for m in reach(step) if any(m == x or m.startswith(x + ".") for x in later)}
        assert not below, f"{step} reaches {below}"
