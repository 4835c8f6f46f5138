"""``tape/`` has no import circle: every import of a tape module (at module level or inside a
function; ``if TYPE_CHECKING`` blocks excepted), with a package's ``__init__`` counted as a module
that importing anything inside it runs."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

TAPE = Path(__file__).resolve().parents[1] / "tape"


def _module_name(path: Path) -> str:
    parts = path.relative_to(TAPE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, here: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for inner in node.body:
                inner._type_checking = True  # type: ignore[attr-defined]
                for sub in ast.walk(inner):
                    sub._type_checking = True  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if getattr(node, "_type_checking", False):
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".") if is_package else here.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "tape" or name.startswith("tape.")}


Graph = dict[str, set[str]]


@cache
def import_graph() -> Graph:
    """module -> the tape modules it runs on import (including the packages above them)."""
    paths = {_module_name(p): p for p in TAPE.rglob("*.py")}
    graph: Graph = {name: set() for name in paths}
    for name, path in paths.items():
        for target in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # tape.a.b runs tape.a, then tape.a.b
                prefix = ".".join(parts[:i])
                if prefix in paths and prefix != name and not name.startswith(prefix + "."):
                    graph[name].add(prefix)
    return graph


def reachable(graph: Graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def a_cycle(graph: Graph) -> list[str] | None:
    """One shortest import circle as a path that returns to its start, or None."""
    for start in sorted(graph):
        parent: dict[str, str] = {}
        frontier = [start]
        while frontier:
            nxt_frontier = []
            for node in frontier:
                for nxt in sorted(graph[node]):
                    if nxt == start:
                        path = [node]
                        while path[-1] != start:
                            path.append(parent[path[-1]])
                        return [start, *reversed(path[:-1]), start]
                    if nxt not in parent:
                        parent[nxt] = node
                        nxt_frontier.append(nxt)
            frontier = nxt_frontier
    return None


def test_the_walk_sees_real_imports():
    graph = import_graph()
    assert "tape.pe" in graph["tape.model.decoder"] and "tape.pe.rope" in graph["tape.pe.tape"]
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_tape_has_no_import_circle():
    cycle = a_cycle(import_graph())
    assert cycle is None, "import circle in tape/: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module, forbidden", [
    ("tape.model.config", "tape.pe"),
    ("tape.pe", "tape.model"),
    ("tape.report.provenance", "tape.bench"),  # the commit label lives in tape.vcs
    ("tape.lightning.module", "tape.data.addition"),  # IGNORE_INDEX lives in tape.data.labels
    ("tape.lightning.callbacks", "tape.data.addition"),  # and PAD_ID
    *[(f"tape.data.{name}", "tape.model") for name in ("addition", "passkey", "flipflop", "word_problem")],
])
def test_layers_do_not_reach_up(module, forbidden):
    reach = reachable(import_graph(), module)
    assert not {m for m in reach if m == forbidden or m.startswith(forbidden + ".")}, reach
