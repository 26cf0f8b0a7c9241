"""An OOM on the CPU, injected at a step (trainer_faults.OOM_AT): the pod's command exits
OutOfMemoryRetry with the step, the peak and the tighter plan; the next run resumes from the last
checkpoint on that plan and trains the adapter an uninterrupted run trains; a second OOM is
final, OutOfMemory, with the plan and the peak. (Through the operator: tests/operator/test_e2e_oom.py.)"""

import json
import shutil
from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from finetune_plan.tighter import Savers
from tests.support.faults import faults_env
from tests.support.training import ADAPTER_TOLERANCE, max_difference

from .conftest import JobDir, make_job_dir

pytestmark = pytest.mark.trainer

# No LoRA dropout and no checkpointing, batch 2: the notch turns on the loss chunks and
# checkpointing, and splits the micro-batch to 1 x 4, all without changing the math.
SPEC = {
    "lora": {"dropout": 0.0},
    "training": {"maxSteps": 8, "batchSize": 2, "gradientAccumulation": 2, "gradientCheckpointing": False},
    "checkpoints": {"everySteps": 3, "keep": 2},
}


def _job_dirs(tmp_path: Path, tiny_assets: Path, names: tuple[str, ...], spec: dict) -> dict[str, JobDir]:
    """One job folder per name, each with `spec`'s changes."""
    jobs = {}
    for name in names:
        (tmp_path / name).mkdir()
        jobs[name] = make_job_dir(tmp_path / name, tiny_assets)
        jobs[name].spec_changes = spec
    return jobs


def adapter(job: JobDir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(job.output / "adapter" / "adapter_model.safetensors"))


def test_the_first_oom_retries_once_on_a_tighter_plan_to_the_uninterrupted_adapter_and_a_second_fails(
    tmp_path: Path, tiny_assets: Path
) -> None:
    jobs = _job_dirs(tmp_path, tiny_assets, ("steady", "oom"), SPEC)
    assert jobs["steady"].run().code == 0

    first = jobs["oom"].run(env=faults_env(FINETUNE_TEST_OOM_AT="5"))
    assert first.code == ExitReason.OutOfMemoryRetry, first.stderr[-3000:]
    assert first.termination.startswith("OutOfMemoryRetry: OutOfMemory at step 5 (peak "), first.termination
    assert "of host memory" in first.termination
    assert "retrying once with a tighter plan: loss chunks 512, micro-batch 1 x 4" in first.termination
    assert "gradient checkpointing on" in first.termination
    # Where a job that runs out again starts its retry: this first run's folder, copied (its own
    # first run would be this one again: OOM_AGAIN_AT acts on the tighter plan only).
    shutil.copytree(jobs["oom"].root, tmp_path / "twice", symlinks=True)
    twice = JobDir(tmp_path / "twice", SPEC)
    second = jobs["oom"].run(env=faults_env(FINETUNE_TEST_OOM_AT="5"))
    assert second.code == 0, second.stderr[-3000:]
    assert second.of("start")[0]["resumeFrom"]["step"] == 3
    summary = json.loads((jobs["oom"].output / "summary.json").read_text())
    assert summary["finalStep"] == 8
    assert summary["oomRetry"].startswith("loss chunks 512, micro-batch 1 x 4")
    assert max_difference(adapter(jobs["oom"]), adapter(jobs["steady"])) <= ADAPTER_TOLERANCE

    final = twice.run(env=faults_env(FINETUNE_TEST_OOM_AT="5", FINETUNE_TEST_OOM_AGAIN_AT="7"))
    assert final.code == ExitReason.OutOfMemory, final.stderr[-3000:]
    assert final.termination.startswith("OutOfMemory: at step 7 (peak "), final.termination
    assert "again on the retry's tighter plan (loss chunks 512, micro-batch 1 x 4" in final.termination
    assert "\n" not in final.termination


def test_two_processes_take_the_retry_the_launcher_hands_down(tmp_path: Path, tiny_assets: Path) -> None:
    """The launcher decides the retry once and every rank trains its micro-batch (rank 0 ran out)."""
    two = {**SPEC, "resources": {"gpus": 0, "cpu": "2", "processes": 2}}
    jobs = _job_dirs(tmp_path, tiny_assets, ("steady", "oom"), two)
    assert jobs["steady"].run().code == 0
    first = jobs["oom"].run(env=faults_env(FINETUNE_TEST_OOM_AT="5"))
    assert first.code == ExitReason.OutOfMemoryRetry, first.stderr[-3000:]
    assert first.termination.startswith("OutOfMemoryRetry: OutOfMemory on rank 0 at step 5 (peak "), first.termination
    second = jobs["oom"].run(env=faults_env(FINETUNE_TEST_OOM_AT="5"))
    assert second.code == 0, second.stderr[-3000:]
    summary = json.loads((jobs["oom"].output / "summary.json").read_text())
    assert (summary["worldSize"], summary["resumedFrom"]["step"]) == (2, 3)
    assert summary["oomRetry"].startswith("loss chunks 512, micro-batch 1 x 4")
    assert max_difference(adapter(jobs["oom"]), adapter(jobs["steady"])) <= ADAPTER_TOLERANCE


def test_the_record_spends_the_retry_once_and_only_for_the_settings_it_tightened(job_dir: JobDir) -> None:
    from finetune_plan.tighter import savers_of
    from finetune_trainer.launch.entry import load_config
    from finetune_trainer.memory.oom_retry import RECORD, recorded, settle

    job_dir.spec_changes = SPEC
    config = load_config(str(job_dir.config_path()))
    ran = savers_of(config.spec, 0)
    where = "at step 5 (peak 1.00 GiB of host memory; no GPU plan on the CPU): CUDA out of memory"
    first = settle(config, ran, retried=False, message=where)
    assert (first.reason, recorded(config)) == (ExitReason.OutOfMemoryRetry, Savers(512, True, 1, 4, 1))
    assert settle(config, ran, retried=False, message=where).reason == ExitReason.OutOfMemory
    # The same output folder under other settings (a job made again): the record is not its own.
    job_dir.spec_changes = {**SPEC, "training": {**SPEC["training"], "batchSize": 4}}
    other = load_config(str(job_dir.config_path()))
    assert recorded(other) is None
    assert settle(other, savers_of(other.spec, 0), retried=False, message=where).reason == ExitReason.OutOfMemoryRetry
    # An unreadable record spends the retry: an OOM cannot loop on it.
    (job_dir.output / RECORD).write_text("{")
    assert recorded(other) is None
    assert settle(other, savers_of(other.spec, 0), retried=False, message=where).reason == ExitReason.OutOfMemory
