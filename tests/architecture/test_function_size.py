"""No function of the project is longer than a screen, no class longer than a module should be: a
long function is a recipe waiting for its stages (see finetune_trainer.training.recipe), a long class two
jobs in one. Every package counts (the operator's, the API's, the planner's, the CLI's, the
trainer's, bench and hack), counted with `ast` from the `def` or `class` line to the body's last
line, docstring included."""

import ast
from pathlib import Path

import pytest

from tests.support.layers import SOURCE_ROOTS

REPO = Path(__file__).resolve().parents[2]
ROOTS = (*SOURCE_ROOTS, REPO / "bench", REPO / "hack")
MAX_LINES = 80
MAX_CLASS_LINES = 400


def _sizes(root: Path, kinds: tuple[type, ...]) -> list[tuple[str, int]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, kinds):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((f"{path.relative_to(root.parent)}:{node.lineno} {node.name}", size))  # type: ignore[attr-defined]
    return found


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    return [
        f"{where}: {size} lines"
        for where, size in _sizes(root, (ast.FunctionDef, ast.AsyncFunctionDef))
        if size > limit
    ]


def long_classes(root: Path, limit: int = MAX_CLASS_LINES) -> list[str]:
    return [f"{where}: {size} lines" for where, size in _sizes(root, (ast.ClassDef,)) if size > limit]


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.name)
def test_no_function_is_over_80_lines(root: Path) -> None:
    assert not long_functions(root), f"over {MAX_LINES} lines: " + "; ".join(long_functions(root))


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: r.name)
def test_no_class_is_over_400_lines(root: Path) -> None:
    assert not long_classes(root), f"over {MAX_CLASS_LINES} lines: " + "; ".join(long_classes(root))


def test_the_walk_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
    [found] = long_functions(tmp_path)
    assert found.endswith(f"long: {MAX_LINES + 1} lines")
    (tmp_path / "long.py").write_text("def short():\n" + "\n".join(body.splitlines()[1:]) + "\n", encoding="utf-8")
    assert long_functions(tmp_path) == []


def test_the_walk_finds_a_long_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n", encoding="utf-8")
    [found] = long_classes(tmp_path)
    assert found.endswith(f"Big: {MAX_CLASS_LINES + 1} lines")
