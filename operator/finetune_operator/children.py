"""Names, labels and owner references of a FineTuneJob's children.

Names are derived from the job's name only, so a reconcile that runs twice (an operator
restart mid-way) finds the children the first run made instead of making new ones.
"""

import re
from dataclasses import dataclass
from typing import Any

from finetune_api.constants import (
    API_VERSION,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from finetune_api.contract import COMPONENT_TRAINER

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's WorkloadPriorityClass of the Job: orders its queue and decides preemption.
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Set on the pod template of jobs that download from the Hugging Face Hub, and only those: their
# pods are the ones whose own NetworkPolicy (builders/network.py) allows HTTPS egress.
HUB_EGRESS_LABEL = f"{GROUP}/hub-egress"
# Set on the pod template of the pods that reach an S3-compatible store, and only those: the
# pre-flight and fetch of a job with an s3 source, the trainer of a job with output.s3. Their
# namespace's NetworkPolicy `finetune-trainers-objects` lets them reach the chart's stores.
OBJECT_EGRESS_LABEL = f"{GROUP}/object-egress"
# Set on the pod template of the jobs whose pods' names another job's could have: every job of
# several nodes ("<job>-<index>-xxxxx") and every job of one node whose name ends in "-<index>"
# ("<name>-xxxxx" is then the pod of index <index> of the job named without it). The trainer-
# status policy (charts/finetune-operator/files/trainer-status-policy.yaml) takes only these
# pods as parameters: the API server evaluates that policy once per parameter on every status
# write, the operator's too, so the namespace's every trainer pod (finished ones included)
# made each write cost about 2 s at 5,000 jobs.
NAME_CHECK_LABEL = f"{GROUP}/name-check"
# An index as the trainer-status policy reads it from a pod's name (no leading zero, below 100).
_INDEX_SUFFIX = re.compile(r".*-(0|[1-9][0-9]?)")


def name_checked(name: str, several_nodes: bool) -> bool:
    """Whether a job's pods carry NAME_CHECK_LABEL: their names alone may not tell whose they are."""
    return several_nodes or _INDEX_SUFFIX.fullmatch(name) is not None


@dataclass(frozen=True)
class Owner:
    """The FineTuneJob a child belongs to: enough for an ownerReference and the names."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        # No blockOwnerDeletion: it would need `update` on finetunejobs/finalizers, and the
        # garbage collector deletes the children in the background either way.
        return {"apiVersion": API_VERSION, "kind": KIND, "name": self.name, "uid": self.uid, "controller": True}


def job_name(job: str) -> str:
    return job


def labels(job: str, component: str = COMPONENT_TRAINER) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_COMPONENT: component, LABEL_MANAGED_BY: MANAGED_BY}


def metadata(owner: Owner, name: str, component: str = COMPONENT_TRAINER, *, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": owner.namespace, "labels": labels(owner.name, component)}
    if owned:
        meta["ownerReferences"] = [owner.reference()]
    return meta


def owned_by(child: dict[str, Any], uid: str | None) -> bool:
    """Whether `child`'s owner references name `uid` (a Job of this FineTuneJob, a pod of this Job)."""
    refs = (child.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid for r in refs)
