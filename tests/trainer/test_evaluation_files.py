"""evaluation.json and status.evaluation from what the evaluation measured (evaluation/files.py):
the contract's schema, a base read back only from the same held-out split and method, and the
short status line."""

import json
import math
from pathlib import Path

from finetune_trainer.evaluation.files import Record, earlier, status_of, write


def measured() -> Record:
    record = Record("sft", "evalFraction", 3, step=20)
    record.base = {"loss": 2.31, "perplexity": math.exp(2.31), "rougeL": 0.1}
    record.tuned = {"loss": 1.05, "perplexity": math.exp(1.05), "rougeL": 0.5, "exactMatch": 0.0}
    record.base_examples, record.tuned_examples = {0: 2.4, 2: 2.2}, {0: 1.0, 2: 1.1}
    record.seconds = {"base": 3.2, "tuned": 3.1, "generation": 10.0}
    record.add_history(10, {"loss": 1.5, "perplexity": math.inf})
    return record


def test_the_file_holds_the_contracts_schema(tmp_path: Path) -> None:
    path = write(tmp_path / "evaluation.json", measured())
    document = json.loads(path.read_text())
    assert list(document) == [
        "version", "method", "step", "examples", "split", "figures", "perExample", "answers", "seconds", "history",
    ]  # fmt: skip
    assert [(f["name"], f["better"]) for f in document["figures"]] == [
        ("loss", "lower"), ("perplexity", "lower"), ("rougeL", "higher"), ("exactMatch", "higher"),
    ]  # fmt: skip
    assert document["figures"][3] == {"name": "exactMatch", "base": None, "tuned": 0.0, "better": "higher"}
    assert document["perExample"] == [{"index": 0, "base": 2.4, "tuned": 1.0}, {"index": 2, "base": 2.2, "tuned": 1.1}]
    # JSON has no infinity: a figure past a float is left out of the history.
    assert document["history"] == [{"step": 10, "figures": {"loss": 1.5}}]
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_base_is_read_back_only_for_the_same_split_and_method(tmp_path: Path) -> None:
    path = write(tmp_path / "evaluation.json", measured())
    again = earlier(path, Record("sft", "evalFraction", 3))
    assert again.base == {"loss": 2.31, "perplexity": math.exp(2.31), "rougeL": 0.1}
    assert again.base_examples == {0: 2.4, 2: 2.2} and again.seconds == {"base": 3.2}
    assert again.tuned == {} and [h["step"] for h in again.history] == [10]
    for other in (Record("dpo", "evalFraction", 3), Record("sft", "dataset.eval", 3), Record("sft", "evalFraction", 4)):
        assert earlier(path, other).base == {}
    assert earlier(tmp_path / "none.json", Record("sft", "evalFraction", 3)).base == {}


def test_the_status_is_short() -> None:
    status = status_of(measured())
    assert status["summary"] == "loss 2.31 -> 1.05"
    assert status["step"] == 20 and status["base"]["loss"] == 2.31 and "exactMatch" not in status["base"]
    only_base = Record("dpo", "dataset.eval", 64)
    only_base.base = {"loss": 0.693147, "preferenceAccuracy": 0.5, "rewardAccuracy": None}
    assert status_of(only_base) == {
        "step": 0,
        "base": {"loss": 0.693147, "preferenceAccuracy": 0.5},
        "tuned": {},
        "summary": "loss 0.693 (base)",
    }
