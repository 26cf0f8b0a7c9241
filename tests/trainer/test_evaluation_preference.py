"""The evaluation of a DPO job on the tiny model's learnable pairs (the chosen answer is the right
opposite or the animal's own sound): on held-out pairs the tuned model's implicit reward prefers
the chosen answer almost always, while the base prefers it about as often as a coin's toss.

The held-out pairs (dataset.eval) are drawn by another seed from the same rule, whose 70 distinct
pairs the training data covers: they measure the rule learned, not words never seen (a tiny
model cannot know the opposite of a word it was never shown).

Tolerances, stated once:
- REWARD_ACCURACY: the tuned reward accuracy on the held-out pairs must be above it (measured 0.92).
- COIN: the base's preference accuracy lies within this of 0.5 (measured 0.45 on 64 pairs).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from finetune_trainer.model.tiny_model import write_preference

from .conftest import JobDir, Run, make_job_dir
from .test_evaluation import figures

pytestmark = pytest.mark.trainer

REWARD_ACCURACY = 0.9
COIN = 0.15
HELD_OUT = 64
STEPS = 100


@pytest.fixture(scope="module")
def dpo(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run, dict[str, Any]]:
    root = tmp_path_factory.mktemp("evaluation-dpo")
    job = make_job_dir(root, tiny_assets)
    write_preference(root / "pairs" / "train.jsonl", 256, seed=0)
    write_preference(root / "pairs" / "held-out.jsonl", HELD_OUT, seed=1)
    job.spec_changes = {
        "dataset": {
            "source": {"pvc": {"claimName": "pairs", "path": "train.jsonl"}},
            "eval": {"pvc": {"claimName": "pairs", "path": "held-out.jsonl"}},
            "format": "preference",
        },
        # examples/dpo-tiny.yaml's recipe, run longer, without what only costs time on the CPU.
        "lora": {"dropout": 0.0},
        "training": {
            "method": "dpo",
            "maxSteps": STEPS,
            "learningRate": 5.0e-3,
            "warmupRatio": 0.05,
            "batchSize": 8,
            "gradientCheckpointing": False,
            "optimizer": "adamw_torch",
        },
        "checkpoints": {"everySteps": STEPS},
        "evaluation": {"generate": {"count": 2, "maxNewTokens": 6}},
        "output": {"samples": {"count": 0}},
    }
    run = job.run()
    assert run.code == 0, run.stderr[-3000:]
    return job, run, json.loads((job.output / "evaluation.json").read_text())


def test_the_tuned_reward_prefers_the_chosen_answers_and_the_base_does_not(
    dpo: tuple[JobDir, Run, dict[str, Any]],
) -> None:
    job, run, document = dpo
    assert (document["method"], document["split"], document["examples"]) == ("dpo", "dataset.eval", HELD_OUT)
    table = figures(document)
    assert table["rewardAccuracy"]["tuned"] > REWARD_ACCURACY, table
    assert table["rewardAccuracy"]["base"] is None and table["rewardMargin"]["base"] is None
    assert table["rewardMargin"]["tuned"] > 0
    assert abs(table["preferenceAccuracy"]["base"] - 0.5) <= COIN, table
    assert table["preferenceAccuracy"]["tuned"] > table["preferenceAccuracy"]["base"]
    # The base is the reference: its implicit reward is zero, and DPO's loss is log 2 exactly.
    assert table["loss"]["base"] == pytest.approx(0.6931471805599453, abs=1e-6)
    assert table["loss"]["tuned"] < table["loss"]["base"]
    # Per pair: the chosen answer's summed log-probability less the rejected one's, whose sign
    # is what the preference accuracy counts.
    margins = [row["tuned"] for row in document["perExample"]]
    assert len(margins) == HELD_OUT
    assert sum(m > 0 for m in margins) / HELD_OUT == table["preferenceAccuracy"]["tuned"]
    # Answers scored against the pair's chosen answer.
    pairs = [json.loads(line) for line in (job.root / "pairs" / "held-out.jsonl").read_text().splitlines()]
    assert [(a["index"], a["prompt"], a["reference"]) for a in document["answers"]] == [
        (i, pairs[i]["prompt"], pairs[i]["chosen"]) for i in (0, 1)
    ]
    tuned = [e for e in run.of("evaluation") if e["model"] == "tuned"]
    assert tuned[-1]["figures"]["rewardAccuracy"] == table["rewardAccuracy"]["tuned"]
