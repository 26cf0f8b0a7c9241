"""What the FineTuneJob's status should say, computed purely from what the cluster shows.

Input: the job's spec (or why it is invalid), its batch Job, the Job's pods and the status as
it is now. Output: the operator's fields of the status (never `progress` or
`lastCheckpoint`, which belong to the trainer) and the transitions worth an Event (trouble
only: `transitions`).

Rules that users rely on:
- A job that trained but could not write a format of spec.output.formats (the trainer exits 0
  saying `ExportFailed: <format>: <cause>`) is Succeeded, with Exported=False (ExportFailed)
  naming the format and the cause, the message saying it and one Warning.
- Failed only when the Job itself has failed: a pod failure while the Job still has retries
  is a restart (counted in `restarts`), not a failure.
- The Failed reason is the trainer's own (from its termination message or exit code), or
  OOMKilled, DeadlineExceeded, BackoffLimitExceeded.
- Scheduled=False carries the scheduler's message.
- A job of several nodes (`nodes` > 1) is one gang: `status.nodes` counts its running pods; it is
  Running only when every pod runs (until then each launcher waits at the rendezvous and no
  trainer starts); a pod the scheduler cannot place is named with how many of the gang wait,
  e.g. `Unschedulable: 1 of 2 pods pending: 0/5 nodes are available: ...`; `restarts` counts
  gang attempts (failed pods over nodes, rounded up: one failed pod fails its peers' collectives).
- An attempt that ran out of GPU memory the first time (the trainer's OutOfMemoryRetry) is
  followed by one on a tighter plan: `status.oomRetry` keeps what the trainer said (where, the
  peak against the plan, the tighter plan), one Event says it, and the message says it while
  the retry runs. A second OOM fails the job with the trainer's OutOfMemory.
- A queued job (spec.placement.queueName) says what Kueue says, in Kueue's words: Queued with
  its reason and message while the Workload waits, Admitted, Preempted (by whom, when the
  preemptor is a job the operator knows) while the evicted pod stops, then Queued again.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from finetune_api.contract import CONTAINER, TERMINAL_PHASES
from finetune_api.multinode import several_nodes
from finetune_api.reasons import (
    EXPORT_FAILED,
    ExitReason,
    export_failure,
    parse_termination_message,
    reason_for_exit_code,
)
from finetune_api.status import Condition, ConditionType, Phase, operator_fields

from .guardrails import UNSCHEDULABLE
from .workloads import Admission

# The fields this module owns (the status model's, less the trainer's); a status patch never
# touches any other.
OWNED_FIELDS = operator_fields()
# Reasons the operator itself gives for a job that never gets a Job (the trainer's own are
# finetune_api.reasons.ExitReason): a spec the models or the API server refuse, and an image
# outside the platform's allow-list (images.py).
INVALID = "Invalid"
IMAGE_NOT_ALLOWED = "ImageNotAllowed"
# A FineTuneJob in a namespace the operator never writes in (Settings.excluded_namespaces).
NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
WONT_FIT = ExitReason.WontFit.name  # the trainer's reason, here decided before any pod: host memory
# A job above the platform's limits per job (guardrails.py).
EXCEEDS_LIMIT = "ExceedsLimit"
# Failures decided before any Job exists.
REFUSALS = frozenset({NAMESPACE_NOT_ALLOWED, IMAGE_NOT_ALLOWED, WONT_FIT, EXCEEDS_LIMIT})
# Conditions in the order the API lists their types.
CONDITION_ORDER: tuple[str, ...] = get_args(ConditionType)
# Before Kueue has made the job's Workload (or where Kueue does not run at all).
NO_WORKLOAD = "NoWorkload"
NO_WORKLOAD_MESSAGE = "waiting for Kueue to make the job's Workload (is Kueue managing batch/v1 Jobs?)"
# A job whose pre-flight Job checks its inputs (preflight.py): Pending, saying so.
CHECKING_INPUTS = "CheckingInputs"
# The trainer's exit after its first OOM: the Job retries it with a tighter plan.
RETRIED_OOM = ExitReason.OutOfMemoryRetry.name
# The trainer exited 0 and the Job controller has yet to mark the Job Complete.
TRAINER_FINISHED = "TrainerFinished"


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile saw, as plain API dicts (camelCase, as on the wire)."""

    generation: int
    now: str
    current: Mapping[str, Any]
    invalid: str | None = None
    invalid_reason: str = INVALID
    job: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    output: Mapping[str, Any] | None = None
    suspend_requested: bool = False
    queued: bool = False
    queue_name: str | None = None
    # Kueue's Workload of the Job, read (workloads.py); None before Kueue made one.
    admission: Admission | None = None
    # The preempting FineTuneJob (namespace/name), when the preemptor's Job is one of ours.
    preemptor: str | None = None
    # spec.resources.nodes: the pods of one attempt (an Indexed Job when more than one).
    nodes: int = 1
    # What the pre-flight Job is doing while it checks the inputs, before the Job exists.
    checking: str | None = None


