"""The import rule between layers (docs/extending.md, "Layout and layers"), checked on the source.

1. meds_cli.core: imports nothing of the project outside itself;
2. algorithms, benchmarks: import only the core and each other;
3. meds_cli.engine: imports 1 and 2, never the command line;
4. meds_cli.app and meds_cli.commands: may import everything; nothing below imports them.
Every import counts, at module level and inside functions, and no two files import each other
in a cycle (an import inside a function does not break a cycle, it only hides it).

Inside the engine, the rooms (meds_cli/engine/__init__.py) import one way: model_io imports no
room, training imports model_io, rollout imports model_io and run_folders, run_folders
imports training and config; config reads the rooms' constants (rollout's engine registry too);
the trainer and export join the rooms, and nothing in a room imports them.
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


ROOMS = ("model_io", "rollout", "training", "run_folders")


def room(module: str) -> str | None:
    """The engine room a module belongs to; "config" for the run config; "top" for the modules
    that join the rooms (trainer, export, the package itself); None outside the engine."""
    if not module.startswith("meds_cli.engine"):
        return None
    parts = module.split(".")
    if len(parts) > 2 and parts[2] in ROOMS:
        return parts[2]
    return "config" if module == "meds_cli.engine.config" else "top"


ROOM_ALLOWED = {"model_io": {"model_io"}, "training": {"training", "model_io"},
                "rollout": {"rollout", "model_io", "run_folders"},
                "run_folders": {"run_folders", "training", "model_io", "config"},
                "config": {"config", "training", "run_folders", "model_io", "rollout"},
                "top": {"top", "config", *ROOMS}}


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} ({room(src)}) imports {dst} ({room(dst)})"
                  for src, targets in graph.items() if room(src) for dst in targets
                  if room(dst) and room(dst) not in ROOM_ALLOWED[room(src)])


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
    # the parser sees imports
    assert graph["meds_cli.engine.training.update"] >= {"algorithms.policy_loss", "meds_cli.engine.training.sharding"}
    assert violations(graph) == []


def test_engine_rooms_import_one_way(graph):
    assert graph["meds_cli.engine.run_folders.checkpoints"] >= {"meds_cli.engine.training.sharding"}
    assert room_violations(graph) == []
    for name in ROOMS:  # each room says what it owns and who may import it
        doc = ast.get_docstring(ast.parse((ROOT / "meds_cli/engine" / name / "__init__.py").read_text()))
        assert doc and "import" in doc


def with_imports(graph: dict[str, set[str]], *edges: tuple[str, str]) -> dict[str, set[str]]:
    """A copy of the import graph with the extra imports (importer, imported) added."""
    bad = {k: set(v) for k, v in graph.items()}
    for src, dst in edges:
        bad[src].add(dst)
    return bad


def test_the_room_check_catches_a_wrong_way_import(graph):
    bad = with_imports(graph, ("meds_cli.engine.training.update", "meds_cli.engine.rollout.hf_sampler"),
                       ("meds_cli.engine.model_io.model", "meds_cli.engine.config"),
                       ("meds_cli.engine.run_folders.checkpoints", "meds_cli.engine.trainer"))
    assert room_violations(bad) == [
        "meds_cli.engine.model_io.model (model_io) imports meds_cli.engine.config (config)",
        "meds_cli.engine.run_folders.checkpoints (run_folders) imports meds_cli.engine.trainer (top)",
        "meds_cli.engine.training.update (training) imports meds_cli.engine.rollout.hf_sampler (rollout)",
    ]


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_the_checks_catch_a_bad_import(graph):
    bad = with_imports(graph, ("meds_cli.core.records", "meds_cli.engine.config"),
                       ("algorithms.dapo", "meds_cli.engine.rollout.batch"),
                       ("meds_cli.engine.trainer", "meds_cli.commands.train"))
    assert violations(bad) == [
        "algorithms.dapo (plugins) imports meds_cli.engine.rollout.batch (engine)",
        "meds_cli.core.records (core) imports meds_cli.engine.config (engine)",
        "meds_cli.engine.trainer (engine) imports meds_cli.commands.train (cli)",
    ]
    bad["algorithms.base"].add("algorithms.meds")
    assert any({"algorithms.base", "algorithms.meds"} <= set(c) for c in cycles(bad))


def test_a_lazy_import_inside_a_function_counts():
    tree = ast.parse("def f():\n    from meds_cli.engine.model_io.model import load_tokenizer\n")
    assert "meds_cli.engine.model_io.model" in imported_names(tree, "algorithms.x", False)


# ---------------------------------------------------------------- the loop stays one screen


def counted_imports(graph: dict[str, set[str]], module: str) -> set[str]:
    """The project modules `module` imports, a package left out where one of its modules is named
    (`from meds_cli.engine.run_folders import checkpoints` is one import)."""
    names = graph[module]
    return {name for name in names if not any(other.startswith(name + ".") for other in names)}


def node_lines(path: Path, name: str) -> int:
    """Lines of the class or function `name` (the first found) in `path`, decorators left out."""
    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)
    return node.end_lineno - node.lineno + 1


ENGINE = ROOT / "meds_cli" / "engine"


def test_the_loop_and_the_run_config_stay_small(graph):
    """trainer.py reads as the loop itself (architecture.md, "Rooms inside the engine"): few imports,
    the Trainer class under 250 lines, one step on one screen; the run config names few modules
    (engines and algorithms register their own sections; the sixteenth is the tool settings, which the
    rollout section inherits: docs/tools.md, "Settings")."""
    assert len(counted_imports(graph, "meds_cli.engine.trainer")) <= 12, sorted(counted_imports(
        graph, "meds_cli.engine.trainer"))
    assert node_lines(ENGINE / "trainer.py", "Trainer") < 250
    assert node_lines(ENGINE / "trainer.py", "train_step") <= 40
    assert len(counted_imports(graph, "meds_cli.engine.config")) <= 16, sorted(counted_imports(
        graph, "meds_cli.engine.config"))


def test_the_size_checks_count_what_they_say():
    graph = {"m": {"meds_cli.engine.run_folders", "meds_cli.engine.run_folders.checkpoints", "meds_cli.core.markup"}}
    assert counted_imports(graph, "m") == {"meds_cli.engine.run_folders.checkpoints", "meds_cli.core.markup"}
    assert node_lines(Path(__file__), "node_lines") == 5
