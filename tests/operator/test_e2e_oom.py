"""End to end, an out-of-GPU-memory failure through the operator, the real trainer on the CPU with
an injected OOM (trainer_faults.OOM_AT, put in the trainer pod by the node agent): one retry on a
tighter plan that resumes from the checkpoint and ends with the uninterrupted run's adapter, and
a second OOM that fails the job with the plan and the peak in its message."""

from pathlib import Path

import pytest
from kubernetes import client

from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import Jobs, OperatorProcess
from tests.support.specs import body
from tests.support.training import (
    ADAPTER_TOLERANCE,
    adapter_tensors,
    max_difference,
    summary,
    trainer_hooks,
    watch_until_done,
)

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

# No LoRA dropout and no checkpointing at batch 2 x 2: the retry's notch turns on the loss chunks
# and checkpointing and trains micro-batches of 1 x 4, none of which changes the math.
TRAINING = {
    "maxSteps": 12,
    "batchSize": 2,
    "gradientAccumulation": 2,
    "maxLength": 64,
    "learningRate": 3e-3,
    "gradientCheckpointing": False,
}
CHECKPOINTS = {"everySteps": 4, "keep": 2}
NOTCH = "loss chunks 512, micro-batch 1 x 4, eval micro-batch 1, gradient checkpointing on"


def test_an_oom_retries_once_on_a_tighter_plan_to_the_same_adapter_and_a_second_one_fails(
    core: client.CoreV1Api, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    trainer_hooks(core, namespace, "oom", FINETUNE_TEST_OOM_AT="7")
    trainer_hooks(core, namespace, "twice", FINETUNE_TEST_OOM_AT="7", FINETUNE_TEST_OOM_AGAIN_AT="10")
    spec = body(training=TRAINING, checkpoints=CHECKPOINTS, lora={"dropout": 0.0}, backoffLimit=0)
    for name in ("steady", "oom", "twice"):
        jobs.create(name, spec)
    final = {name: watch_until_done(jobs, name) for name in ("steady", "oom", "twice")}

    phases, _, status = final["oom"]
    assert "Failed" not in phases, phases
    assert status["phase"] == "Succeeded", status
    said = status["oomRetry"]["message"]
    assert said.startswith("OutOfMemory at step 7 (peak "), said
    assert "GiB of host memory" in said and said.endswith(f"retrying once with a tighter plan: {NOTCH}"), said
    # Not counted against backoffLimit (0 here), and said once.
    assert status["restarts"] == 0
    events = [e for e in jobs.events_with("oom", "OutOfMemoryRetry") if e["reason"] == "OutOfMemoryRetry"]
    assert [(e["type"], e["message"]) for e in events] == [("Warning", said)]
    assert sorted(p["status"]["phase"] for p in jobs.pods("oom")) == ["Failed", "Succeeded"]
    done = summary(training_volumes, "oom")
    assert done["resumedFrom"]["step"] == 4 and done["finalStep"] == TRAINING["maxSteps"]
    steady = adapter_tensors(training_volumes, final["steady"][2])
    assert max_difference(adapter_tensors(training_volumes, status), steady) <= ADAPTER_TOLERANCE
    shown = ftjob("status", "oom", "-n", namespace)
    assert shown.returncode == 0 and f"OOM retry:   {said}" in shown.stdout, shown.stdout

    _, _, status = final["twice"]
    assert status["phase"] == "Failed", status
    failed = jobs.condition("twice", "Failed")
    assert failed["reason"] == "OutOfMemory", failed
    assert failed["message"].startswith("at step 10 (peak "), failed
    assert f"again on the retry's tighter plan ({NOTCH})" in failed["message"], failed
    assert status["oomRetry"]["message"].startswith("OutOfMemory at step 7 ")
    assert jobs.events_with("twice", "OutOfMemoryRetry", "OutOfMemory")
    assert len(jobs.pods("twice")) == 2
