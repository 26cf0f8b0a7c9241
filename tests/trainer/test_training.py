"""The real trainer on a tiny Llama, end to end on the CPU: learning, crashes, resume, stops.

Tolerances, stated once:
- LOSS_FALL: the mean loss of the last 5 steps is at least this far below the first step's.
- RESUME_TOLERANCE: per step, a resumed run's loss equals the uninterrupted run's within this
  absolute difference (same seed; the CPU run is deterministic, so in practice they are equal).
"""

import json
import signal
from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from tests.support.faults import faults_env

from .conftest import JobDir, Run

pytestmark = pytest.mark.trainer

LOSS_FALL = 2.0
RESUME_TOLERANCE = 1e-4
FINAL_STEP = 30


def complete_checkpoints(job: JobDir) -> list[int]:
    return sorted(
        int(p.name.split("-")[1])
        for p in job.checkpoints.glob("checkpoint-*")
        if (p / "CHECKPOINT_COMPLETE.json").is_file()
    )


def assert_same_curve(resumed: Run, reference: Run, from_step: int) -> None:
    expected = {s: v for s, v in reference.losses.items() if s > from_step}
    got = {s: v for s, v in resumed.losses.items() if s > from_step}
    assert sorted(got) == sorted(expected), "the resumed run logged different steps"
    worst = max(abs(got[s] - expected[s]) for s in expected)
    assert worst <= RESUME_TOLERANCE, f"loss curve differs by {worst} after resume"


