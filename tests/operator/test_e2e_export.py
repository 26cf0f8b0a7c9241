"""End to end with the real trainer on the node agent's node: an output format that fails after
training (trainer_faults.EXPORT_FAIL) leaves the job Succeeded with its adapter and checkpoints and an
Exported=False condition naming the format and the cause; `ftjob export` then writes it from the
saved adapter in a Job of its own, on the CPU."""

import json
from pathlib import Path

import pytest
from kubernetes import client

from finetune_cli.export_job import LABEL_EXPORT_OF
from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import Jobs, OperatorProcess
from tests.support.specs import body
from tests.support.trainer_faults import EXPORT_FAIL
from tests.support.training import CHECKPOINTS, host_path, trainer_hooks, watch_until_done

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

TRAINING = {"maxSteps": 8, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64}
CAUSE = f"injected export failure ({EXPORT_FAIL})"


def test_a_failed_export_ends_succeeded_with_the_adapter_and_ftjob_export_writes_it_later(
    core: client.CoreV1Api, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    trainer_hooks(core, namespace, "exp", **{EXPORT_FAIL: "merged"})
    output = {"formats": ["merged"], "samples": {"count": 0}}
    jobs.create("exp", body(training=TRAINING, checkpoints=CHECKPOINTS, output=output))
    _, _, status = watch_until_done(jobs, "exp")
    assert status["phase"] == "Succeeded", status
    exported = jobs.condition("exp", "Exported")
    assert (exported["status"], exported["reason"], exported["message"]) == (
        "False",
        "ExportFailed",
        f"merged: {CAUSE}",
    )
    assert status["message"] == f"ExportFailed: merged: {CAUSE}"
    assert jobs.condition("exp", "Complete")["status"] == "True"
    adapter = host_path(training_volumes, status["output"]["adapterPath"])
    assert (adapter / "adapter_config.json").is_file()
    assert list((adapter.parent / "checkpoints").glob("checkpoint-*"))
    merged = host_path(training_volumes, status["output"]["mergedPath"])
    assert not merged.exists()
    warnings = [(e["type"], e["reason"]) for e in jobs.operator_events("exp")]
    assert warnings == [("Warning", "ExportFailed")]

    done = ftjob("export", "exp", "-n", namespace, "--timeout", "600", timeout=700)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exp: exported merged (job/exp-export; summary.json updated)"
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    summary = json.loads((adapter.parent / "summary.json").read_text())
    assert summary["exportFailures"] is None and summary["formats"]["merged"] == status["output"]["mergedPath"]
    # The export's pod is never the operator's: the job's status stays as its training left it.
    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_EXPORT_OF}=exp").items
    assert len(pods) == 1 and pods[0].status.phase == "Succeeded"
    assert jobs.status("exp")["phase"] == "Succeeded"
