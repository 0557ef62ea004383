"""The layers of docs/architecture.md, checked on the code's own imports.

Read from the source with `ast` (nothing is imported, so an import made only inside a function counts
as much as one at the top; only `if TYPE_CHECKING:` imports are left out, since they never run). A
failure names the importing file and line and the rule it breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The product's Python packages; the trainer and the sandbox stand apart from forja (below).
PACKAGES = ("forja", "trainer", "forja_sandbox")

#: forja's layers, lowest first. A module may import its own layer and those below, never above.
#: Every forja module not named here is core: the parts the session and the verbs are made of.
LAYERS: dict[str, int] = {
    "forja.session": 1,
    **dict.fromkeys(
        ("forja.lifecycle", "forja.preflight", "forja.following", "forja.training", "forja.replace",
         "forja.datasets", "forja.colab", "forja.cost_report", "forja.hub", "forja.managed", "forja.vertex",
         "forja.vertex_job", "forja.ui", "forja.ui.server", "forja.ui.views", "forja.ui.vendor",
         "forja.top", "forja.zones", "forja.prune", "forja.deletion", "forja.sweep",
         "forja.sweep_runners", "forja.queue", "forja.plan", "forja.again", "forja.record"), 2),
    "forja.api": 3,
    "forja.cli": 4,
    "forja.cost.__main__": 4,  # `python -m forja.cost`: the `forja cost` command under another name
    "forja.__main__": 4,  # `python -m forja`: the `forja` command itself
}
LAYER_NAMES = ("core", "session", "features", "api", "cli")


@dataclass(frozen=True)
class Import:
    """One runtime import: the module that imports, where, the module it reaches, the name it takes
    from there (None: the module itself), and the local name bound when that is a module."""

    module: str
    path: Path
    line: int
    target: str
    name: str | None
    module_alias: str | None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The product module a dotted name lands in (a name inside a module lands in that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def _imports(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_nodes(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    yield Import(module, path, node.lineno, target, None, alias.asname)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                bound = alias.asname or alias.name
                if f"{base}.{alias.name}" in MODULES:  # a module taken from its package
                    yield Import(module, path, node.lineno, f"{base}.{alias.name}", None, bound)
                elif target := _resolve(base):
                    yield Import(module, path, node.lineno, target, alias.name, None)


IMPORTS = [found for module, path in MODULES.items() for found in _imports(module, path)]


def _where(found: Import) -> str:
    return f"{found.path.relative_to(REPO)}:{found.line} ({found.module} -> {found.target})"


def _layer(module: str) -> int:
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return 0


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package: str) -> None:
    graph: dict[str, set[str]] = {}
    for found in IMPORTS:
        if (found.module.split(".")[0] == package == found.target.split(".")[0]
                and found.target != found.module):
            graph.setdefault(found.module, set()).add(found.target)
    circles = _cycles(graph)
    detail = [_where(f) for f in IMPORTS if any(f.module in c and f.target in c for c in circles)]
    assert circles == [], f"import circles: {circles}; their imports: {detail}"


def test_no_forja_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{_where(f)}: {LAYER_NAMES[_layer(f.module)]} imports {LAYER_NAMES[_layer(f.target)]}"
              for f in IMPORTS
              if f.module.startswith("forja.") and f.target.startswith("forja.")
              and _layer(f.target) > _layer(f.module)]
    assert upward == []


def test_the_trainer_and_the_product_stand_apart_from_what_sits_above_them() -> None:
    """The trainer is copied to hosts alone: it imports nothing of forja. The product installs without
    the sandbox: forja imports nothing of forja_sandbox (its `forja sandbox` command arrives through
    the `forja.cli` entry point)."""
    below = {"trainer": ("forja", "forja_sandbox"), "forja": ("forja_sandbox",)}
    crossing = [_where(f) for f in IMPORTS
                if f.target.split(".")[0] in below.get(f.module.split(".")[0], ())]
    assert crossing == []


def test_a_training_run_does_not_load_the_planner() -> None:
    """The run writes its measured memory with trainer.metrics' allocator helpers; the planner
    (trainer.plan: fake-tensor tracing and the GPU table) is `forja plan`'s alone."""
    assert [_where(f) for f in IMPORTS if f.module == "trainer.train" and f.target == "trainer.plan"] == []


def test_no_private_name_is_used_across_modules() -> None:
    """`from m import _x`, or `m._x` on an imported module, ties a module to another's insides."""
    crossing = [f"{_where(f)} imports {f.name}" for f in IMPORTS
                if f.name and f.name.startswith("_") and not f.name.startswith("__") and f.target != f.module]
    for module, path in MODULES.items():
        aliases = {f.module_alias: f.target for f in IMPORTS if f.module == module and f.module_alias}
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases.get(node.value.id) not in (None, module)):
                crossing.append(f"{path.relative_to(REPO)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert crossing == []