def test_tiny_llama_learns_through_the_full_recipe(reference_run: tuple[JobDir, Run]) -> None:
    job, run = reference_run
    assert run.code == 0, run.stderr[-3000:]
    losses = [run.losses[s] for s in sorted(run.losses)]
    assert len(losses) == FINAL_STEP
    assert losses[0] - sum(losses[-5:]) / 5 >= LOSS_FALL, losses
    assert (job.output / "adapter" / "adapter_model.safetensors").is_file()
    summary = json.loads((job.output / "summary.json").read_text())
    guard = summary["precisionGuard"]
    assert guard["halfParameters"] == guard["halfBuffers"] == guard["halfActivations"] == 0
    assert guard["checkedActivations"] > 0
    assert summary["finalStep"] == FINAL_STEP
    assert summary["precision"] == "fp32"
    # keep: 2 complete checkpoints, nothing half-written left behind
    assert complete_checkpoints(job) == [20, 30]
    folders = sorted(p.name for p in job.checkpoints.iterdir() if p.is_dir())
    assert folders == ["checkpoint-20", "checkpoint-30"]  # no staging or unmarked folder left
    assert list((job.output / "tensorboard").rglob("events.out.tfevents.*"))
    start = run.of("start")[0]
    assert start["resumeFrom"] is None
    progress = run.of("progress")[-1]
    assert set(progress) >= {"step", "totalSteps", "epoch", "loss", "lr", "tokensPerSecond", "etaSeconds"}
    # Alpaca trains on the answers: fewer targets than tokens, the same counts in the summary.
    assert (progress["tokens"], progress["trainedTokens"]) == (summary["tokens"], summary["trainedTokens"])
    assert 0 < summary["trainedTokens"] < summary["tokens"]
    # output.samples: greedy answers with the adapter and without, beside the adapter.
    rows = [json.loads(line) for line in (job.output / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and summary["samplesPath"] == str(job.output / "samples.jsonl")
    assert all(set(row) == {"prompt", "answer", "baseAnswer"} and row["prompt"] for row in rows)
    assert any(row["answer"] != row["baseAnswer"] for row in rows), rows
    # The adapter names its base: no name anywhere here, so the folder it was loaded from.
    config = json.loads((job.output / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"].endswith("tiny-llama")


def test_unreachable_api_server_never_stops_training(reference_run: tuple[JobDir, Run]) -> None:
    # the reference run patches status against a port where nothing listens
    job, run = reference_run
    assert run.code == 0
    summary = json.loads((job.output / "summary.json").read_text())
    assert summary["statusPatches"]["sent"] == 0
    assert summary["statusPatches"]["failed"] >= 3  # each checkpoint tried, each failure logged
    assert "status patch failed (training goes on)" in run.stderr


def test_sigkill_mid_training_resumes_from_last_complete_checkpoint(
    job_dir: JobDir, reference_run: tuple[JobDir, Run]
) -> None:
    killed = job_dir.run(kill_when=lambda e: e.get("event") == "progress" and e["step"] >= 14)
    assert killed.code == -signal.SIGKILL
    assert complete_checkpoints(job_dir) == [10]

    resumed = job_dir.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 10
    assert max(resumed.losses) == FINAL_STEP
    assert_same_curve(resumed, reference_run[1], from_step=10)
    # The counts carry over the resume: the checkpoint holds them.
    last, reference = resumed.of("progress")[-1], reference_run[1].of("progress")[-1]
    assert (last["tokens"], last["trainedTokens"]) == (reference["tokens"], reference["trainedTokens"])


def test_sigkill_inside_a_checkpoint_write_is_ignored_on_resume(
    job_dir: JobDir, reference_run: tuple[JobDir, Run]
) -> None:
    torn = job_dir.run(env=faults_env(FINETUNE_TEST_KILL_IN_SAVE="20"))
    assert torn.code == -signal.SIGKILL
    # the write of step 20 got as far as its files, not its completion marker
    staging = job_dir.checkpoints / ".staging-20" / "checkpoint-20"
    assert (staging / "adapter_model.safetensors").is_file()
    assert not (staging / "CHECKPOINT_COMPLETE.json").exists()
    assert complete_checkpoints(job_dir) == [10]

    resumed = job_dir.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 10
    assert any("staging-20" in e["name"] for e in resumed.of("checkpointDiscarded"))
    assert not (job_dir.checkpoints / ".staging-20").exists()
    assert max(resumed.losses) == FINAL_STEP
    assert_same_curve(resumed, reference_run[1], from_step=10)


def test_killed_after_the_final_checkpoint_resumes_without_an_extra_step(job_dir: JobDir) -> None:
    # 6 steps is not a whole number of epochs (64 batches), the case where Hugging Face's loop
    # used to run step 7 after resuming at step 6.
    job_dir.spec_changes = {"training": {"maxSteps": 6}, "checkpoints": {"everySteps": 3, "keep": 2}}
    killed = job_dir.run(kill_when=lambda e: e.get("event") == "checkpoint" and e["step"] == 6)
    assert killed.code == -signal.SIGKILL
    resumed = job_dir.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 6
    assert not resumed.of("progress"), "no step may run after the final checkpoint"
    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert summary["finalStep"] == 6
    assert (job_dir.output / "adapter" / "adapter_model.safetensors").is_file()


def test_non_finite_loss_stops_with_reason_and_keeps_the_last_good_checkpoint(job_dir: JobDir) -> None:
    run = job_dir.run(env=faults_env(FINETUNE_TEST_NONFINITE_AT="15"))
    assert run.code == ExitReason.NonFiniteLoss
    assert run.termination.startswith("NonFiniteLoss: loss is nan at step 15")
    assert "checkpoint-10" in run.termination
    assert complete_checkpoints(job_dir) == [10]
    assert max(run.losses) == 14
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("kind", ["activation", "parameter"])
def test_precision_guard_catches_a_planted_bf16_tensor(job_dir: JobDir, kind: str) -> None:
    run = job_dir.run(env=faults_env(FINETUNE_TEST_PLANT_HALF=kind))
    assert run.code == ExitReason.PrecisionViolation, run.stderr[-3000:]
    assert run.termination.startswith("PrecisionViolation:")
    expected = "self_attn.o_proj (torch.bfloat16)" if kind == "activation" else "lora_A.default.weight (torch.bfloat16)"
    assert expected in run.termination
    assert not run.of("progress"), "the guard must stop the run before the first step completes"
    assert complete_checkpoints(job_dir) == []


def test_bad_data_fails_before_training_with_line_and_field(job_dir: JobDir, tmp_path: Path) -> None:
    bad = tmp_path / "bad-data"
    bad.mkdir()
    (bad / "alpaca.jsonl").write_text(
        '{"instruction": "Say hi.", "output": "hi"}\n'
        '{"instruction": "Say hi.", "output": ""}\n'
        '{"instruction": "Say hi."}\n',
        encoding="utf-8",
    )
    job_dir.spec_changes = {"dataset": {"source": {"pvc": {"claimName": "bad-data", "path": "alpaca.jsonl"}}}}
    run = job_dir.run()
    assert run.code == ExitReason.InvalidData
    assert "line 2: output: empty text" in run.termination
    assert "line 3: output: missing field" in run.termination
    assert not run.of("progress")
    assert not job_dir.checkpoints.exists()
    assert "Traceback" not in run.stderr
