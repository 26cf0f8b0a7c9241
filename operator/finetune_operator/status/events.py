"""The Events a status change deserves: trouble only, each a Warning, posted once.

Computed from the status before and after a write, so a reconcile that writes nothing new
posts nothing, and one that missed a moment (coalesced writes) still posts what it changed.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from finetune_api.contract import TERMINAL_PHASES
from finetune_api.reasons import EXPORT_FAILED

from .observation import SERVICE_MISSING
from .pods import RETRIED_OOM
from .room import SCHEDULABLE


@dataclass(frozen=True)
class Transition:
    type: str  # Normal or Warning
    reason: str
    message: str


def transitions(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Transition]:
    """The Events a status change deserves: trouble only, each a Warning.

    The status keeps what every job passes through: its phase, each condition with the moment it
    flipped (Scheduled, Running, Complete), startTime and completionTime, Kueue's words, the
    input check's and the scheduler's messages. An Event that repeats the status write of the
    same moment costs a request per job and says nothing `kubectl describe` does not already
    show above its Events, so a job that runs well posts none (at fleet scale that was 2.7
    Events a job, a third of the operator's requests). What the status would overwrite, or a
    user must act on, stays an Event: each failed attempt (Restarted), the GPU-memory retry,
    each preemption, a job no node of its product can ever hold (Schedulable=False, room.py), a
    Service its trainer calls that is missing (ServiceMissing) and the failure that ends the job.
    A pod waiting for a node is said by the status (phase Pending, the message and
    Scheduled=False, in the scheduler's words) and by the scheduler's own FailedScheduling
    Warning on the pod; when the wait turns into a failure (the pending timeout), the Failed
    Warning says it.
    """
    out: list[Transition] = []
    old_restarts = int(before.get("restarts") or 0)
    new_restarts = int(after.get("restarts") or 0)
    if new_restarts > old_restarts and after.get("phase") not in TERMINAL_PHASES:
        out.append(
            Transition(
                "Warning", "Restarted", f"attempt {new_restarts} failed; the next one resumes from the last checkpoint"
            )
        )
    retried = after.get("oomRetry")
    if retried and not before.get("oomRetry"):
        out.append(Transition("Warning", RETRIED_OOM, str(retried.get("message") or "out of GPU memory; retrying")))
    old_queue, new_queue = before.get("queue") or {}, after.get("queue") or {}
    if int(new_queue.get("preemptions") or 0) > int(old_queue.get("preemptions") or 0):
        # One Event per preemption, whether or not a reconcile saw the pod stopping.
        last = new_queue.get("lastPreemption") or {}
        said = str(last.get("message") or "preempted by Kueue")
        out.append(
            Transition("Warning", "Preempted", f"by FineTuneJob {last['by']}: {said}" if last.get("by") else said)
        )
    unplaceable = _condition(after, SCHEDULABLE, "False")
    if unplaceable is not None and _condition(before, SCHEDULABLE, "False") is None:
        # No node of the product can ever hold the job: the one thing here a user must act on.
        out.append(Transition("Warning", str(unplaceable["reason"]), str(unplaceable["message"])))
    waiting = _waiting_for_a_service(after)
    if waiting is not None and _waiting_for_a_service(before) is None:
        # A Service the job's trainer calls is missing: the user must make it (or fix the URL).
        out.append(Transition("Warning", SERVICE_MISSING, str(waiting.get("message") or SERVICE_MISSING)))
    if _export_failed(after) and not _export_failed(before):
        out.append(Transition("Warning", EXPORT_FAILED, str(after.get("message") or EXPORT_FAILED)))
    if after.get("phase") == "Failed" and before.get("phase") != "Failed":
        failed = next(
            (c for c in after.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"), None
        )
        if failed is not None:
            out.append(Transition("Warning", str(failed["reason"]), str(failed["message"]) or "the job failed"))
    return out


def _condition(status: Mapping[str, Any], kind: str, state: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == state), None)


def _waiting_for_a_service(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    running = _condition(status, "Running", "False")
    return running if running is not None and running.get("reason") == SERVICE_MISSING else None


def _export_failed(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Exported" and c.get("status") == "False" for c in status.get("conditions") or [])
