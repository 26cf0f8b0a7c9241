"""The base against the tuned model on the held-out split (trainer evaluation/), end to end with
the real trainer on the tiny model on the CPU: one run of the learnable Alpaca tasks with a
separate held-out source (dataset.eval) serves every assertion here.

Tolerances, stated once:
- SAME_PATH: the tuned loss after training against the loop's held-out loss at that step: the
  same held-out pass on the same rows, so equal but for the order of a sum.
- MARKER_SHARE: a held-out example the training data never holds falls by less than this share of
  what the learnable held-out examples fall (measured: 0.89 against 3.39, 0.26).
"""

import json
import math
import string
from pathlib import Path
from typing import Any

import pytest

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.launch.input_check import check_inputs
from finetune_trainer.model.tiny_model import alpaca_records

from .conftest import JobDir, Run, make_job_dir

pytestmark = pytest.mark.trainer

SAME_PATH = 1e-5
# The most the marker's loss may fall, as a share of the learnable held-out examples' mean fall.
MARKER_SHARE = 0.4
STEPS = 20
# Only in the held-out source: a task the training data never has, in letters it never answers.
MARKER = {"instruction": "Spell the secret word.", "input": "", "output": "zq xv jk wp zq xv"}
HELD_OUT = 24  # learnable held-out examples besides the marker (another seed than the training data's)
# The recipe every run here trains (conftest's BASE_JOB with these changes).
RECIPE: dict[str, Any] = {
    "dataset": {"eval": {"pvc": {"claimName": "heldout", "path": "eval.jsonl"}}},
    "training": {"maxSteps": STEPS},
    "evaluation": {"atCheckpoints": True, "generate": {"count": 3, "maxNewTokens": 10}},
    "output": {"samples": {"count": 0}},
}


