"""The Job `ftjob export NAME` runs: a pure builder, no I/O.

It is the trainer's pod as the operator built it (the job's own Job template: image, config
annotation, claims, environment, security contexts, node placement), less what training needed:
no GPU or other extended resource, no ServiceAccount token (the export never calls the API
server), no multi-node wiring, one attempt; its command is the trainer's with `--export-only`.
It is the user's Job, made with the user's credentials like `ftjob upload`'s pod (the operator's
fence does not apply to it), owned by the FineTuneJob so that it goes with it, and labelled
`finetune.dev/export-of`, not `finetune.dev/job`: the operator never mistakes its pod for the
trainer's.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from finetune_api.constants import GROUP, KIND, LABEL_COMPONENT, VERSION
from finetune_api.contract import CONTAINER, EXPORT_ONLY_FLAG, TRAINER_COMMAND

SUFFIX: Final = "-export"
COMPONENT: Final = "export"
LABEL_EXPORT_OF: Final = f"{GROUP}/export-of"
# What the pod template carries for a gang of pods, and one export pod does not need. Its node
# placement stays: where the trainer ran is where its claims mount.
TRAINING_ONLY: Final = ("subdomain", "hostname", "schedulingGates")
# Finished export Jobs go after a day; their pod's log and termination message say what happened.
TTL_SECONDS: Final = 86400


def export_job_name(job: str) -> str:
    name = job + SUFFIX
    if len(name) <= 63:
        return name
    return f"{job[:46]}-{hashlib.sha256(job.encode()).hexdigest()[:8]}{SUFFIX}"


def _cpu_only(resources: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests and limits less extended resources (GPUs: names with a '/')."""
    return {
        kind: {name: value for name, value in (amounts or {}).items() if "/" not in name}
        for kind, amounts in resources.items()
    }


def _container(template: Mapping[str, Any], formats: Sequence[str]) -> dict[str, Any]:
    found = [c for c in template.get("containers") or [] if c.get("name") == CONTAINER]
    if not found:
        raise ValueError(f"the trainer Job has no container named {CONTAINER}")
    container: dict[str, Any] = copy.deepcopy(found[0])
    container["command"] = [*TRAINER_COMMAND, EXPORT_ONLY_FLAG, *(("--formats", ",".join(formats)) if formats else ())]
    container.pop("args", None)
    container.pop("ports", None)
    container["resources"] = _cpu_only(container.get("resources") or {})
    return container


def export_job(
    fine_tune_job: Mapping[str, Any], trainer_job: Mapping[str, Any], formats: Sequence[str]
) -> dict[str, Any]:
    """The export Job of `fine_tune_job` (the FineTuneJob, as read), from its trainer Job."""
    meta = fine_tune_job["metadata"]
    job = str(meta["name"])
    template = (trainer_job.get("spec") or {}).get("template") or {}
    pod = {k: copy.deepcopy(v) for k, v in (template.get("spec") or {}).items() if k not in TRAINING_ONLY}
    pod.update(
        containers=[_container(template.get("spec") or {}, formats)],
        restartPolicy="Never",
        automountServiceAccountToken=False,
    )
    pod.pop("serviceAccountName", None)
    pod.pop("initContainers", None)
    labels = {LABEL_EXPORT_OF: job, LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/managed-by": "ftjob"}
    annotations = copy.deepcopy((template.get("metadata") or {}).get("annotations") or {})
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job, "uid": meta["uid"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": export_job_name(job), "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
        },
    }
