"""The import rule between layers (README, "Adding an algorithm"), checked on the source.

1. meds_cli.core: imports nothing of the project outside itself;
2. algorithms, benchmarks: import only the core and each other;
3. meds_cli.engine: imports 1 and 2, never the command line;
4. meds_cli.app and meds_cli.commands: may import everything; nothing below imports them.
Every import counts, at module level and inside functions, and no two files import each other
in a cycle (an import inside a function does not break a cycle, it only hides it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meds_cli", "algorithms", "benchmarks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported_names(tree: ast.AST, current: str, is_package: bool) -> set[str]:
    """Every module name an import statement anywhere in the file names (with `from X import y`,
    both X and X.y: y may be a submodule)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the current package
                base = current.split(".") if is_package else current.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def project_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (a name that is not a module maps to its package)."""
    graph = {}
    for name, path in modules.items():
        found = imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py")
        targets = set()
        for imported in found:
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def layer(module: str) -> str:
    if module == "meds_cli" or module.startswith("meds_cli.core"):
        return "core"  # meds_cli/__init__.py holds only __version__
    if module.startswith(("algorithms", "benchmarks")):
        return "plugins"
    if module.startswith("meds_cli.engine"):
        return "engine"
    return "cli"  # meds_cli.app, meds_cli.__main__, meds_cli.commands


ALLOWED = {"core": {"core"}, "plugins": {"core", "plugins"}, "engine": {"core", "plugins", "engine"},
           "cli": {"core", "plugins", "engine", "cli"}}


def violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} ({layer(src)}) imports {dst} ({layer(dst)})"
                  for src, targets in graph.items() for dst in targets if layer(dst) not in ALLOWED[layer(src)])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph():
    return project_imports(project_modules())


def test_every_import_follows_the_layers(graph):
    assert graph["meds_cli.engine.trainer"] >= {"algorithms.policy_loss", "meds_cli.engine.checkpoints"}  # the parser sees imports
    assert violations(graph) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_the_checks_catch_a_bad_import(graph):
    bad = {k: set(v) for k, v in graph.items()}
    bad["meds_cli.core.records"].add("meds_cli.engine.config")
    bad["algorithms.dapo"].add("meds_cli.engine.rollout")
    bad["meds_cli.engine.trainer"].add("meds_cli.commands.train")
    assert violations(bad) == [
        "algorithms.dapo (plugins) imports meds_cli.engine.rollout (engine)",
        "meds_cli.core.records (core) imports meds_cli.engine.config (engine)",
        "meds_cli.engine.trainer (engine) imports meds_cli.commands.train (cli)",
    ]
    bad["algorithms.base"].add("algorithms.meds")
    assert any({"algorithms.base", "algorithms.meds"} <= set(c) for c in cycles(bad))


def test_a_lazy_import_inside_a_function_counts():
    tree = ast.parse("def f():\n    from meds_cli.engine.model import load_tokenizer\n")
    assert "meds_cli.engine.model" in imported_names(tree, "algorithms.x", False)
