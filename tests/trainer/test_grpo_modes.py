"""GRPO in the trainer's modes: 2 processes train the adapter of 1 with twice the accumulation
(dataParallel and fsdp), and a SIGTERM inside a step resumes to the uninterrupted run's adapter.

Both hold because a completion's tokens are drawn from noise keyed by the step and the prompt's
place in it (objectives/grpo/sampling.py), not from a generator whose state depends on what a
rank drew before: the same prompts get the same completions on any split, and a step run again
after its resume gets the completions it had. The comparisons are test_parallel.py's, within
ADAPTER_TOLERANCE (tests/support/training.py); the figures (mean reward, spread, length) must
match too, as they are sums over every rank's completions.
"""

from pathlib import Path
from typing import Any

import pytest

from finetune_api.reasons import ExitReason
from tests.support.faults import faults_env
from tests.support.training import assert_same_trained_adapter, max_difference

from .conftest import JobDir, Run
from .test_grpo_training import CAPITAL, prompt_assets  # noqa: F401 - the module fixture
from .test_grpo_training import grpo_spec as grpo_of
from .test_parallel import ONE, TWO, adapter, copy_of, run_job, summary, with_changes

pytestmark = pytest.mark.trainer

STEPS = 12
REWARDS = [
    {"name": "capital", "format": {"pattern": CAPITAL}},
    {"name": "short", "weight": 0.1, "length": {"target": 3}},
]
FIGURES = ("reward", "reward_std", "reward_group_std", "rewards/capital/mean", "completions/mean_length")


def grpo(base: dict[str, Any], **grpo_settings: Any) -> dict[str, Any]:
    """`base` (test_parallel.py's ONE or TWO: 2 prompts a micro-batch, 12 steps) training GRPO."""
    spec = grpo_of(REWARDS, **grpo_settings)
    training = {k: v for k, v in spec["training"].items() if k not in ("maxSteps", "batchSize", "gradientAccumulation")}
    return with_changes(base, training=training, dataset=spec["dataset"], output=spec["output"])


def trained(job: JobDir, run: Run) -> dict:
    assert run.code == 0, run.stderr[-3000:]
    assert summary(job)["finalStep"] == STEPS
    return adapter(job)


def assert_same_figures(run: Run, reference: Run) -> None:
    theirs = {e["step"]: e for e in reference.of("progress")}
    for event in run.of("progress"):
        for name in FIGURES:
            assert event[name] == pytest.approx(theirs[event["step"]][name], abs=1e-5), (event["step"], name)
        assert event["loss"] == pytest.approx(theirs[event["step"]]["loss"], abs=1e-5), event["step"]


@pytest.fixture(scope="module")
def grpo_one_process(tmp_path_factory: pytest.TempPathFactory, prompt_assets: Path) -> tuple[JobDir, Run]:  # noqa: F811
    """1 process x accumulation 2: what every mode must train."""
    return run_job(tmp_path_factory.mktemp("grpo-one"), prompt_assets, grpo(ONE))


@pytest.mark.parametrize("parallelism", ["dataParallel", "fsdp"])
def test_grpo_on_two_processes_trains_the_adapter_of_one_with_twice_the_accumulation(
    grpo_one_process: tuple[JobDir, Run],
    tmp_path: Path,
    prompt_assets: Path,  # noqa: F811
    parallelism: str,
) -> None:
    one, single = grpo_one_process
    job, run = run_job(tmp_path, prompt_assets, grpo(with_changes(TWO, training={"parallelism": parallelism})))
    expected, got = trained(one, single), trained(job, run)
    assert (summary(job)["parallelism"], summary(job)["worldSize"]) == (parallelism, 2)
    print(f"grpo {parallelism} 2x1 against 1x2: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)
    assert_same_figures(run, single)


def test_a_sigterm_inside_a_grpo_step_resumes_to_the_uninterrupted_adapter(
    grpo_one_process: tuple[JobDir, Run],
    tmp_path: Path,
    prompt_assets: Path,  # noqa: F811
) -> None:
    one, single = grpo_one_process
    (tmp_path / "run").mkdir()
    job, stopped = run_job(tmp_path / "run", prompt_assets, grpo(ONE), env=faults_env(FINETUNE_TEST_SIGTERM_AT="6.1"))
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert "checkpoint-5-micro-1 written" in stopped.termination, stopped.termination
    resumed_job = copy_of(job, tmp_path / "resumed")
    resumed = resumed_job.run()
    got = trained(resumed_job, resumed)
    print(f"grpo resumed inside step 6: max abs difference {max_difference(got, trained(one, single))}")
    assert_same_trained_adapter(got, adapter(one))
    assert_same_figures(resumed, single)


def test_grpo_with_iterations_and_a_reference_trains_alike_on_two_processes(
    tmp_path: Path,
    prompt_assets: Path,  # noqa: F811
) -> None:
    """numIterations 2 (each batch of rollouts serves two updates, the ratio to the sampling
    policy's log-probabilities then moves) and beta (the KL to the model without its adapter)."""
    settings = {"numIterations": 2, "beta": 0.04, "lossType": "grpo", "scaleRewards": "batch"}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, single = run_job(tmp_path / "one", prompt_assets, grpo(ONE, **settings))
    two, run = run_job(tmp_path / "two", prompt_assets, grpo(TWO, **settings))
    expected, got = trained(one, single), trained(two, run)
    assert_same_trained_adapter(got, expected)
    assert_same_figures(run, single)
    last = run.of("progress")[-1]
    assert last["kl"] > 0
    # The same rows serve steps 2k+1 and 2k+2: the second step's rewards are the first's.
    rewards = {e["step"]: e["reward"] for e in single.of("progress")}
    assert all(rewards[s] == rewards[s + 1] for s in range(1, STEPS, 2)), rewards
