"""What the pre-flight Job (builders/preflight.py) says of a job's inputs, read from the cluster.

Pure: the Job and its pods in, a verdict out. A failure is the trainer's own reason and message
(its termination message), with each in-pod path written as the claim and the path in it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from finetune_api.contract import on_claims, preflight_job_name
from finetune_api.spec import FineTuneJobSpec

from .status import CHECKING_INPUTS, failed_pods, pod_failure

# Reason and words of a job whose pre-flight Job is checking its inputs (phase Pending).
CHECKING = CHECKING_INPUTS
# Reason of a pre-flight Job that failed without the trainer saying why (deadline, eviction).
PREFLIGHT_FAILED = "PreflightFailed"

State = Literal["checking", "passed", "failed"]


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str = ""
    message: str = ""


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def checking_message(job: str) -> str:
    return f"checking inputs: Job {preflight_job_name(job)} looks for the model and dataset on their claims"


def verdict(name: str, spec: FineTuneJobSpec, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Verdict:
    """The pre-flight Job's verdict; `pods` are its own (owned by it)."""
    if _condition(job, "Complete") is not None:
        return Verdict("passed")
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed is None:
        return Verdict("checking", CHECKING, checking_message(name))
    ended = failed_pods(pods)
    said = pod_failure(ended[-1]) if ended else None
    if said is not None and said.reason and said.reason != "OOMKilled":
        return Verdict("failed", said.reason, on_claims(said.message, spec))
    why = said.message if said is not None else str(failed.get("message") or failed.get("reason") or "failed")
    return Verdict("failed", PREFLIGHT_FAILED, f"the input check (Job {preflight_job_name(name)}) failed: {why}")