def held_out_job(root: Path, tiny_assets: Path) -> JobDir:
    job = make_job_dir(root, tiny_assets)
    (root / "heldout").mkdir()
    records = [*alpaca_records(HELD_OUT, seed=7), MARKER]
    (root / "heldout" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    job.spec_changes = json.loads(json.dumps(RECIPE))
    return job


def normalised(text: str) -> str:
    """Exact match's normalisation as the contract states it: lowercase, no punctuation, one space."""
    return " ".join(text.lower().translate(str.maketrans("", "", string.punctuation)).split())


def figures(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in document["figures"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run, dict[str, Any]]:
    job = held_out_job(tmp_path_factory.mktemp("evaluation"), tiny_assets)
    run = job.run()
    assert run.code == 0, run.stderr[-3000:]
    return job, run, json.loads((job.output / "evaluation.json").read_text())


def test_the_tuned_loss_is_below_the_base_loss(trained: tuple[JobDir, Run, dict[str, Any]]) -> None:
    job, run, document = trained
    assert (document["version"], document["method"], document["split"]) == (1, "sft", "dataset.eval")
    assert document["step"] == STEPS and document["examples"] == HELD_OUT + 1
    loss, perplexity = figures(document)["loss"], figures(document)["perplexity"]
    assert loss["tuned"] < loss["base"] - 1.0, loss
    assert perplexity["base"] == pytest.approx(math.exp(loss["base"])) and perplexity["better"] == "lower"
    assert perplexity["tuned"] == pytest.approx(math.exp(loss["tuned"]))
    # The tuned figure is the loop's held-out pass at the last step: the same number.
    eval_loss = {e["step"]: e["evalLoss"] for e in run.of("eval")}
    assert abs(loss["tuned"] - eval_loss[STEPS]) <= SAME_PATH
    # Measured once before the first step, at the checkpoint (atCheckpoints) and after training.
    measures = [(e["model"], e["step"]) for e in run.of("evaluation") if "loss" in e["figures"]]
    assert measures == [("base", 0), ("tuned", 10), ("tuned", STEPS)]
    assert [h["step"] for h in document["history"]] == [10, STEPS]
    assert document["history"][-1]["figures"]["loss"] == loss["tuned"]
    assert set(document["seconds"]) == {"base", "tuned", "generation"}
    assert all(seconds > 0 for seconds in document["seconds"].values())
    assert len(document["perExample"]) == HELD_OUT + 1
    # TensorBoard holds both models' figures at the steps measured.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(job.output / "tensorboard"))
    board.Reload()
    assert [(e.step, round(e.value, 5)) for e in board.Scalars("evaluation/base/loss")] == [(0, round(loss["base"], 5))]
    assert [e.step for e in board.Scalars("evaluation/tuned/loss")] == [10, STEPS]


def test_the_generation_metrics_are_the_libraries_own_scores(trained: tuple[JobDir, Run, dict[str, Any]]) -> None:
    import sacrebleu
    from rouge_score import rouge_scorer

    _, _, document = trained
    answers = document["answers"]
    assert [a["index"] for a in answers] == [0, 1, 2]
    assert all(a["prompt"] and a["reference"] for a in answers)
    table = figures(document)
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for model in ("base", "tuned"):
        said, references = [a[model] for a in answers], [a["reference"] for a in answers]
        rouge = sum(scorer.score(r, s)["rougeL"].fmeasure for s, r in zip(said, references, strict=True)) / 3
        assert table["rougeL"][model] == pytest.approx(rouge, abs=1e-12)
        assert table["chrF"][model] == pytest.approx(sacrebleu.corpus_chrf(said, [references]).score, abs=1e-9)
        assert table["bleu"][model] == pytest.approx(sacrebleu.corpus_bleu(said, [references]).score, abs=1e-9)
        exact = sum(normalised(s) == normalised(r) for s, r in zip(said, references, strict=True)) / 3
        assert table["exactMatch"][model] == exact
    assert [row["name"] for row in document["figures"]] == [
        "loss", "perplexity", "rougeL", "chrF", "bleu", "exactMatch",
    ]  # fmt: skip


def test_a_marker_only_in_the_held_out_source_is_not_learned(trained: tuple[JobDir, Run, dict[str, Any]]) -> None:
    _, run, document = trained
    # The training data is the source's 256 samples, the held-out source's 25 are apart from them.
    start = run.of("start")[0]
    assert (start["samples"], start["evalSamples"]) == (256, HELD_OUT + 1)
    rows = {row["index"]: row for row in document["perExample"]}
    marker = rows.pop(HELD_OUT)
    fall = {index: row["base"] - row["tuned"] for index, row in rows.items()}
    learnable = sum(fall.values()) / len(fall)
    losses = [run.losses[step] for step in sorted(run.losses)]
    trained_fall = losses[0] - sum(losses[-5:]) / 5
    # The training data's loss and the learnable held-out examples' fall alike; the marker's does
    # not (it falls a little: the answer's format and its end are learnt, its letters are not).
    assert trained_fall > 2.0 and learnable > 2.0, (trained_fall, learnable)
    assert marker["base"] - marker["tuned"] < MARKER_SHARE * learnable, (marker, learnable)


def test_a_bad_held_out_source_is_refused_in_one_line(job_dir: JobDir, tmp_path: Path) -> None:
    held_out = tmp_path / "heldout" / "eval.jsonl"
    held_out.parent.mkdir()
    held_out.write_text('{"instruction": "Say hi.", "output": "hi"}\n{"instruction": "x"}\n', encoding="utf-8")
    job_dir.spec_changes = json.loads(json.dumps(RECIPE))
    said = f"1 problem(s) in {held_out}: line 2: output: missing field"
    run = job_dir.run()
    assert run.code == ExitReason.InvalidData, run.stderr[-3000:]
    assert run.termination == f"InvalidData: {said}"
    assert not run.of("progress") and "Traceback" not in run.stderr
    # The pre-flight (--check-inputs, on the CPU) says the same, and names a missing source's field.
    config = TrainerConfig.model_validate_json(job_dir.config_path().read_text())
    with pytest.raises(TrainerFailure) as refused:
        check_inputs(config)
    assert (refused.value.reason, refused.value.message) == (ExitReason.InvalidData, said)
    held_out.unlink()
    with pytest.raises(TrainerFailure) as missing:
        check_inputs(config)
    assert missing.value.message == f"spec.dataset.eval: {held_out}: no such file or folder"
