"""`python -m finetune_trainer --check-inputs`: the pre-flight Job's command, run as in its pod.

Good inputs pass in one process that never trains; each kind of bad input ends with the exit
code and `Reason: message` the GPU pod would have given, before anything is loaded onto a GPU."""

import json
import subprocess
import sys

import pytest

from finetune_api.contract import CHECK_INPUTS_FLAG
from finetune_api.reasons import ExitReason
from tests.trainer.conftest import JobDir

# Each check runs the trainer in a subprocess, which loads the tokenizer (transformers, torch).
pytestmark = pytest.mark.trainer


def check(job: JobDir) -> tuple[int, str, list[dict[str, object]]]:
    termination = job.root / "termination-log"
    command = [sys.executable, "-m", "finetune_trainer", "--config", str(job.config_path()), CHECK_INPUTS_FLAG]
    done = subprocess.run(
        [*command, "--termination-log", str(termination)], capture_output=True, text=True, timeout=300, check=False
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    said = termination.read_text(encoding="utf-8") if termination.exists() else ""
    return done.returncode, said, events


def test_good_inputs_pass_and_nothing_is_trained(job_dir: JobDir) -> None:
    code, said, events = check(job_dir)
    assert code == 0 and said == "", said
    (checked,) = [e for e in events if e["event"] == "inputsChecked"]
    assert checked["family"] == "Llama" and int(str(checked["samples"])) > 0
    assert not [e for e in events if e["event"] == "progress"]
    assert not (job_dir.output / "checkpoints").exists()


@pytest.mark.parametrize(
    ("changes", "reason", "text"),
    [
        (
            {"dataset": {"source": {"pvc": {"claimName": "datasets", "path": "support/train.json"}}}},
            ExitReason.InvalidData,
            "spec.dataset: {root}/datasets/support/train.json: no such file or folder",
        ),
        (
            {"model": {"source": {"pvc": {"claimName": "models", "path": "llama"}}}},
            ExitReason.InvalidConfig,
            "spec.model.source.pvc: {root}/models/llama: no such folder",
        ),
        (
            {"model": {"source": {"pvc": {"claimName": "datasets", "path": ""}}}},
            ExitReason.InvalidConfig,
            "spec.model.source.pvc: {root}/datasets is not a model folder (no config.json there)",
        ),
    ],
    ids=["dataset-path", "model-path", "no-model-config"],
)
def test_a_bad_input_ends_with_the_reason_the_gpu_pod_would_give(
    job_dir: JobDir, changes: dict[str, object], reason: ExitReason, text: str
) -> None:
    job_dir.spec_changes = changes
    code, said, _ = check(job_dir)
    assert code == reason
    assert said == f"{reason.name}: {text.format(root=job_dir.root)}"


def test_a_bad_record_is_found_as_check_data_finds_it(job_dir: JobDir) -> None:
    bad = job_dir.root / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"instruction": "hi", "output": "hello"}\n{"instruction": 3}\n', "utf-8")
    (job_dir.root / "datasets-bad").symlink_to(bad)
    job_dir.spec_changes = {"dataset": {"source": {"pvc": {"claimName": "datasets-bad", "path": "train.jsonl"}}}}
    code, said, _ = check(job_dir)
    assert code == ExitReason.InvalidData
    assert said.startswith("InvalidData: 2 problem(s) in "), said
    assert "train.jsonl: line 2: instruction: expected a string, got int; line 2: output: missing field" in said
