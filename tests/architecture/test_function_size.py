"""No function in the trainer is longer than a screen: a long one is a recipe waiting for its
stages (see finetune_trainer.recipe). Counted with `ast`, from the `def` line to the body's last
line, docstring included."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "trainer_image"
MAX_LINES = 80


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {size} lines")
    return found


def test_no_trainer_function_is_over_80_lines() -> None:
    assert not long_functions(TRAINER), f"over {MAX_LINES} lines: " + "; ".join(long_functions(TRAINER))


def test_the_walk_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
    [found] = long_functions(tmp_path)
    assert found.endswith(f"long: {MAX_LINES + 1} lines")
    (tmp_path / "long.py").write_text("def short():\n" + "\n".join(body.splitlines()[1:]) + "\n", encoding="utf-8")
    assert long_functions(tmp_path) == []
