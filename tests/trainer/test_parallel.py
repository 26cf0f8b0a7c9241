"""The pod's trainer with more than one process (gloo on the CPU): the same math as one process,
checkpoints that resume after a rank is killed and on another process count, and the failing
rank's reason as the pod's.

Tolerance, stated once: ADAPTER_TOLERANCE is the largest absolute difference allowed between
two adapters that must be equal. 2 processes x gradient accumulation k and 1 process x 2k run
the same micro-batches with the same dropout seeds; only the order of the gradient sums
differs (a two-way all-reduce against a local accumulation), so they agree to float32 rounding.
Measured on this recipe: 0.0 (the sums happen to round alike), so 1e-5 leaves room for other
CPUs without hiding a wrong sample or a missing micro-batch: one micro-batch lost out of 24
moves the adapter by 0.023 (test_a_resume_one_micro_batch_off_is_beyond_the_tolerance plants it).
Equal adapters mean something only when they trained: every comparison here also checks that
both moved from their initial value (tests/support/training.py's assert_same_trained_adapter).
The same tolerance holds two launchers of one process each (two nodes, a c10d rendezvous on
127.0.0.1) to one launcher of two: the same world, the same ranks, the same sums. Measured: 0.0.
"""

import json
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bench.streamed_load import tensor_bytes
from finetune_api import multinode
from finetune_api.reasons import NON_RETRYABLE, ExitReason
from tests.support.faults import faults_env
from tests.support.training import ADAPTER_TOLERANCE, assert_same_trained_adapter, max_difference, movement

from .conftest import JobDir, Run, make_job_dir

pytestmark = pytest.mark.trainer

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


def summary(job: JobDir) -> dict:
    return json.loads((job.output / "summary.json").read_text())


def run_job(root: Path, tiny_assets: Path, spec: dict, env: dict[str, str] | None = None) -> tuple[JobDir, Run]:
    job = make_job_dir(root, tiny_assets)
    job.spec_changes = spec
    return job, job.run(env=env)


def copy_of(job: JobDir, root: Path) -> JobDir:
    """A job folder of its own holding what `job` left (its checkpoints), to go on from there."""
    shutil.copytree(job.root, root, symlinks=True)
    return JobDir(root, dict(job.spec_changes))


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """The uninterrupted 2-process dataParallel run every other run here is compared with."""
    return run_job(tmp_path_factory.mktemp("two"), tiny_assets, TWO)


# The runs below are each read by two tests or more: made once (each as its own test made it before).


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """One process with twice the accumulation (the base recipe's samples asked, as everywhere)."""
    return run_job(tmp_path_factory.mktemp("one"), tiny_assets, ONE)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """TWO under fsdp, whose ranks also answer the samples together."""
    return run_job(tmp_path_factory.mktemp("fsdp"), tiny_assets, with_changes(TWO, training={"parallelism": "fsdp"}))


