"""How a trainer's ending is logged: a suspend is no error, a failure is."""

import logging
from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.entry import fail


def test_an_interrupted_run_logs_at_info_and_a_failure_at_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="finetune_trainer")
    said = "stopped by SIGTERM at step 398; checkpoint-398-micro-1 written"
    assert fail(tmp_path / "termination", ExitReason.Interrupted, said) == ExitReason.Interrupted
    assert (
        fail(tmp_path / "termination", ExitReason.InvalidData, "spec.dataset: no such file") == ExitReason.InvalidData
    )
    levels = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "finetune_trainer"]
    assert levels == [("INFO", f"Interrupted: {said}"), ("ERROR", "InvalidData: spec.dataset: no such file")]
    # The termination log, which the operator reads, still names the reason.
    assert (tmp_path / "termination").read_text().startswith("InvalidData: ")
