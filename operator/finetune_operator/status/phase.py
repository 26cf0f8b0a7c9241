"""The phase a job is in, its conditions and its message: `compute`, from one Observation.

The phase only moves forward while a Job lives: Pending (Queued, Admitted while Kueue holds it),
Running, then Succeeded or Failed; a job that ran stays Running between attempts. Suspended and
Preempted are said while the Job is suspended or Kueue stops its pod. The pieces come from the
other modules (pods, scheduling, queue); this one decides which of them the status says.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from finetune_api.contract import TERMINAL_PHASES
from finetune_api.multinode import several_nodes
from finetune_api.reasons import EXPORT_FAILED
from finetune_api.status import Phase

from ..guardrails import UNSCHEDULABLE
from ..workloads import Admission
from .conditions import Conditions, condition, ordered
from .events import Transition, transitions
from .observation import Observation
from .patch import owned_part
from .pods import export_failed, failed_attempts, job_condition, job_failure, oom_retry
from .queue import preemption_text, queue_conditions, queue_status
from .room import create_refusal, room_condition
from .scheduling import Verdict, active, gang_scheduling, scheduling, trainer_running

# The trainer exited 0 and the Job controller has yet to mark the Job Complete.
TRAINER_FINISHED = "TrainerFinished"


@dataclass
class Outcome:
    status: dict[str, Any]
    transitions: list[Transition] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase"))


def _suspended(
    obs: Observation, status: dict[str, Any], conds: Conditions, message: str | None
) -> tuple[Phase, str | None]:
    """A suspended Job: Queued while Kueue has not admitted it (in Kueue's words), else Suspended."""
    phase: Phase = "Queued" if obs.queued and not obs.suspend_requested else "Suspended"
    text = "waiting for the queue to admit the job" if phase == "Queued" else "suspended by spec.suspend"
    if phase == "Queued":
        # Kueue's own words: why the Workload waits (e.g. insufficient quota).
        text = status["queue"].get("message") or text
        message = text
    conds["Suspended"] = condition("Suspended", True, phase, text, obs)
    conds["Running"] = condition("Running", False, phase, text, obs)
    return phase, message


def _active_phase(
    obs: Observation,
    conds: Conditions,
    admission: Admission | None,
    trainer: tuple[bool, bool, str | None],
    *,
    message: str | None,
    restarts: int,
) -> Phase:
    """A Job neither finished nor suspended: Running, Admitted or Pending, and why no trainer runs
    (`trainer`: whether one runs, whether it has finished, why a gang's does not start yet)."""
    running, finishing, gathering = trainer
    phase: Phase = "Running" if running or finishing else "Pending"
    if phase == "Pending" and admission is not None and admission.admitted:
        phase = "Admitted"
    # A job that ran stays Running between attempts (a retry, or the moment between a
    # trainer's last exit and the Job's verdict): the phase only moves forward, and the
    # Running condition says that no trainer runs.
    between = phase != "Running" and obs.current.get("phase") == "Running"
    if between:
        phase = "Running"
    if "Suspended" in conds:
        conds["Suspended"] = condition("Suspended", False, "Resumed", "resumed", obs)
    if running:
        conds["Running"] = condition("Running", True, "TrainerRunning", "the trainer is running", obs)
    elif finishing:
        text = "the trainer finished; the Job is completing"
        conds["Running"] = condition("Running", True, TRAINER_FINISHED, text, obs)
    elif gathering is not None and message is None:
        conds["Running"] = condition("Running", False, "WaitingForNodes", gathering, obs)
    else:
        waiting = "waiting to retry" if restarts else "waiting for the trainer pod"
        reason = "Restarting" if between else "Pending"
        conds["Running"] = condition("Running", False, reason, message or waiting, obs)
    return phase


def _refused(obs: Observation, status: dict[str, Any], conds: Conditions) -> Outcome:
    """A refused spec, or a job the cluster cannot schedule (valid, but it ends Failed too)."""
    assert obs.invalid is not None
    if obs.invalid_reason == UNSCHEDULABLE:  # the cluster's doing, not the spec's
        conds["Validated"] = condition("Validated", True, "Valid", "spec is valid", obs)
    else:
        conds["Validated"] = condition("Validated", False, obs.invalid_reason, obs.invalid, obs)
    conds["Failed"] = condition("Failed", True, obs.invalid_reason, obs.invalid, obs)
    status.update(phase="Failed", message=obs.invalid)
    return _finish(obs, status, conds)


def _valid(obs: Observation, status: dict[str, Any], conds: Conditions) -> None:
    conds["Validated"] = condition("Validated", True, "Valid", "spec is valid", obs)
    if obs.output:
        status["output"] = dict(obs.output)
    # Said once the fetch Job passed, and kept after its pod is gone.
    inputs = obs.inputs if obs.inputs is not None else obs.current.get("inputs")
    if inputs:
        status["inputs"] = [dict(i) for i in inputs]


def _without_job(obs: Observation, status: dict[str, Any], conds: Conditions, unplaceable: str | None) -> Outcome:
    """The status before a Job exists or after it is gone: a terminal job keeps its verdict, any
    other is Pending, its inputs perhaps being checked (`unplaceable`: no node can ever hold it)."""
    current = obs.current
    # Terminal jobs keep their verdict after the Job is gone (ttlSecondsAfterFinished).
    if current.get("phase") in TERMINAL_PHASES:
        kept = {k: v for k, v in owned_part(current).items() if k != "conditions"}
        return _finish(obs, {**kept, **status}, conds)
    status["phase"] = "Pending"
    if obs.checking:
        conds["Running"] = condition("Running", False, obs.checking_reason, obs.checking, obs)
        status["message"] = obs.checking
    if unplaceable:
        status["message"] = unplaceable
    return _finish(obs, status, conds)


def compute(obs: Observation) -> Outcome:
    """The status the job should have now, and the Events its changes deserve."""
    current = obs.current
    conds: Conditions = {c["type"]: dict(c) for c in current.get("conditions") or [] if "type" in c}
    status: dict[str, Any] = {"observedGeneration": obs.generation}
    message: str | None = None
    if obs.invalid is not None:
        return _refused(obs, status, conds)
    _valid(obs, status, conds)
    unplaceable = room_condition(obs, conds)
    if (job := obs.job) is None:
        return _without_job(obs, status, conds, unplaceable)
    job_status = job.get("status") or {}
    failures = failed_attempts(job)
    start = job_status.get("startTime") or current.get("startTime")
    if start:
        status["startTime"] = start
    complete = job_condition(job, "Complete")
    failed = job_condition(job, "Failed") or job_condition(job, "FailureTarget")
    suspended = bool((job.get("spec") or {}).get("suspend"))
    gang = several_nodes(obs.nodes)
    schedule = _placement(obs, gang)
    running, gathering = trainer_running(obs, status, gang)
    # The trainer exited 0 and the Job controller has not marked the Job Complete yet (seconds,
    # more under load): still Running, not back to Pending and forward again.
    finishing = any((p.get("status") or {}).get("phase") == "Succeeded" for p in obs.pods)
    # A restart is a failed attempt that was followed by another one; the failure that ends
    # a Failed job is not a restart.
    if gang:
        failures = -(-failures // obs.nodes)  # one gang attempt fails a pod per node, or fewer
    restarts = max(failures - 1, 0) if failed is not None else failures
    status["restarts"] = restarts
    retried = oom_retry(obs.pods, current)
    if retried is not None:
        status["oomRetry"] = retried

    admission = obs.admission if obs.queued else None
    if obs.queued:
        status["queue"] = queue_status(obs)
        queue_conditions(obs, conds)
    if schedule is not None:
        ok, reason, text = schedule
        conds["Scheduled"] = condition("Scheduled", ok, reason, text, obs)
        if not ok:
            message = f"{reason}: {text}" if gang else text

    phase: Phase
    if complete is not None:
        phase = "Succeeded"
        status["completionTime"] = job_status.get("completionTime") or complete.get("lastTransitionTime") or obs.now
        message = _succeeded(obs, conds)
    elif failed is not None:
        phase = "Failed"
        reason, text = job_failure(job, failed, obs.pods)
        status["completionTime"] = failed.get("lastTransitionTime") or obs.now
        conds["Failed"] = condition("Failed", True, reason, text, obs)
        conds["Running"] = condition("Running", False, reason, text, obs)
        message = f"{reason}: {text}" if text else reason
    elif admission is not None and admission.evicted and admission.preemption is not None and active(obs.pods):
        # Kueue evicted the job: its pod is stopping (SIGTERM, then the grace period).
        phase = "Preempted"
        message = preemption_text(admission, obs.preemptor)
        conds["Running"] = condition("Running", False, "Preempted", message, obs)
        if suspended:
            conds["Suspended"] = condition("Suspended", True, "Preempted", message, obs)
    elif suspended:
        phase, message = _suspended(obs, status, conds, message)
    else:
        phase = _active_phase(
            obs, conds, admission, (running, finishing, gathering), message=message, restarts=restarts
        )
    status["phase"] = phase
    if unplaceable and phase not in TERMINAL_PHASES:
        message = unplaceable
    if retried is not None and message is None and phase == "Running":
        # Said while the retry runs (a Pending job's message is the scheduler's: an Event each).
        message = str(retried.get("message") or "")
    if message:
        status["message"] = message
    return _finish(obs, status, conds)


def _placement(obs: Observation, gang: bool) -> Verdict:
    """Whether the pods are placed, in the scheduler's words; with no pod at all, why the Job
    controller could not create one (a ResourceQuota's words), where it said so."""
    schedule = gang_scheduling(obs.pods, obs.nodes) if gang else scheduling(obs.pods)
    return schedule if schedule is not None or obs.refusal is None else create_refusal(obs.refusal)


def _succeeded(obs: Observation, conds: Conditions) -> str | None:
    """A Job that completed: its conditions, and the message when a format was not written."""
    conds["Complete"] = condition("Complete", True, "Succeeded", "training finished", obs)
    conds["Running"] = condition("Running", False, "Succeeded", "training finished", obs)
    unwritten = export_failed(obs.pods)
    if unwritten is None:
        return None
    conds["Exported"] = condition("Exported", False, EXPORT_FAILED, unwritten, obs)
    return f"{EXPORT_FAILED}: {unwritten}"


def _finish(obs: Observation, status: dict[str, Any], conds: Conditions) -> Outcome:
    status["conditions"] = ordered(conds)
    return Outcome(status=status, transitions=transitions(obs.current, status))


def hand_over(status: Mapping[str, Any]) -> bool:
    """Whether the job waits on the Job controller alone, for a step already decided: its pod
    (made, then placed or refused by the scheduler), or, the trainer having exited 0, its verdict.
    Each takes a second on a quiet control plane, and a minute behind a burst of 500 (measured:
    pods made 35 s after their Job, Jobs marked Complete 70 s after their pod, at the median).
    runtime/coalesce.py lets such a state wait the longest before it is written: a job whose pod
    comes, or whose Job completes, within that wait costs no write for it."""
    running: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Running"), {})
    if status.get("phase") == "Running":
        return running.get("reason") == TRAINER_FINISHED
    first_pod = not status.get("restarts") and not status.get("message")  # a retry's Warning goes in its window
    waiting = status.get("phase") == "Pending" and running.get("reason") == "Pending" and first_pod
    return waiting and not any(c.get("type") == "Scheduled" for c in status.get("conditions") or [])
