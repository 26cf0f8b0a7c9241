"""`ftjob run`: claims map to DIR/<claimName>/ exactly as the pod mounts them, and mistakes are one line."""

import subprocess
import sys
from pathlib import Path

from finetune_api.resource import FineTuneJob
from finetune_cli.run_local import local_paths

from .conftest import BASE_JOB


def spec_with(output: dict[str, object]) -> FineTuneJob:
    body = {**BASE_JOB, "spec": {**BASE_JOB["spec"], "output": output}}
    return FineTuneJob.model_validate(body)


def test_claims_become_folders_of_the_workdir(tmp_path: Path) -> None:
    job = spec_with({"pvc": {"claimName": "outputs", "path": "runs/a"}})
    paths = local_paths("tiny", job.spec, tmp_path)
    assert paths.model == str(tmp_path / "models" / "tiny-llama")
    assert paths.dataset == str(tmp_path / "datasets" / "alpaca.jsonl")
    assert paths.output == str(tmp_path / "outputs" / "runs" / "a")
    assert paths.cache is None


def test_output_defaults_to_the_job_name_and_storage_to_the_operators_claim(tmp_path: Path) -> None:
    assert local_paths("tiny", spec_with({"pvc": {"claimName": "outputs"}}).spec, tmp_path).output == str(
        tmp_path / "outputs" / "tiny"
    )
    storage = spec_with({"storage": {"size": "1Gi"}})
    assert local_paths("tiny", storage.spec, tmp_path).output == str(tmp_path / "tiny-output" / "tiny")


def test_invalid_manifest_is_one_line_per_problem(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nmetadata: {name: x}\nspec: {lora: {rank: 8}}\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "finetune_cli", "run", str(manifest), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "spec.lora.rank: unknown field (did you mean 'r'?)" in result.stderr
    assert "Traceback" not in result.stderr
