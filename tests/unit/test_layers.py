"""Imports run downward only (docs/concepts/how-it-works.md, "Code layout"): a module may import
its own layer and the layers below it, never one above. Read from the source (`ast`), so it holds
for imports inside functions too; imports only a type checker runs (`if TYPE_CHECKING:`) are left
out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# Bottom first. A name covers the module and everything under it (`db` covers `db.jobs`).
LAYERS: list[tuple[str, set[str]]] = [
    (
        "pure values",
        {"", "errors", "rfc3339", "model", "jsoncodec", "signing_secret", "tokens", "faults"},
    ),
    ("cron arithmetic", {"cron"}),
    ("what doors accept, schedules", {"requests", "schedules"}),
    ("configuration and the files shipped with it", {"config", "share"}),
    (
        "infrastructure",
        {"db", "metrics", "logs", "lifecycle", "sdnotify", "diskspace", "healthcheck", "tracing"},
    ),
    ("domain and services", {"intake", "operations", "effects", "work", "relay", "scheduling"}),
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


def runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, imported module under `dispatcher.`) for every import not under TYPE_CHECKING."""
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dispatcher":  # from dispatcher import rfc3339, __version__
                for alias in node.names:
                    name = alias.name if (PACKAGE / f"{alias.name}.py").exists() else ""
                    found.append((node.lineno, name))
            elif node.module.startswith("dispatcher."):
                found.append((node.lineno, node.module.removeprefix("dispatcher.")))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dispatcher."):
                    found.append((node.lineno, alias.name.removeprefix("dispatcher.")))
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_and_those_below(path: Path) -> None:
    relative = path.relative_to(PACKAGE).with_suffix("")
    module = ".".join(relative.parts).removesuffix("__init__").rstrip(".")
    own = layer_of(module)
    upward = [
        f"line {line}: dispatcher.{target} ({LAYERS[layer_of(target)][0]})"
        for line, target in runtime_imports(ast.parse(path.read_text()))
        if layer_of(target) > own
    ]
    assert not upward, f"dispatcher.{module or '__init__'} ({LAYERS[own][0]}) imports upward: " + (
        "; ".join(upward)
    )


def test_the_check_sees_an_upward_import() -> None:
    """The check itself can fail: config importing the HTTP effect is caught."""
    tree = ast.parse("def f():\n    from dispatcher.effects.http import normalize_target\n")
    [(line, target)] = runtime_imports(tree)
    assert (line, target) == (2, "effects.http")
    assert layer_of(target) > layer_of("config")
    typed = ast.parse("if TYPE_CHECKING:\n    from dispatcher.api.app import Problem\n")
    assert runtime_imports(typed) == []
