"""How a trainer's ending is logged: a suspend is no error, a failure is."""

import logging
from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.launch.entry import fail


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


def test_progress_columns_read_as_kubectl_shows_them() -> None:
    """PROGRESS and LOSS are printer columns of strings the trainer writes: a column cannot
    format a number (8.3, not 8.3%; every digit of a float)."""
    from finetune_api.status import FineTuneJobStatus
    from finetune_trainer.reporting.progress import Progress

    progress = Progress(None, None, 12)
    progress.begin(0)
    progress.step(1, loss=1.2345678901234567, lr=1e-3, tokens=10, epoch=0.1, report=True)
    status = progress.status_progress()
    assert (status["percent"], status["percentText"]) == (8.3, "8.3%")
    assert status["lossText"] == "1.235"
    parsed = FineTuneJobStatus.model_validate({"progress": status})
    assert parsed.progress is not None and parsed.progress.loss_text == "1.235"
    assert "evalLoss" not in status  # no evaluation yet: nothing to show


def test_the_eval_loss_goes_into_the_status_patch() -> None:
    """The held-out loss measured at a checkpoint rides the next status patch (the checkpoint's),
    as `status.progress.evalLoss`, and `-o wide` reads its text."""
    from finetune_api.status import FineTuneJobStatus
    from finetune_trainer.reporting.progress import Progress
    from finetune_trainer.reporting.status_patch import StatusReporter

    sent: list[dict[str, object]] = []

    class Recorder(StatusReporter):
        def __init__(self) -> None:  # no API, no thread: only what would be patched
            pass

        def progress(self, progress: dict[str, object]) -> None:
            sent.append(progress)

    reporter = Recorder()
    progress = Progress(reporter, None, 20)
    progress.begin(0)
    progress.step(10, loss=1.5, lr=1e-3, tokens=10, epoch=0.5, report=True)
    progress.evaluated(10, 1.2345678)
    reporter.progress(progress.status_progress())  # what save_checkpoint sends next
    patch = sent[-1]
    assert (patch["evalLoss"], patch["evalLossText"], patch["evalStep"]) == (1.2345678, "1.235", 10)
    parsed = FineTuneJobStatus.model_validate({"progress": patch})
    assert parsed.progress is not None and parsed.progress.eval_loss_text == "1.235"
    assert parsed.model_dump(by_alias=True, exclude_none=True)["progress"]["evalLoss"] == 1.2345678
