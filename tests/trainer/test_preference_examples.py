"""The tiny preference examples run as their comments say (`ftjob make-tiny-model --preference`,
`ftjob check-data`, `ftjob run`), on the CPU, and learn the pairs' rule: the share of pairs whose
chosen answer the adapter prefers rises from a coin's toss."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import REPO

pytestmark = pytest.mark.trainer


def ftjob(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_cli", *args], capture_output=True, text=True, timeout=900, cwd=cwd, check=False
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("preference-examples")
    made = ftjob("make-tiny-model", "models/tiny-llama", "--preference", "datasets/tiny/preference.jsonl", cwd=root)
    assert made.returncode == 0, made.stderr[-3000:]
    return root


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_example(workdir: Path, name: str) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    example = REPO / "examples" / f"{name}.yaml"
    spec = yaml.safe_load(example.read_text())["spec"]
    done = ftjob("run", str(example), "--workdir", str(workdir), cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event":"progress"')]
    summary = json.loads((workdir / "outputs" / name / "summary.json").read_text())
    return lines, summary, spec


def test_the_data_of_the_examples_checks_clean(workdir: Path) -> None:
    checked = ftjob(
        "check-data", "--format", "preference", "--tokenizer", "models/tiny-llama", "--max-length", "128",
        "datasets/tiny/preference.jsonl", cwd=workdir,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ": 256 pairs OK (preference): " in checked.stdout


def test_dpo_tiny_learns_the_pairs_rule(workdir: Path) -> None:
    lines, summary, spec = run_example(workdir, "dpo-tiny")
    training = spec["training"]
    assert len(lines) == training["maxSteps"]
    accuracy = [line["rewardAccuracy"] for line in lines]
    assert mean(accuracy[:10]) < 0.75 and mean(accuracy[-10:]) > 0.85, accuracy
    assert mean([line["rewardMargin"] for line in lines[-10:]]) > 0.5
    assert summary["pairs"] == training["maxSteps"] * training["batchSize"]
    assert summary["finalMetrics"]["rewardAccuracy"] == accuracy[-1]


def test_orpo_tiny_learns_the_answers_and_the_pairs_rule(workdir: Path) -> None:
    lines, summary, spec = run_example(workdir, "orpo-tiny")
    assert len(lines) == spec["training"]["maxSteps"]
    accuracy = [line["rewardAccuracy"] for line in lines]
    assert mean(accuracy[-10:]) > mean(accuracy[:10]) + 0.15, accuracy
    # Its SFT half: the chosen sequences' cross-entropy falls to a fraction of the random model's.
    assert lines[-1]["nllLoss"] < lines[0]["nllLoss"] / 2
    assert summary["pairs"] == spec["training"]["maxSteps"] * spec["training"]["batchSize"]