@dataclass(frozen=True)
class Transition:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    transitions: list[Transition] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase"))


def owned_part(status: Mapping[str, Any] | None) -> dict[str, Any]:
    status = status or {}
    return {k: status[k] for k in OWNED_FIELDS if status.get(k) is not None}


# --- reading Jobs and pods -----------------------------------------------------------------


def _job_condition(job: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _pod_condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            state = cs.get("state") or {}
            last = cs.get("lastState") or {}
            found = state.get("terminated") or last.get("terminated")
            return dict(found) if found else None
    return None


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def failed_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Failed"), key=_created)


@dataclass(frozen=True)
class PodFailure:
    reason: str | None  # the trainer's ExitReason name, or OOMKilled, or None
    message: str


def pod_failure(pod: Mapping[str, Any]) -> PodFailure:
    """Why one pod failed, in the trainer's own words when it left any."""
    term = _terminated(pod)
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


def _failure(job: Mapping[str, Any], cond: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
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
    for pod in reversed(sorted(pods, key=_created)):
        term = _terminated(pod) if (pod.get("status") or {}).get("phase") == "Succeeded" else None
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


# --- conditions ----------------------------------------------------------------------------


def _condition(kind: ConditionType, ok: bool | None, reason: str, message: str, obs: Observation) -> dict[str, Any]:
    """One of the API's Conditions, as on the wire (built unvalidated: the CRD bounds it)."""
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else "True" if ok else "False"
    previous = next((c for c in obs.current.get("conditions") or [] if c.get("type") == kind), None)
    # lastTransitionTime moves only when the status flips.
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else obs.now
    condition = Condition.model_construct(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=obs.generation,
    )
    return condition.model_dump(by_alias=True)


def _scheduling(pods: Sequence[Mapping[str, Any]]) -> tuple[bool, str, str] | None:
    active = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    if not active:
        # Ended pods were placed too: a status first written after its pod ended (writes are
        # coalesced) says Scheduled as one written while it ran did.
        placed = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        if not placed:
            return None
        pod = max(placed, key=_created)
        return True, "Scheduled", f"pod {pod['metadata']['name']} is on node {pod['spec']['nodeName']}"
    pod = max(active, key=_created)
    cond = _pod_condition(pod, "PodScheduled")
    node = (pod.get("spec") or {}).get("nodeName")
    if node or (cond and cond.get("status") == "True"):
        return True, "Scheduled", f"pod {pod['metadata']['name']} is on node {node}"
    if cond and cond.get("status") == "False":
        return False, str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "")
    return None


def _live(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods of the current attempt: Pending or Running, their trainer not ended."""
    return [
        p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running") and _terminated(p) is None
    ]


def _gang_scheduling(pods: Sequence[Mapping[str, Any]], nodes: int) -> tuple[bool, str, str] | None:
    """A gang is scheduled when every pod of the attempt is; else the first refusal, with a count."""
    live = _live(pods)
    if not live:
        return None
    waiting = [p for p in live if (_pod_condition(p, "PodScheduled") or {}).get("status") == "False"]
    if waiting:
        cond = _pod_condition(min(waiting, key=_created), "PodScheduled") or {}
        reason = str(cond.get("reason") or "Unschedulable")
        said = str(cond.get("message") or "no node fits the pod")
        return False, reason, f"{len(waiting)} of {nodes} pods pending: {said}"
    placed = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if len(placed) < nodes:
        return None
    where = ", ".join(sorted(str(p["spec"]["nodeName"]) for p in placed))
    return True, "Scheduled", f"{len(placed)} of {nodes} pods are on nodes {where}"


def gang_running(pods: Sequence[Mapping[str, Any]]) -> int:
    """Pods of the current attempt whose container runs (the launcher; the trainer once all do)."""
    return sum(1 for p in _live(pods) if (p.get("status") or {}).get("phase") == "Running")


def _active(pods: Sequence[Mapping[str, Any]]) -> bool:
    return any((p.get("status") or {}).get("phase") in ("Pending", "Running") for p in pods)


def _preemption_text(admission: Admission, preemptor: str | None) -> str:
    assert admission.preemption is not None
    said = admission.preemption.message or "preempted by Kueue"
    return f"preempted by FineTuneJob {preemptor}: {said}" if preemptor else said


def queue_status(obs: Observation) -> dict[str, Any]:
    """status.queue: the LocalQueue, the Workload and Kueue's verdict; preemptions are counted
    once each (by the time of Kueue's Preempted condition), so a repeated reconcile adds none."""
    before = dict(obs.current.get("queue") or {})
    out: dict[str, Any] = {"name": obs.queue_name}
    count = int(before.get("preemptions") or 0)
    last = before.get("lastPreemption")
    admission = obs.admission
    if admission is None:
        out.update(admitted=False, reason=NO_WORKLOAD, message=NO_WORKLOAD_MESSAGE)
    else:
        out.update(workload=admission.workload, admitted=admission.admitted, reason=admission.reason)
        out["message"] = admission.message
        if admission.cluster_queue and admission.admitted:
            out["clusterQueue"] = admission.cluster_queue
        preemption = admission.preemption
        if preemption is not None and (last or {}).get("time") != preemption.time:
            count += 1
            last = {"time": preemption.time, "reason": preemption.reason, "message": preemption.message}
            if obs.preemptor:
                last["by"] = obs.preemptor
    if count:
        out["preemptions"] = count
    if last:
        out["lastPreemption"] = last
    return {k: v for k, v in out.items() if v is not None}


def _queue_conditions(obs: Observation, conds: dict[str, dict[str, Any]]) -> None:
    admission = obs.admission
    if admission is None:
        conds["Admitted"] = _condition("Admitted", False, NO_WORKLOAD, NO_WORKLOAD_MESSAGE, obs)
        return
    conds["Admitted"] = _condition("Admitted", admission.admitted, admission.reason, admission.message, obs)
    if admission.preemption is not None:
        text = _preemption_text(admission, obs.preemptor)
        conds["Preempted"] = _condition("Preempted", True, admission.preemption.reason, text, obs)
    elif admission.admitted and conds.get("Preempted", {}).get("status") == "True":
        conds["Preempted"] = _condition("Preempted", False, "Readmitted", "admitted again after a preemption", obs)


def _trainer_running(obs: Observation, status: dict[str, Any], gang: bool) -> tuple[bool, str | None]:
    """Whether a trainer runs, and for a gang not whole yet why none does (its launchers wait at
    the rendezvous); a gang's status counts its pods running."""
    running = any((p.get("status") or {}).get("phase") == "Running" for p in obs.pods if _terminated(p) is None)
    if not gang:
        return running, None
    ready = gang_running(obs.pods)
    status["nodes"] = {"ready": ready, "total": obs.nodes}
    if running and ready < obs.nodes:
        return False, (
            f"{ready} of {obs.nodes} pods running: their launchers wait at the rendezvous "
            "and no trainer starts until every pod of the gang runs"
        )
    return running, None


def _suspended(
    obs: Observation, status: dict[str, Any], conds: dict[str, dict[str, Any]], message: str | None
) -> tuple[Phase, str | None]:
    """A suspended Job: Queued while Kueue has not admitted it (in Kueue's words), else Suspended."""
    phase: Phase = "Queued" if obs.queued and not obs.suspend_requested else "Suspended"
    text = "waiting for the queue to admit the job" if phase == "Queued" else "suspended by spec.suspend"
    if phase == "Queued":
        # Kueue's own words: why the Workload waits (e.g. insufficient quota).
        text = status["queue"].get("message") or text
        message = text
    conds["Suspended"] = _condition("Suspended", True, phase, text, obs)
    conds["Running"] = _condition("Running", False, phase, text, obs)
    return phase, message


def _active_phase(
    obs: Observation,
    conds: dict[str, dict[str, Any]],
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
        conds["Suspended"] = _condition("Suspended", False, "Resumed", "resumed", obs)
    if running:
        conds["Running"] = _condition("Running", True, "TrainerRunning", "the trainer is running", obs)
    elif finishing:
        text = "the trainer finished; the Job is completing"
        conds["Running"] = _condition("Running", True, TRAINER_FINISHED, text, obs)
    elif gathering is not None and message is None:
        conds["Running"] = _condition("Running", False, "WaitingForNodes", gathering, obs)
    else:
        waiting = "waiting to retry" if restarts else "waiting for the trainer pod"
        reason = "Restarting" if between else "Pending"
        conds["Running"] = _condition("Running", False, reason, message or waiting, obs)
    return phase


def _refused(obs: Observation, status: dict[str, Any], conds: dict[str, dict[str, Any]]) -> Outcome:
    """A refused spec, or a job the cluster cannot schedule (valid, but it ends Failed too)."""
    assert obs.invalid is not None
    if obs.invalid_reason == UNSCHEDULABLE:  # the cluster's doing, not the spec's
        conds["Validated"] = _condition("Validated", True, "Valid", "spec is valid", obs)
    else:
        conds["Validated"] = _condition("Validated", False, obs.invalid_reason, obs.invalid, obs)
    conds["Failed"] = _condition("Failed", True, obs.invalid_reason, obs.invalid, obs)
    status.update(phase="Failed", message=obs.invalid)
    return _finish(obs, status, conds)


def _valid(obs: Observation, status: dict[str, Any], conds: dict[str, dict[str, Any]]) -> None:
    conds["Validated"] = _condition("Validated", True, "Valid", "spec is valid", obs)
    if obs.output:
        status["output"] = dict(obs.output)


def _without_job(obs: Observation, status: dict[str, Any], conds: dict[str, dict[str, Any]]) -> Outcome:
    """The status before a Job exists or after it is gone: a terminal job keeps its verdict, any
    other is Pending, its inputs perhaps being checked."""
    current = obs.current
    # Terminal jobs keep their verdict after the Job is gone (ttlSecondsAfterFinished).
    if current.get("phase") in TERMINAL_PHASES:
        kept = {k: v for k, v in owned_part(current).items() if k != "conditions"}
        return _finish(obs, {**kept, **status}, conds)
    status["phase"] = "Pending"
    if obs.checking:
        conds["Running"] = _condition("Running", False, CHECKING_INPUTS, obs.checking, obs)
        status["message"] = obs.checking
    return _finish(obs, status, conds)


def compute(obs: Observation) -> Outcome:
    """The status the job should have now, and the Events its changes deserve."""
    current = obs.current
    conds: dict[str, dict[str, Any]] = {c["type"]: dict(c) for c in current.get("conditions") or [] if "type" in c}
    status: dict[str, Any] = {"observedGeneration": obs.generation}
    message: str | None = None
    if obs.invalid is not None:
        return _refused(obs, status, conds)
    _valid(obs, status, conds)
    if (job := obs.job) is None:
        return _without_job(obs, status, conds)
    job_status = job.get("status") or {}
    failures = failed_attempts(job)
    start = job_status.get("startTime") or current.get("startTime")
    if start:
        status["startTime"] = start
    complete = _job_condition(job, "Complete")
    failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    suspended = bool((job.get("spec") or {}).get("suspend"))
    gang = several_nodes(obs.nodes)
    schedule = _gang_scheduling(obs.pods, obs.nodes) if gang else _scheduling(obs.pods)
    running, gathering = _trainer_running(obs, status, gang)
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
        _queue_conditions(obs, conds)
    if schedule is not None:
        ok, reason, text = schedule
        conds["Scheduled"] = _condition("Scheduled", ok, reason, text, obs)
        if not ok:
            message = f"{reason}: {text}" if gang else text

    phase: Phase
    if complete is not None:
        phase = "Succeeded"
        status["completionTime"] = job_status.get("completionTime") or complete.get("lastTransitionTime") or obs.now
        message = _succeeded(obs, conds)
    elif failed is not None:
        phase = "Failed"
        reason, text = _failure(job, failed, obs.pods)
        status["completionTime"] = failed.get("lastTransitionTime") or obs.now
        conds["Failed"] = _condition("Failed", True, reason, text, obs)
        conds["Running"] = _condition("Running", False, reason, text, obs)
        message = f"{reason}: {text}" if text else reason
    elif admission is not None and admission.evicted and admission.preemption is not None and _active(obs.pods):
        # Kueue evicted the job: its pod is stopping (SIGTERM, then the grace period).
        phase = "Preempted"
        message = _preemption_text(admission, obs.preemptor)
        conds["Running"] = _condition("Running", False, "Preempted", message, obs)
        if suspended:
            conds["Suspended"] = _condition("Suspended", True, "Preempted", message, obs)
    elif suspended:
        phase, message = _suspended(obs, status, conds, message)
    else:
        phase = _active_phase(
            obs, conds, admission, (running, finishing, gathering), message=message, restarts=restarts
        )
    status["phase"] = phase
    if retried is not None and message is None and phase == "Running":
        # Said while the retry runs (a Pending job's message is the scheduler's: an Event each).
        message = str(retried.get("message") or "")
    if message:
        status["message"] = message
    return _finish(obs, status, conds)


def _succeeded(obs: Observation, conds: dict[str, dict[str, Any]]) -> str | None:
    """A Job that completed: its conditions, and the message when a format was not written."""
    conds["Complete"] = _condition("Complete", True, "Succeeded", "training finished", obs)
    conds["Running"] = _condition("Running", False, "Succeeded", "training finished", obs)
    unwritten = export_failed(obs.pods)
    if unwritten is None:
        return None
    conds["Exported"] = _condition("Exported", False, EXPORT_FAILED, unwritten, obs)
    return f"{EXPORT_FAILED}: {unwritten}"


def _finish(obs: Observation, status: dict[str, Any], conds: dict[str, dict[str, Any]]) -> Outcome:
    status["conditions"] = [conds[k] for k in CONDITION_ORDER if k in conds] + [
        c for k, c in conds.items() if k not in CONDITION_ORDER
    ]
    return Outcome(status=status, transitions=transitions(obs.current, status))


def transitions(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Transition]:
    """The Events a status change deserves: trouble only, each a Warning.

    The status keeps what every job passes through: its phase, each condition with the moment it
    flipped (Scheduled, Running, Complete), startTime and completionTime, Kueue's words, the
    input check's and the scheduler's messages. An Event that repeats the status write of the
    same moment costs a request per job and says nothing `kubectl describe` does not already
    show above its Events, so a job that runs well posts none (at fleet scale that was 2.7
    Events a job, a third of the operator's requests). What the status would overwrite, or a
    user must act on, stays an Event: each failed attempt (Restarted), the GPU-memory retry,
    each preemption and the failure that ends the job. A pod waiting for a node is said by the
    status (phase Pending, the message and Scheduled=False, in the scheduler's words) and by the
    scheduler's own FailedScheduling Warning on the pod; when the wait turns into a failure (the
    pending timeout), the Failed Warning says it.
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
    if _export_failed(after) and not _export_failed(before):
        out.append(Transition("Warning", EXPORT_FAILED, str(after.get("message") or EXPORT_FAILED)))
    if after.get("phase") == "Failed" and before.get("phase") != "Failed":
        failed = next(
            (c for c in after.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"), None
        )
        if failed is not None:
            out.append(Transition("Warning", str(failed["reason"]), str(failed["message"]) or "the job failed"))
    return out


def _export_failed(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Exported" and c.get("status") == "False" for c in status.get("conditions") or [])


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


def needs_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return owned_part(current) != owned_part(desired)


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch of the owned fields only; fields that went away are set to null."""
    patch: dict[str, Any] = {k: v for k, v in owned_part(desired).items() if owned_part(current).get(k) != v}
    for key in OWNED_FIELDS:
        if current.get(key) is not None and desired.get(key) is None:
            patch[key] = None
    return patch
