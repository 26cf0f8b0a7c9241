"""The house has floors: every import points down, and no package or module imports in a circle.

Floors, bottom up: `finetune_api` (the API and the contract); `finetune_plan` (the planner);
then the three parts that stand on them, `finetune_operator`, `finetune_cli` and
`finetune_trainer`, which do not import each other (the CLI reaches the trainer only through
`finetune_cli.trainer_seam`, by name). Beside the product: `bench` (on the planner, the API and
the trainer, never on `tests`), `hack` (the local cluster's and the demo's tools, on nothing of
the project) and `tests`, on all of them. Every import counts, also one inside a function or under
`if TYPE_CHECKING:`: a lazy import or one made for the type checker is still an arrow.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.layers import PACKAGES

REPO = Path(__file__).resolve().parents[2]
ROOTS = {
    **PACKAGES,
    "bench": REPO / "bench",
    "hack": REPO / "hack",
    "tests": REPO / "tests",
}
# What each package may import of the project's packages (itself always).
ALLOWED: dict[str, set[str]] = {
    "finetune_api": set(),
    "finetune_plan": {"finetune_api"},
    "finetune_operator": {"finetune_api", "finetune_plan"},
    "finetune_cli": {"finetune_api", "finetune_plan"},
    "finetune_trainer": {"finetune_api", "finetune_plan"},
    # The bench times the product through its own entry points; it runs no test's code.
    "bench": {"finetune_api", "finetune_plan", "finetune_trainer"},
    # The local cluster and the demo's tools: nothing of the product.
    "hack": set(),
    "tests": {
        "finetune_api",
        "finetune_plan",
        "finetune_operator",
        "finetune_cli",
        "finetune_trainer",
        "bench",
        "hack",
    },
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _import_nodes(node)


def _resolve(name: str) -> str | None:
    """The project module `name` is, or lies in (a name imported from a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for name in names:
            found = _resolve(name)
            if found is not None and found != module:
                targets.add(found)
    return targets


GRAPH = {module: imports_of(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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


def test_the_walk_sees_the_packages() -> None:
    """A walk that found nothing would pass everything: it must see the known arrows."""
    assert "finetune_api.spec" in GRAPH["finetune_plan.parallelism"]
    assert "finetune_plan.pod" in GRAPH["finetune_operator.builders.job"]
    assert len(MODULES) > 100


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_every_arrow_points_down(package: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert not wrong, f"{package} imports a floor it stands under or beside: {wrong}"


def test_no_module_imports_in_a_circle() -> None:
    assert not _cycles(GRAPH), f"import circles: {_cycles(GRAPH)}"


def room(module: str) -> str:
    """The room a module stands in, as `farm-studio look` draws a package: a module directly in a
    top package is a room of its own, a sub-package (`builders`, `data`, `modes`...) one room."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else module


def test_no_package_imports_in_a_circle() -> None:
    """Inside a package too: its modules and sub-packages, each sub-package one room, form no circle
    (two files of two sub-packages can make one though no file imports in a circle)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        here = room(module)
        for target in targets:
            there = room(target)
            if there != here and module.split(".")[0] == target.split(".")[0]:
                rooms.setdefault(here, set()).add(there)
    assert not _cycles(rooms), f"room circles: {_cycles(rooms)}"
