"""How the Job's pods ended: why one failed, the attempts the Job counted, and what they tell the status.

The trainer says why it stopped in its termination message (finetune_api.reasons); where it
left none, its exit code or the kubelet (OOMKilled) says it. A Job that failed takes the
trainer's reason of its last failed pod, or the Job controller's own (DeadlineExceeded,
BackoffLimitExceeded).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from finetune_api.contract import CONTAINER
from finetune_api.reasons import (
    ExitReason,
    export_failure,
    parse_termination_message,
    reason_for_exit_code,
)

# The trainer's exit after its first OOM: the Job retries it with a tighter plan.
RETRIED_OOM = ExitReason.OutOfMemoryRetry.name


def job_condition(job: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    """The Job's condition of this type, when it is True."""
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def pod_condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The trainer container's end, now or in its last run."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            state = cs.get("state") or {}
            last = cs.get("lastState") or {}
            found = state.get("terminated") or last.get("terminated")
            return dict(found) if found else None
    return None


def created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def failed_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Failed"), key=created)


@dataclass(frozen=True)
class PodFailure:
    reason: str | None  # the trainer's ExitReason name, or OOMKilled, or None
    message: str


def pod_failure(pod: Mapping[str, Any]) -> PodFailure:
    """Why one pod failed, in the trainer's own words when it left any."""
    term = terminated(pod)
    if term is None:
        status = pod.get("status") or {}
        return PodFailure(status.get("reason"), str(status.get("message") or "pod failed"))
    reason, message = parse_termination_message(term.get("message"))
    if term.get("reason") == "OOMKilled":
        return PodFailure("OOMKilled", message or "the trainer ran out of memory (OOMKilled)")
    if reason is None:
        reason = reason_for_exit_code(int(term.get("exitCode") or 0))
    if not message:
        message = f"trainer exited with code {term.get('exitCode')}"
    return PodFailure(reason, message)


def failed_attempts(job: Mapping[str, Any]) -> int:
    """Pod failures the Job counted. One that gave up on its backoffLimit counted exactly the limit
    plus one, even while its `status.failed` still lags the last pod (FailureTarget set, the pod
    terminating): so `ftjob watch`, which stops at the first Failed status, and `ftjob status`
    later give the same count."""
    failed = int((job.get("status") or {}).get("failed") or 0)
    limit = (job.get("spec") or {}).get("backoffLimit")
    gave_up = any(
        c.get("type") in ("Failed", "FailureTarget") and c.get("reason") == "BackoffLimitExceeded"
        for c in (job.get("status") or {}).get("conditions") or []
    )
    return max(failed, int(limit) + 1) if gave_up and isinstance(limit, int) else failed


def job_failure(job: Mapping[str, Any], cond: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The reason and message of a Job that failed (`cond`: its Failed or FailureTarget condition)."""
    job_reason = str(cond.get("reason") or "Failed")
    job_message = str(cond.get("message") or "")
    failed = failed_pods(pods)
    last = pod_failure(failed[-1]) if failed else None
    if job_reason == "DeadlineExceeded":
        return "DeadlineExceeded", job_message or "the job ran past activeDeadlineSeconds"
    if job_reason == "PodFailurePolicy":
        if last is not None and last.reason:
            return last.reason, last.message
        return "PodFailurePolicy", job_message
    if job_reason == "BackoffLimitExceeded":
        attempts = failed_attempts(job) or len(failed)
        if last is not None and last.reason == "OOMKilled":
            return "OOMKilled", f"{attempts} attempt(s) failed; last: {last.message}"
        detail = f"; last: {last.reason + ': ' if last.reason else ''}{last.message}" if last else ""
        return "BackoffLimitExceeded", f"{attempts} attempt(s) failed{detail}"
    return job_reason, job_message


def export_failed(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The formats a trainer that ended well could not write, in its words (`gguf: <cause>`)."""
    for pod in reversed(sorted(pods, key=created)):
        term = terminated(pod) if (pod.get("status") or {}).get("phase") == "Succeeded" else None
        said = export_failure(term.get("message")) if term else None
        if said:
            return said
    return None


def oom_retry(pods: Sequence[Mapping[str, Any]], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The attempt that ran out of GPU memory and was retried (once per job), as status.oomRetry;
    the recorded one when its pod is gone."""
    for pod in reversed(failed_pods(pods)):
        failure = pod_failure(pod)
        if failure.reason == RETRIED_OOM:
            return {"pod": (pod.get("metadata") or {}).get("name"), "message": failure.message}
    kept = current.get("oomRetry")
    return dict(kept) if kept else None
