"""`ftjob run`'s options reach the trainer's entry exactly as given (the trainer itself is
replaced here by a recorder: its own tests run it)."""

import sys
import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from finetune_cli.main import main
from tests.support.cli import REPO, assert_one_line_error, ftjob

TINY = str(REPO / "examples" / "tiny-job.yaml")


@pytest.fixture
def trainer_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def record(argv: Sequence[str]) -> int:
        calls.append(list(argv))
        return 0

    # The CLI reaches the trainer only through its seam module, loaded by name.
    seam = types.ModuleType("finetune_trainer.seam")
    seam.run_trainer = record  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "finetune_trainer.seam", seam)
    return calls


def test_nproc_is_passed_to_the_trainer(tmp_path: Path, trainer_calls: list[list[str]]):
    assert main(["run", TINY, "--workdir", str(tmp_path), "--nproc", "2"]) == 0
    (argv,) = trainer_calls
    assert argv[-2:] == ["--nproc", "2"]
    assert argv[:2] == ["--config", str(tmp_path / ".ftjob" / "tiny" / "config.json")]


def test_without_nproc_the_trainer_gets_the_pods_arguments(tmp_path: Path, trainer_calls: list[list[str]]):
    assert main(["run", TINY, "--workdir", str(tmp_path)]) == 0
    (argv,) = trainer_calls
    assert "--nproc" not in argv
    assert argv == [
        "--config",
        str(tmp_path / ".ftjob" / "tiny" / "config.json"),
        "--termination-log",
        str(tmp_path / ".ftjob" / "tiny" / "termination-log"),
    ]


@pytest.mark.parametrize("value", ["0", "-1"])
def test_nproc_below_one_is_a_one_line_error(tmp_path: Path, value: str):
    result = ftjob("run", TINY, "--workdir", str(tmp_path), "--nproc", value)
    assert_one_line_error(result, f"--nproc: must be at least 1, got {value}")
    assert not (tmp_path / ".ftjob").exists()
