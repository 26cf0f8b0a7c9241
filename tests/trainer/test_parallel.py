"""The pod's trainer with more than one process (gloo on the CPU): the same math as one process,
checkpoints that resume after a rank is killed and on another process count, and the failing
rank's reason as the pod's.

Tolerance, stated once: ADAPTER_TOLERANCE is the largest absolute difference allowed between
two adapters that must be equal. 2 processes x gradient accumulation k and 1 process x 2k run
the same micro-batches with the same dropout seeds; only the order of the gradient sums
differs (a two-way all-reduce against a local accumulation), so they agree to float32 rounding.
Measured on this recipe: 0.0 (the sums happen to round alike), so 1e-5 leaves room for other
CPUs without hiding a wrong sample or a missing micro-batch (those move weights by 1e-3 or more).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from finetune_api.reasons import ExitReason

from .conftest import JobDir, Run, make_job_dir

pytestmark = pytest.mark.trainer

ADAPTER_TOLERANCE = 1e-5
STEPS = 12
# Two processes each run one micro-batch of 2 samples per step; one process runs both.
TWO = {
    "training": {"maxSteps": STEPS, "batchSize": 2, "gradientAccumulation": 1, "parallelism": "dataParallel"},
    "checkpoints": {"everySteps": 4, "keep": 2},
    "resources": {"gpus": 0, "cpu": "2", "processes": 2},
}
ONE = {
    "training": {"maxSteps": STEPS, "batchSize": 2, "gradientAccumulation": 2, "parallelism": "dataParallel"},
    "checkpoints": {"everySteps": 4, "keep": 2},
    "resources": {"gpus": 0, "cpu": "2", "processes": 1},
}


def with_changes(base: dict, **sections: dict) -> dict:
    out = {key: dict(value) for key, value in base.items()}
    for key, value in sections.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def adapter(job: JobDir) -> dict:
    return load_file(str(job.output / "adapter" / "adapter_model.safetensors"))


def max_difference(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b), "the adapters hold different tensors"
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def summary(job: JobDir) -> dict:
    return json.loads((job.output / "summary.json").read_text())


def run_job(root: Path, tiny_assets: Path, spec: dict, env: dict[str, str] | None = None) -> tuple[JobDir, Run]:
    job = make_job_dir(root, tiny_assets)
    job.spec_changes = spec
    return job, job.run(env=env)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """The uninterrupted 2-process dataParallel run every other run here is compared with."""
    return run_job(tmp_path_factory.mktemp("two"), tiny_assets, TWO)


def test_two_processes_train_the_adapter_of_one_with_twice_the_accumulation(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, run = two_process_run
    assert run.code == 0, run.stderr[-3000:]
    assert summary(two)["parallelism"] == "dataParallel"
    assert summary(two)["worldSize"] == 2
    assert summary(two)["ranksInStep"] is True
    assert len(run.of("start")) == 1, "only rank 0 reports"
    assert len(run.of("progress")) == STEPS
    one, single = run_job(tmp_path, tiny_assets, ONE)
    assert single.code == 0, single.stderr[-3000:]
    assert summary(one)["worldSize"] == 1
    assert max_difference(adapter(two), adapter(one)) <= ADAPTER_TOLERANCE
    assert single.losses == pytest.approx(run.losses, abs=1e-4)


def test_ftjob_plan_names_the_launch_the_trainer_ran(two_process_run: tuple[JobDir, Run]) -> None:
    two, _ = two_process_run
    plan = subprocess.run(
        [sys.executable, "-m", "finetune_cli", "plan", str(two.manifest()), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    ran = summary(two)
    assert (planned["parallelism"], planned["processes"]) == (ran["parallelism"], ran["worldSize"])


def test_fsdp_on_two_processes_trains_the_same_adapter(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, run = run_job(tmp_path, tiny_assets, with_changes(TWO, training={"parallelism": "fsdp"}))
    assert run.code == 0, run.stderr[-3000:]
    assert summary(job)["parallelism"] == "fsdp"
    guard = summary(job)["precisionGuard"]
    assert guard["halfParameters"] == guard["halfBuffers"] == guard["halfActivations"] == 0
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE
    # PEFT's own layout: the folder loads as an adapter anywhere.
    config = json.loads((job.output / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"


def test_a_killed_rank_fails_the_pod_retryably_and_the_next_attempt_ends_alike(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, killed = run_job(tmp_path, tiny_assets, TWO, env={"FINETUNE_TEST_KILL_RANK_AT": "1@6"})
    assert killed.code == ExitReason.TrainerError, killed.stderr[-3000:]
    assert killed.termination.startswith("TrainerError: rank 1 was killed by SIGKILL")
    assert "Traceback" not in killed.termination
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 4
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE


def test_a_rank_that_exits_unfinished_fails_the_pod_retryably_in_its_name(tmp_path: Path, tiny_assets: Path) -> None:
    """What the launcher sees of a rank whose exit status was lost: an exit 0 mid-run. The pod
    must neither hang on the other rank nor call the run a success."""
    _, run = run_job(tmp_path, tiny_assets, TWO, env={"FINETUNE_TEST_EXIT_RANK_AT": "1@6"})
    assert run.code == ExitReason.TrainerError, run.stderr[-3000:]
    assert run.termination.startswith("TrainerError: rank 1 "), run.termination
    assert "the job resumes from its last checkpoint" in run.termination
    assert len(run.of("failed")) == 1


def test_a_checkpoint_of_two_processes_resumes_in_one(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, killed = run_job(tmp_path, tiny_assets, TWO, env={"FINETUNE_TEST_KILL_RANK_AT": "0@6"})
    assert killed.code == ExitReason.TrainerError
    # The same global batch on one process: accumulation doubles as the process count halves.
    job.spec_changes = ONE
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 4
    assert resumed.of("start")[0]["worldSize"] == 1
    assert summary(job)["finalStep"] == STEPS
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE


def test_a_non_finite_loss_on_one_rank_stops_every_rank_with_its_reason(tmp_path: Path, tiny_assets: Path) -> None:
    _, run = run_job(tmp_path, tiny_assets, TWO, env={"FINETUNE_TEST_NONFINITE_AT": "6@1"})
    assert run.code == ExitReason.NonFiniteLoss, run.stderr[-3000:]
    assert run.termination.startswith("NonFiniteLoss: rank ")
    assert "loss is nan at step 6" in run.termination
    assert "last good checkpoint: step 4" in run.termination
    assert max(run.losses) == 5
    assert "Traceback" not in run.termination
    assert len(run.of("failed")) == 1  # the launcher speaks for the pod, once


def test_packing_eval_and_the_merged_export_are_the_same_on_two_processes(tmp_path: Path, tiny_assets: Path) -> None:
    extras = {"dataset": {"evalFraction": 0.1}, "output": {"merge": True}}
    packed = {"packing": True, "maxLength": 128}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, single = run_job(tmp_path / "one", tiny_assets, with_changes(ONE, training=packed, **extras))
    two, split = run_job(
        tmp_path / "two", tiny_assets, with_changes(TWO, training={**packed, "parallelism": "fsdp"}, **extras)
    )
    assert single.code == 0, single.stderr[-3000:]
    assert split.code == 0, split.stderr[-3000:]
    assert summary(two)["data"] == summary(one)["data"]
    assert summary(two)["evalLoss"] == pytest.approx(summary(one)["evalLoss"], abs=1e-4)
    assert [e["step"] for e in split.of("eval")] == [e["step"] for e in single.of("eval")] == [4, 8, 12]
    assert max_difference(adapter(two), adapter(one)) <= ADAPTER_TOLERANCE
    merged = load_file(str(two.output / "merged" / "model.safetensors"))
    reference = load_file(str(one.output / "merged" / "model.safetensors"))
    assert max_difference(merged, reference) <= ADAPTER_TOLERANCE


# --- SIGTERM: a checkpoint of the exact point reached, on any process count -----------------

# Two micro-batches of one sample per rank and step: a stop can fall between them.
TWO_ACCUMULATING = with_changes(TWO, training={"batchSize": 1, "gradientAccumulation": 2})


def losses_equal(a: Run, b: Run) -> bool:
    """Every step `a` logged has the loss `b` logged for it."""
    return all(abs(a.losses[step] - b.losses[step]) <= 1e-5 for step in a.losses)


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-processes"])
def test_sigterm_mid_accumulation_saves_the_point_reached_and_the_resumed_run_loses_no_micro_batch(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path, processes: int
) -> None:
    if processes == 1:
        spec = ONE  # trains the adapter of two_process_run (the first test here)
        two, uninterrupted = two_process_run
    else:
        spec = TWO_ACCUMULATING  # micro-batches of one sample: its own uninterrupted run
        (tmp_path / "uninterrupted").mkdir()
        two, uninterrupted = run_job(tmp_path / "uninterrupted", tiny_assets, spec)
        assert uninterrupted.code == 0, uninterrupted.stderr[-3000:]
    (tmp_path / "stopped").mkdir()
    job, stopped = run_job(tmp_path / "stopped", tiny_assets, spec, env={"FINETUNE_TEST_SIGTERM_AT": "6.1"})
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert stopped.termination.startswith("Interrupted: "), stopped.termination
    assert (
        "stopped by SIGTERM after 1 of 2 micro-batches of step 6; checkpoint-5-micro-1 written" in stopped.termination
    )
    [event] = stopped.of("stopped")
    assert (event["checkpoint"], event["microBatchesDone"]) == ("checkpoint-5-micro-1", 1)
    assert len(stopped.of("failed")) == 1
    assert (job.checkpoints / "checkpoint-5-micro-1" / "partial_step.pt").is_file()
    assert (job.checkpoints / "checkpoint-4").is_dir()  # the step checkpoint before it is kept

    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    start = resumed.of("start")[0]
    assert start["resumeFrom"]["step"] == 5 and start["resumeFrom"]["microBatchesDone"] == 1
    assert start["worldSize"] == processes
    assert sorted(resumed.losses) == list(range(6, STEPS + 1))  # step 6 is finished, not redone
    assert losses_equal(resumed, uninterrupted)
    assert summary(job)["finalStep"] == STEPS
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE


def test_a_stop_inside_a_step_resumes_on_another_process_count_by_running_that_step_again(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, stopped = run_job(tmp_path, tiny_assets, ONE, env={"FINETUNE_TEST_SIGTERM_AT": "6.1"})
    assert stopped.code == ExitReason.Interrupted
    job.spec_changes = TWO
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert "runs again from its start" in resumed.stderr
    assert summary(job)["finalStep"] == STEPS
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE


def test_sigterm_twice_during_a_checkpoint_write_leaves_that_checkpoint_whole(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, stopped = run_job(tmp_path, tiny_assets, TWO, env={"FINETUNE_TEST_SIGTERM_IN_SAVE": "8"})
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 8; checkpoint-8 written" in stopped.termination, stopped.termination
    assert "CHECKPOINT_COMPLETE.json" in {p.name for p in (job.checkpoints / "checkpoint-8").iterdir()}
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 8
    assert max_difference(adapter(job), adapter(two)) <= ADAPTER_TOLERANCE
