"""The evaluation across a stop: a SIGTERM during the tuned model's evaluation after training
loses no step (the last checkpoint is written before it), and the next attempt resumes at the
final step, does not measure the base again and only evaluates. The job is the learnable one of
test_evaluation.py at a learning rate of 1e-9, which leaves the adapter where it started, so
its tuned figures equal the base's (within EQUAL, 1 %)."""

import json
from pathlib import Path
from typing import Any

import pytest

from finetune_api.reasons import ExitReason
from tests.support.faults import faults_env

from .conftest import JobDir, Run
from .test_evaluation import STEPS, figures, held_out_job

pytestmark = pytest.mark.trainer

EQUAL = 0.01


@pytest.fixture(scope="module")
def stopped_then_resumed(
    tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path
) -> tuple[JobDir, Run, dict[str, Any], Run, dict[str, Any]]:
    job = held_out_job(tmp_path_factory.mktemp("evaluation-resume"), tiny_assets)
    job.spec_changes["training"]["learningRate"] = 1e-9
    job.spec_changes["evaluation"]["generate"]["count"] = 1
    stopped = job.run(env=faults_env(FINETUNE_TEST_SIGTERM_IN_EVALUATION=str(STEPS)))
    first = json.loads((job.output / "evaluation.json").read_text())
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    return job, stopped, first, resumed, json.loads((job.output / "evaluation.json").read_text())


def test_a_sigterm_in_the_tuned_evaluation_loses_no_step(
    stopped_then_resumed: tuple[JobDir, Run, dict[str, Any], Run, dict[str, Any]],
) -> None:
    job, stopped, first, resumed, _ = stopped_then_resumed
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert stopped.termination.startswith(f"Interrupted: stopped by SIGTERM after step {STEPS}; checkpoint-{STEPS}")
    assert max(stopped.losses) == STEPS
    assert (job.checkpoints / f"checkpoint-{STEPS}" / "CHECKPOINT_COMPLETE.json").is_file()
    # The first attempt's file: the base, and the checkpoint's tuned figures, never the last ones.
    assert first["step"] == 10 and [h["step"] for h in first["history"]] == [10]
    assert not first["answers"]
    # The next attempt starts at the final step: no step runs again, it only evaluates.
    assert resumed.of("start")[0]["resumeFrom"]["step"] == STEPS
    assert not resumed.of("progress")
    assert [(e["model"], e["step"]) for e in resumed.of("evaluation")] == [("base", STEPS), ("tuned", STEPS)]
    summary = json.loads((job.output / "summary.json").read_text())
    assert summary["finalStep"] == STEPS


def test_the_base_is_measured_once(
    stopped_then_resumed: tuple[JobDir, Run, dict[str, Any], Run, dict[str, Any]],
) -> None:
    _, stopped, first, resumed, last = stopped_then_resumed
    assert [e["step"] for e in stopped.of("evaluation") if e["model"] == "base"] == [0]
    # The resumed attempt's only base figures are its answers' scores; its loss is read back.
    assert all("loss" not in e["figures"] for e in resumed.of("evaluation") if e["model"] == "base")
    assert figures(last)["loss"]["base"] == figures(first)["loss"]["base"]
    assert last["seconds"]["base"] == first["seconds"]["base"]
    assert [row["base"] for row in last["perExample"]] == [row["base"] for row in first["perExample"]]
    assert [h["step"] for h in last["history"]] == [10, STEPS]


def test_at_a_learning_rate_of_1e_9_the_tuned_figures_equal_the_base(
    stopped_then_resumed: tuple[JobDir, Run, dict[str, Any], Run, dict[str, Any]],
) -> None:
    last = stopped_then_resumed[-1]
    loss = figures(last)["loss"]
    assert last["step"] == STEPS
    assert abs(loss["tuned"] - loss["base"]) <= EQUAL * loss["base"], loss
