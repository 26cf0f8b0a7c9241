"""Preference tuning (DPO, ORPO) in every mode the trainer has: the same adapter on one process
and on two (dataParallel, fsdp), a step stopped by SIGTERM part-way resumed without losing a
micro-batch, a first step the precision guard finds clean, and a rule the tiny model learns.

The runs train pairs from finetune_trainer.model.tiny_model.write_preference beside the tiny model's
alpaca.jsonl, and the comparisons are test_parallel.py's: 2 processes x accumulation k against 1
process x 2k, equal within ADAPTER_TOLERANCE (tests/support/training.py). A pair's two answers
are one forward of two sequences; DPO adds its reference forward (the model with its LoRA layers
off, no gradients) before it, so each mode here also proves that forward right when sharded:
the evaluation once gave wrong figures from a no-grad forward of the fsdp model (loop.py,
Loop.evaluate), but a reference forward is always followed by the trained forward and its
backward in the same micro-batch. Measured: every equality here 0.0 (fsdp included, with and
without gradient checkpointing, and with a rank padding past the data's end); the SIGTERM resume
on two processes 3e-8, as rank 0 alone starts the stopped step from its sums, so the ranks'
additions come in another order.
"""

import math
from pathlib import Path
from typing import Any

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.model.tiny_model import write_preference
from tests.support.faults import faults_env
from tests.support.training import assert_same_trained_adapter, max_difference

from .conftest import JobDir, Run
from .test_parallel import ONE, TWO, adapter, copy_of, losses_equal, run_job, summary, with_changes

pytestmark = pytest.mark.trainer

STEPS = 12
PAIRS = "preference.jsonl"
CHAT_PAIRS = "preference-chat.jsonl"


@pytest.fixture(scope="module")
def pair_assets(tiny_assets: Path) -> Path:
    """The tiny model's datasets folder with the synthetic pairs beside alpaca.jsonl: as strings
    and as chat messages."""
    datasets = tiny_assets / "datasets"
    if not (datasets / PAIRS).is_file():
        write_preference(datasets / PAIRS)
        write_preference(datasets / CHAT_PAIRS, chat=True)
    return tiny_assets


def preference(
    base: dict[str, Any], method: str = "dpo", path: str = PAIRS, held_out: float | None = 0.1, **training: Any
) -> dict[str, Any]:
    """`base` (a spec of test_parallel.py) training `method` on the pairs at `path`, `held_out` of
    them kept for the evaluation at each checkpoint (which runs the objective's loss too)."""
    source = {"pvc": {"claimName": "datasets", "path": path}}
    dataset = {"source": source, "format": "preference", **({"evalFraction": held_out} if held_out else {})}
    # No greedy answers: the modes' answers are held equal in test_parallel.py; here the figures.
    evaluation = {"generate": {"count": 0}}
    return with_changes(base, training={"method": method, **training}, dataset=dataset, evaluation=evaluation)


def mkdir(root: Path, name: str) -> Path:
    (root / name).mkdir()
    return root / name


def trained(job: JobDir, run: Run) -> dict:
    assert run.code == 0, run.stderr[-3000:]
    assert summary(job)["finalStep"] == STEPS
    return adapter(job)


def assert_guard_clean(job: JobDir) -> None:
    guard = summary(job)["precisionGuard"]
    assert guard["halfParameters"] == guard["halfBuffers"] == guard["halfActivations"] == 0
    assert guard["checkedActivations"] > 0


def assert_same_evaluations(run: Run, reference: Run) -> None:
    """The held-out loss at each checkpoint (steps 4, 8, 12), split over the ranks as it is."""
    assert [e["step"] for e in run.of("eval")] == [e["step"] for e in reference.of("eval")] == [4, 8, 12]
    got, expected = [e["evalLoss"] for e in run.of("eval")], [e["evalLoss"] for e in reference.of("eval")]
    assert got == pytest.approx(expected, abs=1e-4)


@pytest.fixture(scope="module")
def dpo_one_process(tmp_path_factory: pytest.TempPathFactory, pair_assets: Path) -> tuple[JobDir, Run]:
    """1 process x accumulation 2, DPO on the string pairs: what every DPO mode must train."""
    return run_job(tmp_path_factory.mktemp("dpo-one"), pair_assets, preference(ONE))


