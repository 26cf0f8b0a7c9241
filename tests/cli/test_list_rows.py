"""`ftjob list` rows, from FineTuneJobs as the API server returns them (no cluster needed)."""

from typing import Any

from finetune_cli.jobs import _row


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "tiny", "namespace": "team-a"}, "spec": {"resources": {"gpus": 2}}, "status": status}


def test_a_failed_job_shows_its_reason_and_a_loss_has_four_significant_digits() -> None:
    failed = {
        "phase": "Failed",
        "progress": {"step": 4, "totalSteps": 30, "loss": 2.718281828459045},
        "conditions": [{"type": "Failed", "status": "True", "reason": "Unschedulable", "message": "no node has ..."}],
    }
    name, phase, step, loss, gpus, _age, reason = _row(job(failed), with_namespace=False)
    assert (name, phase, step, loss, gpus, reason) == ("tiny", "Failed", "4/30", "2.718", "2", "Unschedulable")
    assert _row(job({"phase": "Running"}), with_namespace=True)[-1] == ""
    assert _row(job({"phase": "Failed"}), with_namespace=False)[-1] == "Failed"  # no condition recorded
