"""What a preference run reports, and what it counts: the real trainer (DPO and ORPO) on the tiny
model and a pair set with a learnable rule (`tiny_model.write_preference`).

Its figures (rewards, log-probabilities, ORPO's odds ratio) go into each progress line, into
TensorBoard under TRL's names, into summary.json (first and final) and, by the status patch, into
`status.progress.metrics` with a short text for `kubectl get -o wide`. What DPO and ORPO take the
mean over is pairs, and that is the count they report: `pairs`, never `trainedTokens`.
"""

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import JobDir, Run

pytestmark = pytest.mark.trainer

STEPS, BATCH, ACCUMULATION = 6, 4, 2
PREFERENCE_FIGURES = ("rewardChosen", "rewardRejected", "rewardAccuracy", "rewardMargin", "logpChosen", "logpRejected")
ORPO_FIGURES = ("nllLoss", "logOddsRatio", "logOddsChosen")
TRL_TAGS = {
    "rewardChosen": "train/rewards/chosen",
    "rewardRejected": "train/rewards/rejected",
    "rewardAccuracy": "train/rewards/accuracies",
    "rewardMargin": "train/rewards/margins",
    "logpChosen": "train/logps/chosen",
    "logpRejected": "train/logps/rejected",
    "nllLoss": "train/nll_loss",
    "logOddsRatio": "train/log_odds_ratio",
    "logOddsChosen": "train/log_odds_chosen",
}


def preference_run(job_dir: JobDir, method: str, chat: bool = False, **run: Any) -> Run:
    from finetune_trainer.model.tiny_model import write_preference

    write_preference(job_dir.root / "pairs" / "pairs.jsonl", count=64, chat=chat)
    job_dir.spec_changes = {
        "dataset": {"source": {"pvc": {"claimName": "pairs", "path": "pairs.jsonl"}}, "format": "preference"},
        "training": {
            "method": method,
            "maxSteps": STEPS,
            "batchSize": BATCH,
            "gradientAccumulation": ACCUMULATION,
            "learningRate": 5e-3,
        },
        "checkpoints": {"everySteps": STEPS, "keep": 2},
        "output": {"samples": {"count": 0}},
    }
    done = job_dir.run(**run)
    assert done.code == 0, done.stderr[-3000:]
    return done


def scalars(output: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = {path.parent for path in (output / "tensorboard").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_a_preference_run_reports_its_figures_and_counts_pairs(job_dir: JobDir, method: str) -> None:
    run = preference_run(job_dir, method)
    names = PREFERENCE_FIGURES + (ORPO_FIGURES if method == "orpo" else ())
    lines = run.of("progress")
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    for line in lines:
        assert set(names) <= set(line), line
        assert 0.0 <= line["rewardAccuracy"] <= 1.0
        assert line["rewardMargin"] == pytest.approx(line["rewardChosen"] - line["rewardRejected"], abs=1e-5)
        assert line["logpChosen"] < 0 and line["logpRejected"] < 0
        assert "trainedTokens" not in line
    # Pairs: what the loss is a mean over, every one the schedule gave the step (one process).
    assert [line["pairs"] for line in lines] == [BATCH * ACCUMULATION * step for step in range(1, STEPS + 1)]
    assert lines[-1]["tokens"] > lines[-1]["pairs"] * 2 * 8  # both sequences of every pair, each many tokens

    board = scalars(job_dir.output)
    for name in names:
        assert board[TRL_TAGS[name]] == pytest.approx({line["step"]: line[name] for line in lines}, rel=1e-6)
    assert board["train/pairs"] == {line["step"]: float(line["pairs"]) for line in lines}
    assert "train/trained_tokens" not in board

    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert summary["pairs"] == lines[-1]["pairs"] and "trainedTokens" not in summary
    assert summary["firstMetrics"] == {name: lines[0][name] for name in names}
    assert summary["finalMetrics"] == {name: lines[-1][name] for name in names}


def test_a_message_pair_run_reports_the_same_figures(job_dir: JobDir) -> None:
    """Pairs rendered with the model's chat template train and report like string pairs."""
    lines = preference_run(job_dir, "dpo", chat=True).of("progress")
    assert all(set(PREFERENCE_FIGURES) <= set(line) and math.isfinite(line["loss"]) for line in lines)
    assert lines[-1]["pairs"] == BATCH * ACCUMULATION * STEPS


def test_the_status_patch_carries_the_figures_in_short() -> None:
    """What goes into `status.progress`: the method's count under its own name, its figures (a
    NaN left out: JSON has none) and the text the Metrics column and `ftjob status` show."""
    from finetune_api.objectives import OBJECTIVES
    from finetune_api.status import FineTuneJobStatus
    from finetune_trainer.objectives.preference import Dpo
    from finetune_trainer.reporting.progress import Counting, Progress

    dpo = Dpo(OBJECTIVES.get("dpo"))
    progress = Progress(None, None, 10, Counting(dpo.trained_name, dpo.metric_tags, dpo.metrics_text))
    progress.begin(0)
    figures: dict[str, Any] = {"rewardAccuracy": 0.9325, "rewardMargin": 1.2345, "logpChosen": float("nan")}
    progress.step(1, loss=0.5, lr=1e-3, tokens=100, trained=8, epoch=0.1, report=True, metrics=figures)
    status = progress.status_progress()
    assert status["pairs"] == 8 and "trainedTokens" not in status
    assert status["metrics"] == {"rewardAccuracy": 0.9325, "rewardMargin": 1.2345}
    assert status["metricsText"] == "reward acc 0.93 margin 1.23"
    parsed = FineTuneJobStatus.model_validate({"progress": status}).model_dump(by_alias=True, exclude_none=True)
    assert parsed["progress"]["metrics"] == status["metrics"] and parsed["progress"]["pairs"] == 8