@pytest.fixture(scope="module")
def one_stopped_in_step_6(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """ONE stopped by SIGTERM after micro-batch 1 of 2 of step 6: three tests resume it, each
    from a copy of its folder (copy_of), in its own way."""
    return run_job(tmp_path_factory.mktemp("stopped"), tiny_assets, ONE, env=faults_env(FINETUNE_TEST_SIGTERM_AT="6.1"))


def test_two_processes_train_the_adapter_of_one_with_twice_the_accumulation(
    two_process_run: tuple[JobDir, Run], one_process_run: tuple[JobDir, Run], tiny_assets: Path
) -> None:
    two, run = two_process_run
    assert run.code == 0, run.stderr[-3000:]
    assert summary(two)["parallelism"] == "dataParallel"
    assert summary(two)["worldSize"] == 2
    assert summary(two)["ranksInStep"] is True
    # Each process reads the whole checkpoint through from_pretrained.
    files = sorted((tiny_assets / "models" / "tiny-llama").glob("*.safetensors"))
    assert summary(two)["modelBytesRead"] == 2 * sum(f.stat().st_size for f in files)
    assert len(run.of("start")) == 1, "only rank 0 reports"
    assert len(run.of("progress")) == STEPS
    one, single = one_process_run
    assert single.code == 0, single.stderr[-3000:]
    assert summary(one)["worldSize"] == 1
    assert_same_trained_adapter(adapter(two), adapter(one))
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
    two_process_run: tuple[JobDir, Run], fsdp_run: tuple[JobDir, Run], tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, run = fsdp_run
    assert run.code == 0, run.stderr[-3000:]
    assert summary(job)["parallelism"] == "fsdp"
    # Streamed: each of the checkpoint's tensors read once, by one of the two processes.
    assert summary(job)["modelBytesRead"] == tensor_bytes(tiny_assets / "models" / "tiny-llama")[0]
    guard = summary(job)["precisionGuard"]
    assert guard["halfParameters"] == guard["halfBuffers"] == guard["halfActivations"] == 0
    assert_same_trained_adapter(adapter(job), adapter(two))
    # PEFT's own layout: the folder loads as an adapter anywhere.
    config = json.loads((job.output / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"


def test_a_killed_rank_fails_the_pod_retryably_and_the_next_attempt_ends_alike(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, killed = run_job(tmp_path, tiny_assets, TWO, env=faults_env(FINETUNE_TEST_KILL_RANK_AT="1@6"))
    assert killed.code == ExitReason.TrainerError, killed.stderr[-3000:]
    assert killed.termination.startswith("TrainerError: rank 1 was killed by SIGKILL")
    assert "Traceback" not in killed.termination
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 4
    assert_same_trained_adapter(adapter(job), adapter(two))


def test_a_rank_that_exits_unfinished_fails_the_pod_retryably_in_its_name(tmp_path: Path, tiny_assets: Path) -> None:
    """What the launcher sees of a rank whose exit status was lost: an exit 0 mid-run. The pod
    must neither hang on the other rank nor call the run a success."""
    _, run = run_job(tmp_path, tiny_assets, TWO, env=faults_env(FINETUNE_TEST_EXIT_RANK_AT="1@6"))
    assert run.code == ExitReason.TrainerError, run.stderr[-3000:]
    assert run.termination.startswith("TrainerError: rank 1 "), run.termination
    assert "the job resumes from its last checkpoint" in run.termination
    assert len(run.of("failed")) == 1


def test_a_checkpoint_of_two_processes_resumes_in_one(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, killed = run_job(tmp_path, tiny_assets, TWO, env=faults_env(FINETUNE_TEST_KILL_RANK_AT="0@6"))
    assert killed.code == ExitReason.TrainerError
    # The same global batch on one process: accumulation doubles as the process count halves.
    job.spec_changes = ONE
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 4
    assert resumed.of("start")[0]["worldSize"] == 1
    assert summary(job)["finalStep"] == STEPS
    assert_same_trained_adapter(adapter(job), adapter(two))


def test_a_non_finite_loss_on_one_rank_stops_every_rank_with_its_reason(tmp_path: Path, tiny_assets: Path) -> None:
    _, run = run_job(tmp_path, tiny_assets, TWO, env=faults_env(FINETUNE_TEST_NONFINITE_AT="6@1"))
    assert run.code == ExitReason.NonFiniteLoss, run.stderr[-3000:]
    assert run.termination.startswith("NonFiniteLoss: rank ")
    assert "loss is nan at step 6" in run.termination
    assert "last good checkpoint: step 4" in run.termination
    assert max(run.losses) == 5
    assert "Traceback" not in run.termination
    assert len(run.of("failed")) == 1  # the launcher speaks for the pod, once


def samples_of(job: JobDir) -> list[dict]:
    path = job.output / "samples.jsonl"
    assert path.is_file(), f"no {path}"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_fsdp_ranks_answer_the_samples_together_as_one_process_answers_them(
    fsdp_run: tuple[JobDir, Run], one_process_run: tuple[JobDir, Run]
) -> None:
    """Under fsdp each rank holds a shard: every rank runs every forward of the greedy answers
    (the base recipe's: 2 of at most 12 tokens) in lockstep and rank 0 writes them; they are the
    one process's answers word for word."""
    two, split = fsdp_run
    one, single = one_process_run
    assert split.code == 0, split.stderr[-3000:]
    assert single.code == 0, single.stderr[-3000:]
    assert summary(two)["parallelism"] == "fsdp"
    assert_same_trained_adapter(adapter(two), adapter(one))
    answers, reference = samples_of(two), samples_of(one)
    assert len(answers) == 2
    assert answers == reference
    # Something to compare: the adapter changed what the model says.
    assert any(row["answer"] != row["baseAnswer"] for row in answers)
    assert len(split.of("samples")) == 1, "rank 0 alone writes them"


def test_packing_eval_and_the_merged_export_are_the_same_on_two_processes(tmp_path: Path, tiny_assets: Path) -> None:
    # Two answers of 12 tokens: fsdp's ranks answer in lockstep without a KV cache, one process
    # with it, and both must give the same words and figures.
    evaluation = {"generate": {"count": 2, "maxNewTokens": 12}}
    extras = {"dataset": {"evalFraction": 0.1}, "output": {"merge": True}, "evaluation": evaluation}
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
    # The evaluation (evaluation.json): the same base and tuned figures and the same answers.
    judged_two, judged_one = (json.loads((job.output / "evaluation.json").read_text()) for job in (two, one))
    assert judged_two["answers"] == judged_one["answers"] and len(judged_one["answers"]) == 2
    assert [f["name"] for f in judged_two["figures"]] == [f["name"] for f in judged_one["figures"]]
    for mine, theirs in zip(judged_two["figures"], judged_one["figures"], strict=True):
        for side in ("base", "tuned"):
            assert mine[side] == pytest.approx(theirs[side], rel=1e-4, abs=1e-4), (mine, theirs)
    assert_same_trained_adapter(adapter(two), adapter(one))
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
    two_process_run: tuple[JobDir, Run],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tiny_assets: Path,
    processes: int,
) -> None:
    if processes == 1:
        # ONE trains the adapter of two_process_run (the first test here).
        two, uninterrupted = two_process_run
        stopped_once, stopped = request.getfixturevalue("one_stopped_in_step_6")
        job = copy_of(stopped_once, tmp_path / "stopped")
    else:
        spec = TWO_ACCUMULATING  # micro-batches of one sample: its own uninterrupted run
        (tmp_path / "uninterrupted").mkdir()
        two, uninterrupted = run_job(tmp_path / "uninterrupted", tiny_assets, spec)
        assert uninterrupted.code == 0, uninterrupted.stderr[-3000:]
        (tmp_path / "stopped").mkdir()
        job, stopped = run_job(tmp_path / "stopped", tiny_assets, spec, env=faults_env(FINETUNE_TEST_SIGTERM_AT="6.1"))
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
    assert_same_trained_adapter(adapter(job), adapter(two))


def test_a_resume_one_micro_batch_off_is_beyond_the_tolerance(
    two_process_run: tuple[JobDir, Run], one_stopped_in_step_6: tuple[JobDir, Run], tmp_path: Path
) -> None:
    """The tolerance bites: the fault it exists for, planted. A run stopped after micro-batch 1
    of step 6 resumes from a checkpoint whose carried gradients were zeroed here (what a resume
    that forgot them would do), so step 6 applies micro-batch 2 alone: one micro-batch lost out
    of 24. Its adapter must fall outside ADAPTER_TOLERANCE of the uninterrupted one's."""
    import torch

    two, _ = two_process_run
    stopped_once, stopped = one_stopped_in_step_6
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    job = copy_of(stopped_once, tmp_path / "stopped")
    partial_file = job.checkpoints / "checkpoint-5-micro-1" / "partial_step.pt"
    partial = torch.load(partial_file, map_location="cpu", weights_only=True)
    assert max(float(g.abs().max()) for g in partial["grads"].values()) > 0, "micro-batch 1 left no gradient"
    partial["grads"] = {name: torch.zeros_like(g) for name, g in partial["grads"].items()}
    torch.save(partial, partial_file)
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert summary(job)["finalStep"] == STEPS
    assert movement(adapter(job)) > 100 * ADAPTER_TOLERANCE
    difference = max_difference(adapter(job), adapter(two))
    print(f"one micro-batch lost: max abs difference {difference} (tolerance {ADAPTER_TOLERANCE})")
    assert difference > 10 * ADAPTER_TOLERANCE, difference


def test_a_stop_inside_a_step_resumes_on_another_process_count_by_running_that_step_again(
    two_process_run: tuple[JobDir, Run], one_stopped_in_step_6: tuple[JobDir, Run], tmp_path: Path
) -> None:
    two, _ = two_process_run
    stopped_once, stopped = one_stopped_in_step_6
    assert stopped.code == ExitReason.Interrupted
    job = copy_of(stopped_once, tmp_path / "stopped")
    job.spec_changes = TWO
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert "runs again from its start" in resumed.stderr
    assert summary(job)["finalStep"] == STEPS
    assert_same_trained_adapter(adapter(job), adapter(two))


def test_sigterm_twice_during_a_checkpoint_write_leaves_that_checkpoint_whole(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, _ = two_process_run
    job, stopped = run_job(tmp_path, tiny_assets, TWO, env=faults_env(FINETUNE_TEST_SIGTERM_IN_SAVE="8"))
    assert stopped.code == ExitReason.Interrupted, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after step 8; checkpoint-8 written" in stopped.termination, stopped.termination
    assert "CHECKPOINT_COMPLETE.json" in {p.name for p in (job.checkpoints / "checkpoint-8").iterdir()}
    resumed = job.run()
    assert resumed.code == 0, resumed.stderr[-3000:]
    assert resumed.of("start")[0]["resumeFrom"]["step"] == 8
    assert_same_trained_adapter(adapter(job), adapter(two))


# --- several nodes: one launcher per pod, a c10d rendezvous on pod 0 ------------------------

# One process in each of two pods: the world of TWO, split over two launchers. Each launcher has
# a workdir of its own, so node 1 never sees node 0's output volume (as on another machine).
TWO_NODES = with_changes(TWO, resources={"processes": 1, "nodes": 2})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_env(index: int, port: int, nodes: int = 2, timeout_s: int = 120, **extra: str) -> dict[str, str]:
    """What the Indexed Job sets on the pod of `index` (and the address that pod has)."""
    return {
        multinode.NNODES_ENV: str(nodes),
        multinode.NODE_RANK_ENV: str(index),
        multinode.RDZV_ENDPOINT_ENV: f"127.0.0.1:{port}",
        multinode.NODE_ADDR_ENV: f"127.0.0.{index + 1}",
        multinode.RDZV_TIMEOUT_ENV: str(timeout_s),
        **extra,
    }


def run_nodes(jobs: list[JobDir], env: dict[str, str] | None = None) -> list[Run]:
    """Every node's launcher at once, to the end of each."""
    port = _free_port()
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(job.run, env=node_env(i, port, len(jobs), **(env or {}))) for i, job in enumerate(jobs)]
        return [f.result() for f in futures]


def two_node_jobs(root: Path, tiny_assets: Path) -> list[JobDir]:
    jobs = []
    for index in range(2):
        (root / f"node-{index}").mkdir()
        job = make_job_dir(root / f"node-{index}", tiny_assets)
        job.spec_changes = TWO_NODES
        jobs.append(job)
    return jobs


def test_two_nodes_of_one_process_train_the_adapter_of_one_pod_with_two(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    two, run = two_process_run
    jobs = two_node_jobs(tmp_path, tiny_assets)
    first, second = run_nodes(jobs)
    assert first.code == 0, first.stderr[-3000:]
    assert second.code == 0, second.stderr[-3000:]
    assert summary(jobs[0])["worldSize"] == 2
    assert summary(jobs[0])["ranksInStep"] is True
    difference = max_difference(adapter(jobs[0]), adapter(two))
    print(f"two nodes against one pod of two processes: max abs difference {difference}")
    assert_same_trained_adapter(adapter(jobs[0]), adapter(two))
    assert first.losses == pytest.approx(run.losses, abs=1e-4)
    # Global rank 0 is in the pod of index 0, and it alone writes and reports.
    assert len(first.of("start")) == 1 and not second.of("start")
    assert not jobs[1].output.exists(), "node 1 wrote into its output volume"


def test_a_killed_rank_on_the_second_node_and_the_whole_gang_resumes_from_rank_0s_checkpoint(
    two_process_run: tuple[JobDir, Run], tmp_path: Path, tiny_assets: Path
) -> None:
    """Node 1 has no checkpoint of its own (another machine): rank 0 sends it the one it resumes."""
    two, _ = two_process_run
    jobs = two_node_jobs(tmp_path, tiny_assets)
    killed = run_nodes(jobs, env=faults_env(FINETUNE_TEST_KILL_RANK_AT="1@6"))
    assert killed[1].code == ExitReason.TrainerError, killed[1].stderr[-3000:]
    assert killed[1].termination.startswith("TrainerError: rank 1 was killed by SIGKILL"), killed[1].termination
    assert killed[0].code != 0
    assert (jobs[0].checkpoints / "checkpoint-4").is_dir()
    resumed = run_nodes(jobs)
    assert resumed[0].code == 0, resumed[0].stderr[-3000:]
    assert resumed[1].code == 0, resumed[1].stderr[-3000:]
    assert resumed[0].of("start")[0]["resumeFrom"]["step"] == 4
    assert sorted(resumed[0].losses) == list(range(5, STEPS + 1))
    assert_same_trained_adapter(adapter(jobs[0]), adapter(two))
    assert not jobs[1].output.exists(), "node 1 saw or wrote a checkpoint"


@pytest.mark.parametrize("index", [0, 1], ids=["pod-0-without-its-peer", "pod-1-without-pod-0"])
def test_a_node_whose_peer_never_comes_exits_rendezvous_timeout_within_the_bound(
    tmp_path: Path, tiny_assets: Path, index: int
) -> None:
    """Pod 0 serves the rendezvous and waits for pod 1 (the join timeout); pod 1 waits for pod 0's
    store to listen, then to join it: at most twice the bound. Both end, with a retryable reason."""
    job = make_job_dir(tmp_path, tiny_assets)
    job.spec_changes = TWO_NODES
    bound = 5
    started = time.monotonic()
    run = job.run(env=node_env(index, _free_port(), timeout_s=bound), timeout=300)
    elapsed = time.monotonic() - started
    assert run.code == ExitReason.RendezvousTimeout, run.stderr[-3000:]
    assert run.termination.startswith(f"RendezvousTimeout: node {index} of 2 did not meet every node"), run.termination
    assert ExitReason.RendezvousTimeout not in NON_RETRYABLE
    # The launcher's own start (imports, the plan) comes on top of the bound.
    assert elapsed < 2 * bound + 60, elapsed
    assert len(run.of("failed")) == 1


def test_a_node_waiting_at_the_rendezvous_stops_at_once_on_sigterm(tmp_path: Path, tiny_assets: Path) -> None:
    """A gang being deleted (deadline, suspend, FineTuneJob deleted) sends SIGTERM to pods whose
    launcher waits for peers that will not come: it leaves at once, Interrupted, not at the bound."""
    import os
    import signal

    job = make_job_dir(tmp_path, tiny_assets)
    job.spec_changes = TWO_NODES
    termination = tmp_path / "termination-log"
    command = [sys.executable, "-m", "finetune_trainer", "--config", str(job.config_path())]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **node_env(0, _free_port(), timeout_s=600)}
    process = subprocess.Popen(
        [*command, "--termination-log", str(termination)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert process.stderr is not None
    try:
        for line in process.stderr:
            if "node 0 of 2: rendezvous at" in line:
                break
        time.sleep(2)  # well inside the wait
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        process.kill()
    elapsed = time.monotonic() - sent
    assert process.returncode == ExitReason.Interrupted, process.returncode
    assert termination.read_text(encoding="utf-8").startswith("Interrupted: SIGTERM before any rank started"), (
        termination.read_text(encoding="utf-8")
    )
    assert elapsed < 10, elapsed
