"""`ftjob plan` for preference tuning: how a pair goes through the model and what DPO's reference
forward costs, in the text and in the JSON, from the planner call the trainer makes."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.planning.models import LLAMA_33_70B
from tests.support.cli import REPO, ftjob

EXAMPLE_70B = REPO / "examples" / "llama-3.3-70b-4xp40.yaml"


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    """The 70B-on-4-P40 example trained with DPO on preference data, and the model's config.json."""
    body: dict[str, Any] = yaml.safe_load(EXAMPLE_70B.read_text(encoding="utf-8"))
    body["spec"]["dataset"]["format"] = "preference"
    body["spec"]["training"]["method"] = "dpo"
    job = tmp_path / "dpo.yaml"
    job.write_text(yaml.safe_dump(body), encoding="utf-8")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_33_70B), encoding="utf-8")
    return str(job), str(config)


def _lines(out: str, label: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(label)]


def test_a_pair_in_one_micro_batch_and_the_reference_forward_are_printed(files: tuple[str, str]) -> None:
    job, config = files
    result = ftjob("plan", job, "--model-config", config)
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout, "pairs ") == ["pairs     chosen and rejected in one micro-batch of 2 x 1 sequences"]
    (reference,) = _lines(result.stdout, "reference ")
    assert reference.startswith("reference 1 no-grad forward per sequence (the model without its adapter): ")
    assert reference.endswith(" s per micro-batch")
    assert "maxLength 2048 x batch 1," in result.stdout


def test_where_both_sides_do_not_fit_the_plan_splits_the_pair_and_says_why(files: tuple[str, str]) -> None:
    job, config = files
    result = ftjob("plan", job, "--model-config", config, "--max-length", "4096")
    assert result.returncode == 0, result.stderr
    (pairs,) = _lines(result.stdout, "pairs ")
    assert pairs.startswith(
        "pairs     chosen and rejected in two micro-batches of 1 sequence each (memory: one of 2 x 1 sequences needs "
    )
    assert "GiB more than its 22.4 GiB); each side first once without gradients: " in pairs
    assert _lines(result.stdout, "reference 1 no-grad forward per sequence")
    (longest,) = _lines(result.stdout, "longest ")
    assert "(batch 1; " in longest and "pairs split where needed" in longest

    plan = json.loads(ftjob("plan", job, "--model-config", config, "--max-length", "4096", "--json").stdout)
    assert plan["fits"] and plan["batch_size"] == 1
    assert (plan["pair_split"], plan["sequences_per_pass"], plan["reference_forwards"]) == (True, 1, 1)
    assert plan["pairs"] == "chosen and rejected in two micro-batches of 1 sequence each"
    speed = plan["speed"]
    assert 0 < speed["reference_seconds"] < speed["step_seconds"]
    assert 0 < speed["split_forward_seconds"] < speed["step_seconds"]
    assert plan["reference_seconds"] == speed["reference_seconds"]
