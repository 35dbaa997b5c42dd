"""Imports run downward only (docs/concepts/how-it-works.md, "Code layout"): a module may
import its own layer and the layers below it, never one above, and no modules import each other
in a circle. Read from the source (`ast`), so it holds for imports inside functions and for
imports only a type checker runs (`if TYPE_CHECKING:`) too: a type-only import still ties the two
modules together (the circle intake -> tracing -> intake hid behind one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# Bottom first. A name covers the module and everything under it (`db` covers `db.jobs`).
LAYERS: list[tuple[str, set[str]]] = [
    (
        "pure values",
        {
            "",
            "errors",
            "model",
            "core",
            "config.signing_secret",
            "config.tokens",
            "config.connection_budget",
        },
    ),
    ("cron arithmetic", {"cron.expression", "cron.windows"}),
    ("what doors accept, schedules", {"intake.requests", "cron.schedules"}),
    ("configuration and the files shipped with it", {"config", "share"}),
    ("infrastructure", {"db", "observability", "runtime", "healthcheck"}),
    ("domain and services", {"intake", "cron", "operator", "effects", "engine", "relay"}),
    ("HTTP API", {"api"}),
    ("console", {"console"}),
    ("composition and commands", {"daemon", "cli", "client"}),
]


def layer_of(module: str) -> int:
    """The layer index of `dispatcher.<module>` (module "" is the package itself)."""
    parts = module.split(".") if module else [""]
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        for index, (_, names) in enumerate(LAYERS):
            if prefix in names:
                return index
    raise AssertionError(
        f"dispatcher.{module} is in no layer: add it to LAYERS in {Path(__file__).name} "
        "(and to the Code layout in docs/concepts/how-it-works.md)"
    )


def imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, imported module under `dispatcher.`) for every import, wherever it stands;
    `from dispatcher.console import pages` names the module `console.pages`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "dispatcher" and not node.module.startswith("dispatcher."):
                continue
            package = node.module.removeprefix("dispatcher").removeprefix(".")
            for alias in node.names:  # from dispatcher import rfc3339, __version__
                folder = PACKAGE.joinpath(*package.split(".")) if package else PACKAGE
                if (folder / f"{alias.name}.py").exists():
                    found.append((node.lineno, f"{package}.{alias.name}".lstrip(".")))
                else:
                    found.append((node.lineno, package))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dispatcher."):
                    found.append((node.lineno, alias.name.removeprefix("dispatcher.")))
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(relative.parts).removesuffix("__init__").rstrip(".")


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (a package import names its
    `__init__`; `from dispatcher.x import y`, where y is a module, names y)."""
    known = {module_name(p) for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        targets = set()
        for _, target in imports(ast.parse(path.read_text())):
            targets.add(target if target in known else target.rpartition(".")[0])
        graph[module_name(path)] = targets & known - {module_name(path)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: strongly connected parts of more than one module
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while (member := stack.pop()) != node:
                part.append(member)
            if part:
                found.append(sorted([*part, node]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_and_those_below(path: Path) -> None:
    module = module_name(path)
    own = layer_of(module)
    upward = [
        f"line {line}: dispatcher.{target} ({LAYERS[layer_of(target)][0]})"
        for line, target in imports(ast.parse(path.read_text()))
        if layer_of(target) > own
    ]
    assert not upward, f"dispatcher.{module or '__init__'} ({LAYERS[own][0]}) imports upward: " + (
        "; ".join(upward)
    )


def test_the_check_sees_an_upward_import() -> None:
    """The check itself can fail: config importing the HTTP effect is caught."""
    tree = ast.parse("def f():\n    from dispatcher.effects.http import normalize_target\n")
    [(line, target)] = imports(tree)
    assert (line, target) == (2, "effects.http")
    assert layer_of(target) > layer_of("config")
    typed = ast.parse("if TYPE_CHECKING:\n    from dispatcher.api.app import Problem\n")
    assert imports(typed) == [(2, "api.app")]  # a type-only import counts too


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(import_graph()) == []


def test_the_check_sees_a_circle() -> None:
    graph = {"intake": {"tracing", "model"}, "tracing": {"intake"}, "model": set()}
    assert circles(graph) == [["intake", "tracing"]]
    inside = ast.parse("def f():\n    from dispatcher.console import pages\n")
    assert imports(inside) == [(2, "console.pages")]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
