"""The house has floors: every import points down, and no package or module imports in a circle.

Floors, bottom up: `finetune_api` (the API and the contract); `finetune_plan` (the planner);
then the three parts that stand on them, `finetune_operator`, `finetune_cli` and
`finetune_trainer`, which do not import each other (the CLI reaches the trainer only through
`finetune_cli.trainer_seam`, by name). Beside the product: `bench` (on the planner, the API and
the trainer, never on `tests`), `hack` (the local cluster's and the demo's tools, on nothing of
the project) and `tests`, on all of them. Every import counts, also one inside a function or under
`if TYPE_CHECKING:`: a lazy import or one made for the type checker is still an arrow.

Inside a package, its rooms (modules at its top, sub-packages) import in no circle; inside the
trainer they also stand on floors (`TRAINER_FLOORS`, bottom up), and every arrow between two of
its rooms points to a lower floor.
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
    """The room a module stands in, the unit the circle check and the floors inside a package
    weigh: a module directly in a top package is a room of its own (`finetune_trainer.seam`), a
    sub-package with everything under it is one room (`finetune_operator.builders`,
    `finetune_trainer.model`); the top package's own `__init__` is a room too."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 else module


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between rooms of one package (an arrow into another package is not a room's)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = room(module)
        for target in targets:
            there = room(target)
            if there != here and module.split(".")[0] == target.split(".")[0]:
                rooms.setdefault(here, set()).add(there)
    return rooms


def test_no_package_imports_in_a_circle() -> None:
    """Inside a package too: its modules and sub-packages, each sub-package one room, form no circle
    (two files of two sub-packages can make one though no file imports in a circle)."""
    assert not _cycles(room_graph(GRAPH)), f"room circles: {_cycles(room_graph(GRAPH))}"


# The floors inside the trainer, bottom up: a room of `finetune_trainer` (a sub-package, or a
# module at its top, by its name under the package; `__init__` is the package's own) imports
# only rooms on floors below its own, never one beside it or above. A new room needs its floor
# here; docs/trainer.md's map gives the same floors (tests/architecture/test_trainer_map.py).
TRAINER = "finetune_trainer"
TRAINER_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"__init__", "failures", "faults"}),
    frozenset({"data", "distributed", "hardware", "objects", "reporting"}),
    frozenset({"memory", "state"}),
    frozenset({"modes"}),
    frozenset({"model"}),
    frozenset({"objectives", "outputs"}),
    frozenset({"evaluation"}),
    frozenset({"training"}),
    frozenset({"launch"}),
    frozenset({"__main__", "seam"}),
)


def trainer_room(module: str) -> str:
    """A trainer module's room by its name under the package: `finetune_trainer.model.loading`
    is `model`, `finetune_trainer.seam` is `seam`."""
    name = room(module)
    return "__init__" if name == TRAINER else name.removeprefix(f"{TRAINER}.")


def floor_of(name: str, floors: tuple[frozenset[str], ...] = TRAINER_FLOORS) -> int | None:
    return next((level for level, rooms in enumerate(floors) if name in rooms), None)


def arrows_not_down(graph: dict[str, set[str]], floors: tuple[frozenset[str], ...] = TRAINER_FLOORS) -> list[str]:
    """Every arrow between two rooms of the trainer that does not point to a lower floor (up, or
    sideways to a room on the same floor), as `module -> target (floor -> floor)`."""
    wrong = []
    for module, targets in graph.items():
        if module.split(".")[0] != TRAINER:
            continue
        here = trainer_room(module)
        for target in targets:
            there = trainer_room(target)
            if target.split(".")[0] != TRAINER or there == here:
                continue
            low, high = floor_of(there, floors), floor_of(here, floors)
            if low is None or high is None or low >= high:
                wrong.append(f"{module} -> {target} ({here} on {high}, {there} on {low})")
    return sorted(wrong)


def test_every_room_of_the_trainer_has_its_floor() -> None:
    rooms = {trainer_room(module) for module in MODULES if module.split(".")[0] == TRAINER}
    placed = set().union(*TRAINER_FLOORS)
    assert rooms - placed == set(), f"rooms of the trainer with no floor in TRAINER_FLOORS: {sorted(rooms - placed)}"
    assert placed - rooms == set(), f"TRAINER_FLOORS names rooms that are not there: {sorted(placed - rooms)}"
    assert sum(len(rooms) for rooms in TRAINER_FLOORS) == len(placed), "a room stands on two floors"


def test_every_arrow_inside_the_trainer_points_down_its_floors() -> None:
    wrong = arrows_not_down(GRAPH)
    assert not wrong, f"arrows inside finetune_trainer that do not point down TRAINER_FLOORS: {wrong}"


def _copy(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {module: set(targets) for module, targets in graph.items()}


def test_the_floor_check_finds_a_planted_arrow_up_and_one_sideways() -> None:
    """It can fail: in a copy of the graph, the hardware importing the model's attention (the arrow
    this layout took out) and the state importing the memory beside it are both found."""
    planted = _copy(GRAPH)
    planted[f"{TRAINER}.hardware.capabilities"].add(f"{TRAINER}.model.attention")
    planted[f"{TRAINER}.state.checkpoints"].add(f"{TRAINER}.memory.budget")
    assert arrows_not_down(planted) == [
        f"{TRAINER}.hardware.capabilities -> {TRAINER}.model.attention (hardware on 1, model on 4)",
        f"{TRAINER}.state.checkpoints -> {TRAINER}.memory.budget (state on 2, memory on 2)",
    ]


def test_the_circle_check_finds_a_planted_circle_between_rooms() -> None:
    """It can fail: two rooms that each import the other, through files that make no circle of
    their own, are one circle."""
    planted = _copy(GRAPH)
    planted[f"{TRAINER}.distributed.topology"].add(f"{TRAINER}.reporting.progress")
    planted[f"{TRAINER}.reporting.status_patch"].add(f"{TRAINER}.distributed.gradsync")
    assert not _cycles(planted)
    assert _cycles(room_graph(planted)) == [[f"{TRAINER}.distributed", f"{TRAINER}.reporting"]]