@pytest.mark.parametrize("parallelism", ["dataParallel", "fsdp"])
def test_dpo_on_two_processes_trains_the_adapter_of_one_with_twice_the_accumulation(
    dpo_one_process: tuple[JobDir, Run], tmp_path: Path, pair_assets: Path, parallelism: str
) -> None:
    one, single = dpo_one_process
    job, run = run_job(tmp_path, pair_assets, preference(TWO, parallelism=parallelism))
    expected, got = trained(one, single), trained(job, run)
    assert (summary(job)["parallelism"], summary(job)["worldSize"]) == (parallelism, 2)
    assert_guard_clean(job)
    print(f"dpo {parallelism} 2x1 against 1x2: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)
    assert run.losses == pytest.approx(single.losses, abs=1e-4)
    assert_same_evaluations(run, single)
    # The step's figures are means over every rank's pairs, as the loss is.
    for mine, theirs in zip(run.of("progress"), single.of("progress"), strict=True):
        assert mine["rewardMargin"] == pytest.approx(theirs["rewardMargin"], abs=1e-5)
        assert mine["rewardAccuracy"] == pytest.approx(theirs["rewardAccuracy"], abs=1e-6)


def test_orpo_on_chat_pairs_trains_the_same_adapter_sharded_over_two_processes(
    tmp_path: Path, pair_assets: Path
) -> None:
    """ORPO's cross-entropy term is a mean over the step's chosen tokens on every rank: fsdp 2x1
    must train what 1x2 trains."""
    one, single = run_job(mkdir(tmp_path, "one"), pair_assets, preference(ONE, "orpo", CHAT_PAIRS))
    two, split = run_job(mkdir(tmp_path, "two"), pair_assets, preference(TWO, "orpo", CHAT_PAIRS, parallelism="fsdp"))
    expected, got = trained(one, single), trained(two, split)
    print(f"orpo fsdp 2x1 against 1x2: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)
    assert split.losses == pytest.approx(single.losses, abs=1e-4)
    assert_same_evaluations(split, single)
    assert_guard_clean(two)
    assert_guard_clean(one)


# --- the precision guard and a rule learnt -----------------------------------------------------


def test_dpo_on_one_process_trains_with_a_clean_precision_guard(dpo_one_process: tuple[JobDir, Run]) -> None:
    """The first step's guard watches DPO's reference forward (adapters off) and the trained one."""
    job, run = dpo_one_process
    trained(job, run)
    assert_guard_clean(job)
    first = run.of("progress")[0]
    # Before any update the policy is its reference: every reward is 0 and the loss is log 2.
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["rewardChosen"] == first["rewardRejected"] == first["rewardMargin"] == 0.0


# The reward accuracy of a step is read on its own pairs before its update, so its first steps
# are near chance and its last ones show the rule learnt. Measured on this recipe (training.seed
# 42, 1, 2, 3): steps 2 to 11 averaged 0.55 to 0.60, steps 91 to 100 0.94 to 0.99. Step 1 is left
# out: its policy is its reference, a tie on every pair, and a tie counts as wrong (TRL's rule).
# The learning rate matters: at 1e-2 the accuracy stayed near 0.55 for 200 steps.
LEARNING = {
    "maxSteps": 100,
    "batchSize": 8,
    "gradientAccumulation": 1,
    "learningRate": 5e-3,
    "warmupRatio": 0.0,
}
EARLY = range(2, 12)
LATE = range(91, 101)


def test_dpo_learns_the_synthetic_rule_reward_accuracy_rises_from_chance(tmp_path: Path, pair_assets: Path) -> None:
    spec = preference({"checkpoints": {"everySteps": 100, "keep": 2}}, held_out=None, **LEARNING)
    _, run = run_job(tmp_path, pair_assets, spec)
    assert run.code == 0, run.stderr[-3000:]
    accuracy = {e["step"]: e["rewardAccuracy"] for e in run.of("progress")}
    assert sorted(accuracy) == list(range(1, 101))
    early = sum(accuracy[s] for s in EARLY) / len(EARLY)
    late = sum(accuracy[s] for s in LATE) / len(LATE)
    print(f"dpo reward accuracy: steps 2-11 {early:.3f}, steps 91-100 {late:.3f}; every step {accuracy}")
    assert 0.3 <= early <= 0.7, early
    assert late > 0.9, late
    margin = {e["step"]: e["rewardMargin"] for e in run.of("progress")}
    assert sum(margin[s] for s in LATE) / len(LATE) > sum(margin[s] for s in EARLY) / len(EARLY) + 0.1, margin


# --- SIGTERM inside a step: the point reached, resumed without a lost micro-batch -------------

FIGURES = ("rewardChosen", "rewardRejected", "rewardAccuracy", "rewardMargin", "logpChosen", "logpRejected")


def assert_same_figures(resumed: Run, uninterrupted: Run) -> None:
    """Every step `resumed` logged has the uninterrupted run's loss and figures: the stopped
    step's figures were kept in its checkpoint (Partial.sums), not restarted from its resume."""
    assert losses_equal(resumed, uninterrupted)
    theirs = {e["step"]: e for e in uninterrupted.of("progress")}
    for event in resumed.of("progress"):
        for name in FIGURES:
            assert event[name] == pytest.approx(theirs[event["step"]][name], abs=1e-5), (event["step"], name)


def stop_mid_step(root: Path, assets: Path, spec: dict) -> JobDir:
    job, stopped = run_job(root, assets, spec, env=faults_env(FINETUNE_TEST_SIGTERM_AT="6.1"))
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after 1 of 2 micro-batches of step 6; checkpoint-5-micro-1 written" in (
        stopped.termination
    ), stopped.termination
    assert (job.checkpoints / "checkpoint-5-micro-1" / "partial_step.pt").is_file()
    return job


@pytest.fixture(scope="module")
def dpo_stopped_in_step_6(tmp_path_factory: pytest.TempPathFactory, pair_assets: Path) -> JobDir:
    """dpo_one_process's recipe stopped after micro-batch 1 of 2 of step 6: two tests resume it,
    each from a copy of its folder, on one process and on two."""
    return stop_mid_step(tmp_path_factory.mktemp("dpo-stopped"), pair_assets, preference(ONE))


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-processes"])
def test_dpo_stopped_by_sigterm_mid_accumulation_resumes_to_the_uninterrupted_adapter(
    dpo_one_process: tuple[JobDir, Run],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    pair_assets: Path,
    processes: int,
) -> None:
    if processes == 1:
        reference, uninterrupted = dpo_one_process
        job = copy_of(request.getfixturevalue("dpo_stopped_in_step_6"), tmp_path / "stopped")
    else:
        spec = preference(with_changes(TWO, training={"batchSize": 1, "gradientAccumulation": 2}))
        reference, uninterrupted = run_job(mkdir(tmp_path, "uninterrupted"), pair_assets, spec)
        assert uninterrupted.code == 0, uninterrupted.stderr[-3000:]
        job = stop_mid_step(mkdir(tmp_path, "stopped"), pair_assets, spec)
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    start = resumed.of("start")[0]
    assert (start["resumeFrom"]["step"], start["resumeFrom"]["microBatchesDone"]) == (5, 1)
    assert sorted(resumed.losses) == list(range(6, STEPS + 1))  # step 6 is finished, not redone
    assert_same_figures(resumed, uninterrupted)
    got, expected = trained(job, resumed), adapter(reference)
    print(f"dpo SIGTERM at 6.1 on {processes} process(es), resumed: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)


def test_dpo_stopped_inside_a_step_resumes_on_two_processes_by_running_that_step_again(
    dpo_one_process: tuple[JobDir, Run], dpo_stopped_in_step_6: JobDir, tmp_path: Path
) -> None:
    reference, uninterrupted = dpo_one_process
    job = copy_of(dpo_stopped_in_step_6, tmp_path / "stopped")
    job.spec_changes = preference(TWO)
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert "runs again from its start" in resumed.stderr
    assert sorted(resumed.losses) == list(range(6, STEPS + 1))
    assert_same_figures(resumed, uninterrupted)
    got, expected = trained(job, resumed), adapter(reference)
    print(f"dpo stopped on 1 process, resumed on 2: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)
