"""The layering of ``composition`` is true: every module sits in one layer of ``LAYERS`` and
imports nothing from a higher one, and there is no import cycle; function-level imports count.

Every ``import`` of a ``composition`` module anywhere in a module (at the top, inside a function,
inside a method) is an edge; imports under ``if TYPE_CHECKING:`` never run and are left out.
``from package import name`` runs the package's ``__init__`` and, when ``name`` is a submodule,
that submodule too; importing ``a.b.c`` from outside ``a.b`` runs ``a.b``'s ``__init__`` first.
A function-level import that would close a cycle still closes it when the function runs;
hiding it in a function is how cycles were kept out of sight, so it counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = "composition"

# Cycles allowed on purpose, each with its reason. Keep this list short.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

# The layers, lowest first (docs/architecture.md draws them): a module belongs to the longest
# prefix listed (a package's prefix covers its modules), and may import its own layer and the
# ones below. The later issues' packages get a line here, or this test fails.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("composition", "composition.conf", "composition.errors", "composition.seconds", "composition.metrics",
                "composition.logging", "composition.health.draining", "composition.lifecycle.pids")),
    ("primitives", ("composition.breaker", "composition.db", "composition.cache", "composition.locks",
                    "composition.prometheus", "composition.lifecycle", "composition.jobs.recent_counts",
                    "composition.pauses", "composition.limits")),
    ("broker", ("composition.broker",)),
    ("outbox and jobs", ("composition.outbox", "composition.jobs")),
    ("schedules", ("composition.schedules",)),
    ("operations", ("composition.health", "composition.backpressure", "composition.operations",
                    "composition.sampling", "composition.queues")),
    ("wiring", ("composition.lifecycle.workers", "composition.lifecycle.components",
                "composition.lifecycle.worker_threads", "composition.lifecycle.heartbeat", "composition.checks",
                "composition.retention", "composition.tasks")),
    ("surface", ("composition.admin", "composition.management", "composition.views", "composition.urls",
                 "composition.apps", "composition.models", "composition.gunicorn", "composition.testing")),
]
# Imports that go up on purpose, each with its reason. Keep this list short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(path, root): path for path in (root / PACKAGE).rglob("*.py")
            if "migrations" not in path.parts}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(child)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the ``composition`` modules it imports, anywhere in its body."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree):
            targets: set[str] = set()
            if isinstance(node, ast.Import):
                targets = {alias.name for alias in node.names}
            else:
                source = _resolve(name, path.name == "__init__.py", node)
                targets.add(source)
                targets |= {f"{source}.{alias.name}" for alias in node.names}
            for target in targets:
                if target in modules and target != name:
                    graph[name] |= {target, *_packages_run_first(name, target, modules)}
    return graph


def _packages_run_first(importer: str, target: str, modules: dict[str, Path]) -> set[str]:
    """The packages whose ``__init__`` runs before ``target`` does: its ancestors, except those
    the importer is itself inside (already running when the importer runs)."""
    parts = target.split(".")
    ancestors = {".".join(parts[:end]) for end in range(1, len(parts))}
    own = {".".join(importer.split(".")[:end]) for end in range(1, importer.count(".") + 2)}
    return {package for package in ancestors - own if package in modules}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_composition_has_no_import_cycle() -> None:
    graph = import_graph()
    cycles = [cycle for cycle in strongly_connected(graph) if frozenset(cycle) not in ALLOWED_CYCLES]
    assert not cycles, "import cycles (function-level imports included):\n" + "\n".join(
        " <-> ".join(sorted(cycle)) for cycle in cycles)


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s longest listed prefix; None when none is listed."""
    found: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # The package itself is only its __init__: every module starts with "composition.".
            below = prefix != PACKAGE and module.startswith(prefix + ".")
            if (module == prefix or below) and (found is None or len(prefix) > found[1]):
                found = (index, len(prefix))
    return None if found is None else found[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every module missing from ``LAYERS`` and every import of a higher layer, as sentences."""
    problems = [f"{module} is in no layer of LAYERS" for module in sorted(graph) if layer_of(module) is None]
    for module in sorted(graph):
        own = layer_of(module)
        for target in sorted(graph[module]):
            above = layer_of(target)
            if own is not None and above is not None and above > own and (module, target) not in ALLOWED_UPWARD:
                problems.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[above][0]})")
    return problems


def test_no_module_imports_a_higher_layer() -> None:
    problems = layer_violations(import_graph())
    assert not problems, "\n".join(problems)


def test_the_graph_sees_function_level_imports() -> None:
    # The checker itself: a cycle closed only inside a function is found.
    tree = ast.parse("import os\n\ndef later():\n    from composition import broker\n")
    assert [type(node).__name__ for node in _imports(tree)] == ["Import", "ImportFrom"]
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    assert "composition.lifecycle.system" in import_graph()


def test_the_layer_check_fails_on_a_wrong_layer_import_and_an_unmapped_module(tmp_path: Path) -> None:
    # The checker itself, on a package laid out like ours: a ground module that imports the
    # outbox, and a module no layer lists.
    package = tmp_path / PACKAGE
    (package / "outbox").mkdir(parents=True)
    for name in ("__init__.py", "outbox/__init__.py", "outbox/publish.py"):
        (package / name).write_text("")
    (package / "conf.py").write_text("def later():\n    from composition.outbox.publish import publish\n")
    (package / "gadgets.py").write_text("")
    problems = layer_violations(import_graph(tmp_path))
    assert "composition.conf (ground) imports composition.outbox.publish (outbox and jobs)" in problems
    assert "composition.gadgets is in no layer of LAYERS" in problems
    (package / "conf.py").write_text("")
    (package / "gadgets.py").unlink()
    assert layer_violations(import_graph(tmp_path)) == []
