"""What the pre-flight Job (builders/preflight.py) says of a job's inputs, read from the cluster.

Pure: the Job and its pods in, a verdict out. A failure is the trainer's own reason and message
(its termination message), with each in-pod path written as the claim and the path in it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from finetune_api.contract import on_claims, preflight_job_name
from finetune_api.spec import FineTuneJobSpec

from .status.observation import CHECKING_INPUTS
from .status.pods import failed_pods, pod_failure, terminated

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


def passed_message(pods: Sequence[Mapping[str, Any]]) -> str:
    """The termination message of the pod that passed (what it listed, or fetched)."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            ended = terminated(pod) or {}
            return str(ended.get("message") or "")
    return ""


def verdict(
    name: str,
    spec: FineTuneJobSpec,
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    doing: str = "",
    *,
    refusal: str | None = None,
) -> Verdict:
    """The pre-flight Job's verdict (or the fetch Job's, `doing` what it is doing); `pods` are its
    own (owned by it). A passed verdict's message is what its pod said. `refusal`: why the Job
    controller cannot create its pod (a ResourceQuota's words), said while it checks."""
    if _condition(job, "Complete") is not None:
        return Verdict("passed", message=passed_message(pods))
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed is None:
        waiting = f"; its pod cannot be created: {refusal}" if refusal else ""
        return Verdict("checking", CHECKING, (doing or checking_message(name)) + waiting)
    ended = failed_pods(pods)
    said = pod_failure(ended[-1]) if ended else None
    if said is not None and said.reason and said.reason != "OOMKilled":
        return Verdict("failed", said.reason, on_claims(said.message, spec))
    why = said.message if said is not None else str(failed.get("message") or failed.get("reason") or "failed")
    return Verdict("failed", PREFLIGHT_FAILED, f"the input check (Job {preflight_job_name(name)}) failed: {why}")
