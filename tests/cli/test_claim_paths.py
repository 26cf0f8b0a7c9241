"""`ftjob validate --volumes` and `ftjob plan --volumes` check the model and dataset paths on their
claims as the operator's input check does, naming the claim and the path in it."""

import json
from pathlib import Path

import pytest
import yaml

from tests.support.api_cases import tiny_with
from tests.support.cli import REPO, assert_one_line_error, ftjob

EXAMPLE_TINY = str(REPO / "examples" / "tiny-job.yaml")  # models:tiny-llama, datasets:tiny/alpaca.jsonl


@pytest.fixture
def volumes(tmp_path: Path) -> Path:
    root = tmp_path / "volumes"
    model = root / "models" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    data = root / "datasets" / "tiny" / "alpaca.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"instruction": "hi", "output": "hello"}\n')
    return root


def test_paths_that_are_there_pass_both_commands(volumes: Path) -> None:
    validated = ftjob("validate", EXAMPLE_TINY, "--volumes", str(volumes))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert validated.stdout.strip() == f"{EXAMPLE_TINY}: valid"
    planned = ftjob("plan", EXAMPLE_TINY, "--volumes", str(volumes))
    assert planned.returncode == 0, planned.stderr


def test_a_wrong_dataset_path_names_the_claim_and_the_path(volumes: Path) -> None:
    (volumes / "datasets" / "tiny" / "alpaca.jsonl").unlink()
    said = "spec.dataset: claim 'datasets', path 'tiny/alpaca.jsonl': no such file or folder"
    validated = assert_one_line_error(ftjob("validate", EXAMPLE_TINY, "--volumes", str(volumes)), on_stdout=True)
    assert validated == f"{EXAMPLE_TINY}: {said}"
    assert_one_line_error(ftjob("plan", EXAMPLE_TINY, "--volumes", str(volumes)), said)


def test_a_model_folder_without_its_config_or_a_missing_claim_is_named(volumes: Path) -> None:
    (volumes / "models" / "tiny-llama" / "config.json").unlink()
    assert_one_line_error(
        ftjob("validate", EXAMPLE_TINY, "--volumes", str(volumes)),
        "spec.model.source.pvc: claim 'models', path 'tiny-llama' is not a model folder (no config.json there)",
        on_stdout=True,
    )
    (volumes / "models" / "tiny-llama").rename(volumes / "elsewhere")
    (volumes / "models").rmdir()
    assert_one_line_error(ftjob("plan", EXAMPLE_TINY, "--volumes", str(volumes)), "claim 'models': no folder")


def test_without_volumes_validate_checks_no_paths() -> None:
    result = ftjob("validate", EXAMPLE_TINY)
    assert result.returncode == 0 and result.stdout.strip() == f"{EXAMPLE_TINY}: valid"


def test_a_missing_held_out_file_is_named_as_the_dataset_is(volumes: Path, tmp_path: Path) -> None:
    held_out = {"pvc": {"claimName": "datasets", "path": "tiny/eval.jsonl"}}
    job = tmp_path / "held-out.yaml"
    job.write_text(yaml.safe_dump(tiny_with({"dataset": {"evalFraction": None, "eval": held_out}})))
    said = "spec.dataset.eval: claim 'datasets', path 'tiny/eval.jsonl': no such file or folder"
    assert assert_one_line_error(ftjob("validate", str(job), "--volumes", str(volumes)), on_stdout=True) == (
        f"{job}: {said}"
    )
    (volumes / "datasets" / "tiny" / "eval.jsonl").write_text('{"instruction": "hi", "output": "hello"}\n')
    assert ftjob("validate", str(job), "--volumes", str(volumes)).returncode == 0
