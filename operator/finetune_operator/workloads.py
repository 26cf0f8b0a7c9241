"""Kueue's Workload for a job's Job, read into what the FineTuneJob's status says about the queue.

Kueue makes one Workload (kueue.x-k8s.io/v1beta2) per queued Job, owned by the Job, and says
everything about admission in its conditions: QuotaReserved and Admitted (False while it waits,
with Kueue's reason and message, e.g. insufficient quota), Evicted and Preempted (reason and
message name the preemptor's Job UID). The operator repeats Kueue's own words and adds only the
preemptor's FineTuneJob, when it knows the Job with that UID.

Pure functions of plain API dicts; no I/O.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
PLURAL: Final = "workloads"
# Every Workload Kueue makes for a Job carries the Job's UID here.
JOB_UID_LABEL: Final = f"{GROUP}/job-uid"

# "Preempted to accommodate a workload (UID: ..., JobUID: ...) due to ..."
_PREEMPTOR_JOB_UID = re.compile(r"JobUID: ([^,)\s]+)")

Body = Mapping[str, Any]


def _condition(workload: Body, kind: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _true(workload: Body, kind: str) -> Mapping[str, Any] | None:
    cond = _condition(workload, kind)
    return cond if cond is not None and cond.get("status") == "True" else None


def owner_job_name(workload: Body) -> str | None:
    """The name of the batch/v1 Job that owns the Workload (the FineTuneJob's name too)."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name"))
    return None


def of_job(workloads: Sequence[Body], job: Body | None) -> Body | None:
    """The Workload of this very Job (not of an earlier Job of the same name)."""
    uid = ((job or {}).get("metadata") or {}).get("uid")
    if not uid:
        return None
    for workload in workloads:
        meta = workload.get("metadata") or {}
        owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])
        if owned or (meta.get("labels") or {}).get(JOB_UID_LABEL) == uid:
            return workload
    return None


def preemptor_job_uid(message: str) -> str | None:
    found = _PREEMPTOR_JOB_UID.search(message)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Preemption:
    time: str
    reason: str
    message: str
    preemptor_job_uid: str | None


@dataclass(frozen=True)
class Admission:
    """Kueue's verdict on one Workload, as the status needs it."""

    workload: str
    admitted: bool
    # Evicted and not yet admitted again (Kueue suspends the Job; its pod stops, then it queues).
    evicted: bool
    reason: str
    message: str
    cluster_queue: str | None
    preemption: Preemption | None  # the latest, while Kueue's Preempted condition is True


def read(workload: Body) -> Admission:
    status = workload.get("status") or {}
    name = str((workload.get("metadata") or {}).get("name") or "")
    admitted = _true(workload, "Admitted")
    evicted = _true(workload, "Evicted")
    reserved = _condition(workload, "QuotaReserved")
    preempted = _true(workload, "Preempted")
    preemption = None
    if preempted is not None:
        message = str(preempted.get("message") or "")
        preemption = Preemption(
            time=str(preempted.get("lastTransitionTime") or ""),
            reason=str(preempted.get("reason") or "Preempted"),
            message=message,
            preemptor_job_uid=preemptor_job_uid(message),
        )
    # Kueue's words for where the Workload stands now: admitted; else why it waits for quota
    # (after a preemption too: the Preempted condition keeps what happened); else the eviction.
    said: Mapping[str, Any] | None
    if admitted is not None and evicted is None:
        said = admitted
    elif reserved is not None and reserved.get("status") != "True":
        said = reserved
    else:
        said = evicted or reserved
    if said is not None:
        reason, message = str(said.get("reason") or said.get("type")), str(said.get("message") or "")
    else:
        reason, message = "Pending", "Kueue has not looked at the workload yet"
    cluster_queue = (status.get("admission") or {}).get("clusterQueue")
    return Admission(
        workload=name,
        admitted=admitted is not None and evicted is None,
        evicted=evicted is not None,
        reason=reason,
        message=message,
        cluster_queue=str(cluster_queue) if cluster_queue else None,
        preemption=preemption,
    )
