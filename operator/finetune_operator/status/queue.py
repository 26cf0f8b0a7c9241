"""What Kueue says of a queued job (spec.placement.queueName), in Kueue's words.

`status.queue` names the LocalQueue, the Workload and Kueue's verdict, and counts preemptions;
the Admitted and Preempted conditions follow the Workload's (workloads.py reads it). The
preemptor is named as a FineTuneJob when its Job is one of ours.
"""

from typing import Any

from ..workloads import Admission
from .conditions import Conditions, condition
from .observation import Observation

# Before Kueue has made the job's Workload (or where Kueue does not run at all).
NO_WORKLOAD = "NoWorkload"
NO_WORKLOAD_MESSAGE = "waiting for Kueue to make the job's Workload (is Kueue managing batch/v1 Jobs?)"


def preemption_text(admission: Admission, preemptor: str | None) -> str:
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


def queue_conditions(obs: Observation, conds: Conditions) -> None:
    """Admitted as Kueue says it; Preempted while Kueue says so, False again once readmitted."""
    admission = obs.admission
    if admission is None:
        conds["Admitted"] = condition("Admitted", False, NO_WORKLOAD, NO_WORKLOAD_MESSAGE, obs)
        return
    conds["Admitted"] = condition("Admitted", admission.admitted, admission.reason, admission.message, obs)
    if admission.preemption is not None:
        text = preemption_text(admission, obs.preemptor)
        conds["Preempted"] = condition("Preempted", True, admission.preemption.reason, text, obs)
    elif admission.admitted and conds.get("Preempted", {}).get("status") == "True":
        conds["Preempted"] = condition("Preempted", False, "Readmitted", "admitted again after a preemption", obs)
