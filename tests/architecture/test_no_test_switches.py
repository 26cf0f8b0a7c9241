"""No test switch in the trainer: the one seam a test reaches is finetune_trainer/faults.py, whose
hooks do nothing unless the test harness names a module in `FINETUNE_FAULTS`; no product module
reads a `FINETUNE_TEST_*` variable, imports the tests or names their module, and the training
loop's path reads no environment at all."""

import ast
from pathlib import Path

from tests.support.layers import PACKAGES

TRAINER = PACKAGES["finetune_trainer"]
SEAM = TRAINER / "faults.py"
PRODUCT = list(PACKAGES.values())
# The training loop's path: what runs every step and every micro-batch.
LOOP_PATH = [TRAINER / "training" / name for name in ("loop.py", "steps.py")]


def _modules(roots: list[Path]) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _mentions(text: str) -> list[str]:
    return [word for word in ("FINETUNE_TEST_", "trainer_faults", "tests.support") if word in text]


def test_no_trainer_module_names_a_test_switch_or_the_tests_faults() -> None:
    found = {str(p.relative_to(TRAINER)): _mentions(p.read_text(encoding="utf-8")) for p in _modules([TRAINER])}
    assert {k: v for k, v in found.items() if v} == {}
    assert len(found) > 50  # the scan saw the package


def test_no_product_module_imports_the_tests() -> None:
    offenders = []
    for path in _modules(PRODUCT):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path}:{node.lineno}" for n in names if n == "tests" or n.startswith("tests.")]
    assert offenders == []


def test_only_the_seam_reads_the_faults_variable_and_it_is_read_once_at_the_start() -> None:
    readers = [p for p in _modules(PRODUCT) if "FINETUNE_FAULTS" in p.read_text(encoding="utf-8") and p != SEAM]
    assert readers == []
    entry = (TRAINER / "launch" / "entry.py").read_text(encoding="utf-8")
    assert "faults.install()" in entry
    installs = [p for p in _modules(PRODUCT) if "faults.install(" in p.read_text(encoding="utf-8")]
    assert installs == [TRAINER / "launch" / "entry.py"]


def test_the_training_loops_path_reads_no_environment() -> None:
    for path in LOOP_PATH:
        text = path.read_text(encoding="utf-8")
        assert "os.environ" not in text and "getenv" not in text, path
