"""End to end: a job deleted and re-created under the same name meets the checkpoints the first
one left in its output folder. Another `lora.r` fails at once, with no retry; `onExisting: fresh`
trains from step 0 and keeps the old folder; the same spec resumes."""

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import body
from tests.support.training import CHECKPOINTS, summary, watch_until_done

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

TRAINING = {"maxSteps": 16, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3}
NAME = "again"


def gone(batch: client.BatchV1Api, namespace: str) -> bool:
    try:
        batch.read_namespaced_job(NAME, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def recreate(jobs: Jobs, namespace: str, **extra: Any) -> dict:
    """Delete the job (when there is one) and its children, create it again, run it to the end."""
    if jobs.get(NAME) is not None:
        jobs.delete(NAME)
        wait_for(lambda: jobs.get(NAME) is None, 60, "the FineTuneJob to go")
        wait_for(lambda: gone(jobs.batch, namespace), 60, "the Job to be collected")
        wait_for(lambda: not jobs.pods(NAME), 90, "the pods to be collected")
    jobs.create(NAME, body(training=TRAINING, checkpoints=CHECKPOINTS, backoffLimit=3, **extra))
    return watch_until_done(jobs, NAME)[2]


def test_a_recreated_job_resumes_only_what_matches(
    namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    folder = training_volumes["outputs"] / NAME
    first = recreate(jobs, namespace, lora={"r": 16})
    assert first["phase"] == "Succeeded", first
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["checkpoint-16", "checkpoint-8"]

    # Another lora.r: fails before any weight loads, not retried, the fields and ways out named.
    mismatch = recreate(jobs, namespace, lora={"r": 8})
    failed = jobs.condition(NAME, "Failed")
    assert mismatch["phase"] == "Failed", mismatch
    assert failed["reason"] == "CheckpointMismatch", failed
    assert "spec.lora.r: checkpoint 16, job 8" in failed["message"], failed
    assert "spec.output.onExisting: fresh" in failed["message"]
    assert "\n" not in failed["message"] and "Traceback" not in failed["message"]
    assert mismatch["restarts"] == 0
    assert len(jobs.pods(NAME)) == 1, "a checkpoint mismatch must not be retried"
    shown = ftjob("status", NAME, "-n", namespace)
    assert "CheckpointMismatch" in shown.stdout and "spec.lora.r: checkpoint 16, job 8" in shown.stdout, shown.stdout

    # onExisting: fresh moves the old run aside and trains from step 0.
    fresh = recreate(jobs, namespace, lora={"r": 8}, output={"pvc": {"claimName": "outputs"}, "onExisting": "fresh"})
    assert fresh["phase"] == "Succeeded", fresh
    assert summary(training_volumes, NAME)["resumedFrom"] is None
    previous = [p for p in folder.iterdir() if p.name.startswith("previous-")]
    assert len(previous) == 1, sorted(p.name for p in folder.iterdir())
    assert (previous[0] / "checkpoints" / "checkpoint-16").is_dir()
    assert (previous[0] / "summary.json").is_file()

    # The same spec again: the checkpoints match, so it resumes as before.
    same = recreate(jobs, namespace, lora={"r": 8})
    assert same["phase"] == "Succeeded", same
    resumed = summary(training_volumes, NAME)["resumedFrom"]
    assert resumed is not None and resumed["step"] == TRAINING["maxSteps"], resumed
    assert same["restarts"] == 0
