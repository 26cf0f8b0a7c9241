"""The planner hands the trainer its decisions typed, and `auto`, true and false are read once.

The trainer reads the plan's choices from typed fields (`finetune_plan.LayerLayout`, the plan's
properties, `finetune_trainer.memory.budget.MemoryPlan`), never from a summary dict: a key renamed in
the planner's summary would otherwise leave the trainer reading `None` without a word. Whether
`training.gradientCheckpointing` and `training.activationOffload` are `auto`, true or false is
read in one place, `finetune_plan.recompute.ask.ActivationAsk`, which every other module asks;
the spec's own validators, a layer below the planner, read them only to refuse a combination of
its fields in one line (`training.keptLayers` without `auto`, `activationOffload: inputs` where
no layer recomputes).
"""

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.layers import PACKAGES

REPO = Path(__file__).resolve().parents[2]
TRAINER = PACKAGES["finetune_trainer"]
PRODUCT = list(PACKAGES.values())
RESOLVER = PACKAGES["finetune_plan"] / "recompute" / "ask.py"
SPEC = PACKAGES["finetune_api"] / "spec.py"
ASKED_FIELDS = {"gradient_checkpointing", "activation_offload"}
# Modules that show summary.json's values to a person and decide nothing from them.
SHOWS_THE_SUMMARY = {TRAINER / "reporting" / "report.py"}


def modules(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        yield from (p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _named_summary(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "summary") or (
        isinstance(node, ast.Attribute) and node.attr == "summary"
    )


def summary_reads(path: Path) -> list[str]:
    """`summary[...]` and `summary.get(...)`, of a name or an attribute called summary."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Subscript) and _named_summary(node.value) and isinstance(node.ctx, ast.Load)) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _named_summary(node.func.value)
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def asked_field_readings(path: Path) -> list[str]:
    """Comparisons of `...gradient_checkpointing` / `...activation_offload` (a spec's words) with
    `is`, `is not`, `==` or `!=`: reading auto, true or false."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Attribute) and s.attr in ASKED_FIELDS for s in sides):
            found.append(f"{path}:{node.lineno}")
    return found


def test_the_trainer_reads_no_decision_from_a_summary_dict():
    reads = [hit for path in modules([TRAINER]) if path not in SHOWS_THE_SUMMARY for hit in summary_reads(path)]
    assert reads == [], f"summary read where a typed field should be: {reads}"
    assert all(path.is_file() for path in SHOWS_THE_SUMMARY)


def test_auto_true_and_false_are_read_in_one_place():
    readings = [hit for path in modules(PRODUCT) if path not in (RESOLVER, SPEC) for hit in asked_field_readings(path)]
    assert readings == [], f"read ActivationAsk instead: {readings}"


def test_the_scans_find_what_they_look_for(tmp_path: Path):
    """The two scans fail on a planted read (so a pass means something)."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(plan, training):\n"
        "    a = plan.summary['kept_layers']\n"
        "    b = summary.get('offloaded_layers')\n"
        "    return training.gradient_checkpointing is True or training.activation_offload == 'auto'\n"
    )
    assert len(summary_reads(planted)) == 2
    assert len(asked_field_readings(planted)) == 2
