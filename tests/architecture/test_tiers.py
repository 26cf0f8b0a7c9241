"""The tiers (tests/support/tiers.py): a test's marker follows from what it needs, `make test-fast`
never imports torch, and the guard that holds it to that fires on a planted import."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import tiers

REPO = Path(__file__).resolve().parents[2]


def test_a_module_importing_torch_through_the_trainer_is_trainer_tier() -> None:
    chain = tiers.heavy_chain(REPO / "tests" / "trainer" / "test_hardware.py")
    assert chain is not None and chain[0] == "finetune_trainer.hardware" and chain[-1] == "torch"
    assert tiers.heavy_chain(REPO / "tests" / "planning" / "test_memory.py") is None


def test_imports_inside_functions_and_for_the_type_checker_do_not_count(tmp_path: Path) -> None:
    module = tmp_path / "test_lazy.py"
    module.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import torch
            def test_x():
                import transformers
            """
        )
    )
    assert tiers.heavy_chain(module) is None
    module.write_text("try:\n    import peft\nexcept ImportError:\n    peft = None\n")
    tiers._CHAINS.clear()
    assert tiers.heavy_chain(module) == ("peft",)


@pytest.mark.parametrize(
    ("markexpr", "skipped"),
    [
        ("fast", True),
        ("not trainer", True),
        ("not cluster and not trainer", True),
        ("cluster", False),  # a trainer-tier module may hold cluster tests
        ("not gpu and not soak", False),
        ("gpu", False),
        ("", False),
    ],
)
def test_a_trainer_tier_module_is_not_imported_only_where_none_of_its_tests_can_match(
    markexpr: str, skipped: bool
) -> None:
    assert tiers.skippable(markexpr, REPO / "tests" / "trainer" / "test_hardware.py") is skipped
    assert not tiers.skippable(markexpr, REPO / "tests" / "planning" / "test_memory.py")


def test_tiers_follow_needs() -> None:
    light = REPO / "tests" / "planning" / "test_memory.py"
    heavy = REPO / "tests" / "trainer" / "test_hardware.py"
    assert tiers.tiers_of(set(), ["tmp_path"], light) == {"fast"}
    assert tiers.tiers_of(set(), ["namespace", "cluster"], light) == {"cluster"}
    assert tiers.tiers_of({"parametrize"}, [], heavy) == {"trainer"}
    assert tiers.tiers_of({"soak"}, ["cluster"], light) == {"soak", "cluster"}


def _fast(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "fast", "-q", "-p", "no:cacheprovider", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_fast_tier_collects_without_importing_torch() -> None:
    result = _fast("--collect-only")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "deselected" in result.stdout


def test_a_fast_test_that_imports_torch_errors_naming_itself() -> None:
    planted = REPO / "tests" / "architecture" / "test_zz_planted_torch_import.py"
    planted.write_text("def test_imports_torch_lazily():\n    import torch  # noqa: F401\n")
    try:
        result = _fast(str(planted.relative_to(REPO)))
    finally:
        planted.unlink()
    assert result.returncode != 0
    assert "test_imports_torch_lazily" in result.stdout and "imported torch" in result.stdout
