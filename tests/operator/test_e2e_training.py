"""End to end with the real trainer on the node agent's node (local-0): progress in status,
checkpoints, retries that resume, suspend/resume, and failing fast on bad data."""

import json
import os
import signal
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import Jobs, OperatorProcess, reported_the_end, wait_for
from tests.support.processes import trainer_pid, worker_pid
from tests.support.specs import body
from tests.support.training import (
    CHECKPOINTS,
    RUN_TIMEOUT,
    adapter_tensors,
    assert_same_trained_adapter,
    host_path,
    running_pod,
    summary,
    trainer_event,
    trainer_hooks,
    trainer_hooks_off,
    watch_until_done,
)

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

# Small enough for 2 busy cores, long enough to see progress move and to act between checkpoints
# (a tiny step takes about 0.1 s on the CPU, so the first checkpoint comes a second or more in).
TRAINING = {"maxSteps": 32, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3}


def cpu_spec(**extra: object) -> dict:
    return body(training=TRAINING, checkpoints=CHECKPOINTS, **extra)


def checkpointed(jobs: Jobs, name: str) -> dict | None:
    status = jobs.status(name)
    return status if status.get("lastCheckpoint", {}).get("step") and status.get("phase") == "Running" else None


def test_tiny_cpu_job_trains_reports_progress_and_leaves_an_adapter(
    core: client.CoreV1Api, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    # The tiny model trains its 32 steps in about 0.3 s, under one 0.5 s poll of the status (seen:
    # only the final step); 0.1 s per step lets the poll see the progress move.
    trainer_hooks(core, namespace, "tiny", FINETUNE_TEST_STEP_DELAY="0.1")
    jobs.create("tiny", cpu_spec(output={"samples": {"count": 1, "maxNewTokens": 8}}))
    phases, steps, status = watch_until_done(jobs, "tiny")
    assert status["phase"] == "Succeeded", status
    status = jobs.status_when("tiny", lambda s: reported_the_end(s, sample=True), "the trainer's last status")
    assert "Running" in phases
    assert len(steps) >= 2 and steps == sorted(steps), f"progress.step should increase during the run: {steps}"
    assert status["progress"]["step"] == TRAINING["maxSteps"]
    assert status["lastCheckpoint"]["step"] >= CHECKPOINTS["everySteps"]
    adapter = host_path(training_volumes, status["output"]["adapterPath"])
    assert (adapter / "adapter_config.json").is_file()
    assert any(adapter.glob("adapter_model.*"))
    # output.samples: samples.jsonl beside the adapter, its first answer in the status.
    sample = status["sample"]
    rows = [json.loads(line) for line in host_path(training_volumes, sample["path"]).read_text().splitlines()]
    assert len(rows) == 1 and sample["prompt"] == rows[0]["prompt"][:240] and sample["answer"] == rows[0]["answer"]
    assert [f["format"] for f in status["output"]["formats"]] == ["peft"]
    assert status["restarts"] == 0
    assert status["startTime"] and status["completionTime"]
    # A job that runs well posts no Event: its phases, conditions and times are in the status.
    assert jobs.operator_events("tiny") == []
    # What the trainer reported, served per job for the chart's dashboard: read from the operator's
    # watch cache at each scrape, which the trainer's last patch reaches in its own time.
    tiny = {"namespace": jobs.namespace, "name": "tiny"}

    def served_at_the_end() -> dict[str, float] | None:
        served = operator.metrics()
        families = text_string_to_metric_families(served)
        per_job = {s.name: s.value for f in families for s in f.samples if s.labels == tiny}
        at_end = per_job.get("finetune_job_progress_step") == TRAINING["maxSteps"]
        return per_job if at_end and 'finetune_jobs{phase="Succeeded"} 1.0' in served else None

    per_job = wait_for(served_at_the_end, 30, "the finished job on the operator's /metrics")
    assert per_job["finetune_job_loss"] == status["progress"]["loss"]
    assert per_job["finetune_job_progress_ratio"] == 1.0


def test_invalid_data_fails_at_once_without_retries(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    bad = training_volumes["datasets"] / "bad.jsonl"
    bad.write_text('{"instruction": "say hi", "output": "hi"}\n{"instruction": "", "output": ""}\nnot json\n')
    spec = cpu_spec(dataset={"source": {"pvc": {"claimName": "datasets", "path": "bad.jsonl"}}, "format": "alpaca"})
    jobs.create("bad", spec)
    _, _, status = watch_until_done(jobs, "bad")
    failed = jobs.condition("bad", "Failed")
    assert status["phase"] == "Failed"
    assert failed["reason"] == "InvalidData", failed
    assert "claim 'datasets', path 'bad.jsonl': line 2" in failed["message"], failed
    # Found by the input check, once, before any trainer pod (tests/operator/test_e2e_preflight.py).
    assert jobs.pods("bad") == [] and len(jobs.pods("bad", preflight=True)) == 1
    assert status.get("restarts", 0) == 0
    assert jobs.events_with("bad", "InvalidData")


def test_a_target_the_model_lacks_fails_at_once_in_one_line_without_retries(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    jobs.create("fused", cpu_spec(lora={"targetModules": ["q_proj", "qkv_proj"]}))
    _, _, status = watch_until_done(jobs, "fused")
    failed = jobs.condition("fused", "Failed")
    assert status["phase"] == "Failed"
    assert failed["reason"] == "InvalidConfig", failed
    assert failed["message"].startswith("spec.lora.targetModules: qkv_proj"), failed
    assert "\n" not in failed["message"] and "Traceback" not in failed["message"]
    assert status.get("restarts", 0) == 0
    assert jobs.pods("fused") == [] and len(jobs.pods("fused", preflight=True)) == 1, "found once, before training"


def test_a_retryable_failure_restarts_and_resumes_from_the_checkpoint(
    cluster, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    jobs.create("retry", cpu_spec(backoffLimit=2))
    checkpoint = wait_for(lambda: checkpointed(jobs, "retry"), RUN_TIMEOUT, "a first checkpoint")["lastCheckpoint"]
    pod = running_pod(jobs, "retry")
    assert pod is not None
    os.killpg(trainer_pid(cluster, namespace, pod["metadata"]["name"]), signal.SIGKILL)

    phases, _, status = watch_until_done(jobs, "retry")
    assert "Failed" not in phases, f"never Failed while the Job has retries left: {phases}"
    assert status["phase"] == "Succeeded"
    assert status["restarts"] == 1
    assert sorted(p["status"]["phase"] for p in jobs.pods("retry")) == ["Failed", "Succeeded"]
    resumed = summary(training_volumes, "retry")["resumedFrom"]
    assert resumed is not None and resumed["step"] >= checkpoint["step"]
    assert jobs.events_with("retry", "Restarted")


# --- more than one process in the pod -------------------------------------------------------

# Two CPU processes (gloo) in one pod, each with one micro-batch of 2 per step.
TWO_PROCESSES = {"gpus": 0, "cpu": "2", "memory": "4Gi", "processes": 2}


def test_two_process_pods_train_in_each_mode_and_a_killed_rank_retries_to_the_same_adapter(
    cluster, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    """Three 2-process jobs side by side: dataParallel, fsdp, and dataParallel with rank 1 killed."""
    for name, mode in (("two-dp", "dataParallel"), ("two-fsdp", "fsdp"), ("two-killed", "dataParallel")):
        training = {**TRAINING, "parallelism": mode}
        jobs.create(name, body(training=training, checkpoints=CHECKPOINTS, resources=TWO_PROCESSES, backoffLimit=2))
    wait_for(lambda: checkpointed(jobs, "two-killed"), RUN_TIMEOUT, "a first checkpoint")
    pod = running_pod(jobs, "two-killed")
    assert pod is not None
    launcher = trainer_pid(cluster, namespace, pod["metadata"]["name"])
    os.kill(wait_for(lambda: worker_pid(launcher, 1), 30, "rank 1's process"), signal.SIGKILL)

    final = {name: watch_until_done(jobs, name) for name in ("two-dp", "two-fsdp", "two-killed")}
    for name, mode in (("two-dp", "dataParallel"), ("two-fsdp", "fsdp")):
        phases, _, status = final[name]
        assert status["phase"] == "Succeeded", status
        status = jobs.status_when(name, reported_the_end, "the trainer's last progress")
        assert status["progress"]["step"] == TRAINING["maxSteps"]
        assert status["restarts"] == 0
        done = summary(training_volumes, name)
        assert (done["parallelism"], done["worldSize"]) == (mode, 2)
    dp = adapter_tensors(training_volumes, final["two-dp"][2])
    # dataParallel and fsdp differ only in where the frozen base lives: the same adapter.
    assert_same_trained_adapter(adapter_tensors(training_volumes, final["two-fsdp"][2]), dp)

    phases, _, status = final["two-killed"]
    assert "Failed" not in phases, f"a killed rank is retryable: {phases}"
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 1
    assert summary(training_volumes, "two-killed")["resumedFrom"] is not None
    assert_same_trained_adapter(adapter_tensors(training_volumes, status), dp)


# --- SIGTERM: suspend keeps every micro-batch -------------------------------------------


# Two processes, four micro-batches of one sample each per step: most SIGTERMs land inside a step.
RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"
ACCUMULATING = {**TRAINING, "batchSize": 1, "gradientAccumulation": 4}
SUSPEND_TRIES = 4


def test_ftjob_suspend_mid_accumulation_loses_no_micro_batch_and_ends_with_the_uninterrupted_adapter(
    cluster,
    core: client.CoreV1Api,
    namespace: str,
    jobs: Jobs,
    training_volumes: dict[str, Path],
    operator: OperatorProcess,
) -> None:
    """`ftjob suspend` SIGTERMs the pod: the trainer stops at the next micro-batch boundary with a
    checkpoint of that point; `ftjob resume` finishes the step from there. A stop that happens to
    land on a step boundary proves less, so the test suspends again until one lands inside a step."""
    spec = {"training": ACCUMULATING, "checkpoints": CHECKPOINTS, "resources": TWO_PROCESSES}
    # 0.25 s after each micro-batch: the 32 steps of 4 take over 30 s, so the suspend's way through
    # the API reaches a running trainer on a loaded machine too (without it the run once ended,
    # in 2.5 s, before the SIGTERM), and a stop lands inside a step 3 times in 4.
    trainer_hooks(core, namespace, "pause", FINETUNE_TEST_MICRO_DELAY="0.25")
    jobs.create("steady", body(**spec))
    jobs.create("pause", body(**spec))
    stops: list[dict] = []
    for _ in range(SUSPEND_TRIES):
        pod = wait_for(lambda: running_pod(jobs, "pause"), RUN_TIMEOUT, "a running attempt")
        pod_name = pod["metadata"]["name"]
        # Mid-training: this attempt has logged a step past any it resumed from.
        wait_for(lambda: trainer_event(cluster, namespace, pod_name, "progress"), RUN_TIMEOUT, "training")  # noqa: B023
        done = ftjob("suspend", "pause", "-n", namespace)
        assert done.returncode == 0, done.stderr
        jobs.wait_phase("pause", "Suspended", 120)
        wait_for(lambda: not jobs.pods("pause"), 120, "the trainer pod to go away while suspended")
        # The pod is gone, so the trainer has exited; its last lines may still be on their way to
        # the log on a loaded machine (4 test workers on 2 cores: once over 30 s).
        stops.append(wait_for(lambda: trainer_event(cluster, namespace, pod_name, "stopped"), 90, "the stop"))  # noqa: B023
        if stops[-1]["microBatchesDone"]:
            # The stop this test needs: the attempt that finishes the run has nothing to wait for.
            trainer_hooks_off(core, namespace, "pause")
        done = ftjob("resume", "pause", "-n", namespace)
        assert done.returncode == 0, done.stderr
        if stops[-1]["microBatchesDone"]:
            break
    assert stops[-1]["microBatchesDone"] > 0, f"every stop landed on a step boundary: {stops}"
    # The figures of each stop (seconds from SIGTERM to a complete checkpoint), for the record.
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "suspend-stops.json").write_text(json.dumps(stops, indent=1))

    final = {name: watch_until_done(jobs, name)[2] for name in ("steady", "pause")}
    for name in ("steady", "pause"):
        assert final[name]["phase"] == "Succeeded", final[name]
        assert summary(training_volumes, name)["finalStep"] == ACCUMULATING["maxSteps"]
    # An interrupted attempt is nobody's fault: not a restart, not counted against backoffLimit.
    assert final["pause"]["restarts"] == 0
    resumed = summary(training_volumes, "pause")["resumedFrom"]
    assert resumed["path"].endswith(stops[-1]["checkpoint"])
    assert resumed["microBatchesDone"] == stops[-1]["microBatchesDone"]
    steady = adapter_tensors(training_volumes, final["steady"])
    assert_same_trained_adapter(adapter_tensors(training_volumes, final["pause"]), steady)
