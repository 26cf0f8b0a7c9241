"""End to end with the real trainer on the node agent's node (local-0): progress in status,
checkpoints, retries that resume, suspend/resume, and failing fast on bad data."""

import json
import os
import signal
from pathlib import Path

import pytest

from .harness import Jobs, OperatorProcess, wait_for
from .specs import body

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

# Small enough for 2 busy cores, long enough to see progress move and to act between checkpoints.
TRAINING = {"maxSteps": 8, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3}
CHECKPOINTS = {"everySteps": 2, "keep": 2}
RUN_TIMEOUT = 420


def cpu_spec(**extra: object) -> dict:
    return body(training=TRAINING, checkpoints=CHECKPOINTS, **extra)


def host_path(folders: dict[str, Path], pod_path: str) -> Path:
    """Where a path inside the pod's /mnt/output lies in the outputs PVC folder."""
    relative = Path(pod_path).relative_to("/mnt/output")
    return folders["outputs"] / relative


def watch_until_done(jobs: Jobs, name: str, timeout: float = RUN_TIMEOUT) -> tuple[list[str], list[int], dict]:
    """Phases and progress steps seen, in order, until the job is Succeeded or Failed."""
    phases: list[str] = []
    steps: list[int] = []

    def done() -> dict | None:
        status = jobs.status(name)
        phase = status.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        step = (status.get("progress") or {}).get("step")
        if step is not None and (not steps or steps[-1] != step):
            steps.append(step)
        return status if phase in ("Succeeded", "Failed") else None

    final = wait_for(done, timeout, f"{name} to finish", interval=0.5)
    return phases, steps, final


def summary(folders: dict[str, Path], name: str) -> dict:
    return json.loads((folders["outputs"] / name / "summary.json").read_text())


def trainer_pid(cluster, namespace: str, pod_name: str) -> int:
    folders = list(Path(cluster.layout.pods).glob(f"{namespace}_{pod_name}_*"))
    record = wait_for(
        lambda: next((f / "trainer.pid.json" for f in folders if (f / "trainer.pid.json").exists()), None),
        30,
        "the trainer's pid file",
    )
    return int(json.loads(record.read_text())["pid"])


def running_pod(jobs: Jobs, name: str) -> dict | None:
    return next((p for p in jobs.pods(name) if p["status"].get("phase") == "Running"), None)


def checkpointed(jobs: Jobs, name: str) -> dict | None:
    status = jobs.status(name)
    return status if status.get("lastCheckpoint", {}).get("step") and status.get("phase") == "Running" else None


def test_tiny_cpu_job_trains_reports_progress_and_leaves_an_adapter(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    jobs.create("tiny", cpu_spec())
    phases, steps, status = watch_until_done(jobs, "tiny")
    assert status["phase"] == "Succeeded", status
    assert "Running" in phases
    assert len(steps) >= 2 and steps == sorted(steps), f"progress.step should increase during the run: {steps}"
    assert status["progress"]["step"] == TRAINING["maxSteps"]
    assert status["lastCheckpoint"]["step"] >= CHECKPOINTS["everySteps"]
    adapter = host_path(training_volumes, status["output"]["adapterPath"])
    assert (adapter / "adapter_config.json").is_file()
    assert any(adapter.glob("adapter_model.*"))
    assert status["restarts"] == 0
    assert status["startTime"] and status["completionTime"]
    reasons = [e["reason"] for e in jobs.events("tiny")]
    assert {"JobCreated", "Running", "Succeeded"} <= set(reasons)
    assert 'finetune_jobs{phase="Succeeded"} 1.0' in operator.metrics()


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
    assert "line" in failed["message"]
    assert status["restarts"] == 0
    assert len(jobs.pods("bad")) == 1, "a non-retryable failure must not be retried"
    assert "InvalidData" in {e["reason"] for e in jobs.events("bad")}


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
    assert "Restarted" in {e["reason"] for e in jobs.events("retry")}


def test_suspend_removes_the_pod_and_resume_continues_from_the_checkpoint(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    jobs.create("pause", cpu_spec())
    wait_for(lambda: checkpointed(jobs, "pause"), RUN_TIMEOUT, "a first checkpoint")
    jobs.patch_spec("pause", {"suspend": True})
    jobs.wait_phase("pause", "Suspended", 120)
    wait_for(lambda: not jobs.pods("pause"), 120, "the trainer pod to go away while suspended")
    assert jobs.condition("pause", "Suspended")["status"] == "True"
    at_suspend = jobs.status("pause")["lastCheckpoint"]["step"]

    jobs.patch_spec("pause", {"suspend": False})
    _, _, status = watch_until_done(jobs, "pause")
    assert status["phase"] == "Succeeded"
    assert jobs.condition("pause", "Suspended")["status"] == "False"
    resumed = summary(training_volumes, "pause")["resumedFrom"]
    assert resumed is not None and resumed["step"] >= at_suspend
    assert summary(training_volumes, "pause")["finalStep"] == TRAINING["maxSteps"]
