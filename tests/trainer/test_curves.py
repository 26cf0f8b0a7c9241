"""What a job made, as the trainer reports it: the loss curve beside the adapter (read back from
every attempt's TensorBoard files, a resume's repeated steps once), the whole run's eval figures
for summary.json, and an ETA at the plan's pace until the run has timed steps of its own."""

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from finetune_trainer.reporting import curves
from finetune_trainer.reporting.progress import MEASURED_STEPS, Progress

PNG = b"\x89PNG\r\n\x1a\n"


def attempt(folder: Path, steps: range, loss: float, evals: dict[int, float]) -> None:
    """One attempt's TensorBoard file, as progress.py writes it."""
    writer = SummaryWriter(log_dir=str(folder))  # type: ignore[no-untyped-call]
    for step in steps:
        writer.add_scalar(curves.TRAIN_LOSS, loss - step * 0.1, step)
        writer.add_scalar(curves.LEARNING_RATE, 1e-3, step)
        if step in evals:
            writer.add_scalar(curves.EVAL_LOSS, evals[step], step)
    writer.close()


def test_a_resumed_run_has_each_step_once_and_its_best_eval_named(tmp_path: Path) -> None:
    board = tmp_path / "tensorboard"
    # The first attempt got to step 6 and checkpointed at 4; the second resumed there.
    attempt(board, range(1, 7), 5.0, {2: 4.0, 4: 3.0, 6: 3.5})
    attempt(board, range(5, 9), 9.0, {6: 2.5, 8: 2.75})
    history = curves.read(board)
    assert sorted(history.train) == list(range(1, 9))
    # TensorBoard keeps float32: the first attempt's 1-4, the resumed one's 5-8.
    assert history.train[4] == pytest.approx(5.0 - 0.4) and history.train[6] == pytest.approx(9.0 - 0.6)
    assert history.eval == {2: 4.0, 4: 3.0, 6: 2.5, 8: 2.75}
    assert history.eval_summary() == {"finalEvalLoss": 2.75, "bestEvalLoss": 2.5, "bestEvalStep": 6}
    out, read = curves.write(board, tmp_path / "loss-curve.png", "FineTuneJob team-a/tiny")
    assert out == tmp_path / "loss-curve.png" and read.train == history.train
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 10_000


def test_no_points_no_picture_and_no_eval_no_figures(tmp_path: Path) -> None:
    out, history = curves.write(tmp_path / "missing", tmp_path / "loss-curve.png", "none")
    assert out is None and not (tmp_path / "loss-curve.png").exists()
    assert history.eval_summary() == {"finalEvalLoss": None, "bestEvalLoss": None, "bestEvalStep": None}


def test_the_eta_follows_the_plan_until_steps_are_timed_then_the_runs_own_pace() -> None:
    progress = Progress(None, None, total_steps=100, planned_step_seconds=2.0)
    progress.begin(0)
    # The plan's 2 s a step, whatever the first steps took (a warm-up, or a tiny CPU step).
    for done in range(1, MEASURED_STEPS):
        assert progress.eta(done, elapsed=0.05 * done, done=done) == (100 - done) * 2.0
    progress.first_step_seconds = 5.0  # a slow warm-up step, then 1 s a step
    elapsed = 5.0 + (MEASURED_STEPS - 1) * 1.0
    assert progress.eta(MEASURED_STEPS, elapsed=elapsed, done=MEASURED_STEPS) == (100 - MEASURED_STEPS) * 1.0
    # Without a plan (the CPU), the run's own pace from its first step.
    cpu = Progress(None, None, total_steps=10)
    assert cpu.eta(1, elapsed=0.5, done=1) == 9 * 0.5
