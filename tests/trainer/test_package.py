"""Package hygiene: the trainer never imports kopf, and importing the package stays cheap."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trainer_image" / "finetune_trainer"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_of_the_trainer_imports_kopf_or_the_operator() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(imported_modules(path) & {"kopf", "finetune_operator"})
        for path in PACKAGE.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(offenders) > 10  # the scan really saw the package


def test_importing_the_package_and_its_light_modules_does_not_load_torch() -> None:
    code = (
        "import sys, finetune_trainer, finetune_trainer.state.checkpoints, finetune_trainer.data.checks, "
        "finetune_trainer.data.records, finetune_trainer.failures, finetune_trainer.faults;"
        "heavy = sorted({'torch', 'transformers', 'kopf'} & set(sys.modules));"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
