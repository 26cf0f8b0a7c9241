"""The pre-flight Job: the trainer image on the CPU, checking a job's claims before its GPU Job.

`python -m finetune_trainer --config ... --check-inputs` (finetune_trainer/input_check.py) finds
the model folder and the dataset on their claims, reads the model's config and tokenizer, and
checks the records as `ftjob check-data` does; it ends with the trainer's exit codes and
termination message. The operator creates the GPU Job only after it succeeded, so a wrong path
costs a CPU pod of seconds instead of GPUs held through scheduling and an image pull.

Its shape is narrower than the trainer Job's, and the fence admits the pre-flight command only
in it: no GPU or other extended resource, no Hub token, no ServiceAccount token, no network
label, the model and dataset claims read-only, and no output claim. The Job is labelled
component "preflight"; its pods keep the job's labels and component "trainer" (with
PREFLIGHT_POD_LABEL), so the job's own NetworkPolicy (builders/network.py, created just before
this Job) covers them.
"""

from typing import Any, Final

from finetune_api.constants import TRAINER_SERVICE_ACCOUNT
from finetune_api.contract import (
    COMPILER_OFF,
    COMPONENT_PREFLIGHT,
    CONFIG_ANNOTATION,
    CONFIG_DIR,
    CONFIG_KEY,
    CONTAINER,
    OFFLINE,
    PREFLIGHT_COMMAND,
    PREFLIGHT_POD_LABEL,
    TMP_MOUNT,
    preflight_job_name,
)
from finetune_api.reasons import TERMINATION_LOG
from finetune_api.spec import FineTuneJobSpec

from ..children import Owner, labels, metadata
from ..settings import Settings
from .config import config_json
from .job import input_claims, security_contexts

# Room for the tokenizer files and library caches the check writes under HOME.
TMP_SIZE: Final = "1Gi"


def needed(spec: FineTuneJobSpec, settings: Settings) -> bool:
    """Whether the job has anything on a claim to check (a Hub model and dataset have not: the
    pre-flight pod has no network)."""
    return settings.preflight and (spec.model.source.pvc is not None or spec.dataset.source.pvc is not None)


def _volumes(spec: FineTuneJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [{"path": CONFIG_KEY, "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_ANNOTATION}']"}}]
    vols: list[dict[str, Any]] = [
        {"name": "config", "downwardAPI": {"items": items}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    inputs, input_mounts = input_claims(spec)
    return vols + inputs, mounts + input_mounts


def _environment() -> list[dict[str, Any]]:
    fixed = {"HOME": TMP_MOUNT, "PYTHONUNBUFFERED": "1", **OFFLINE, **COMPILER_OFF}
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *({"name": k, "value": v} for k, v in fixed.items()),
    ]


def preflight_job(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    vols, mounts = _volumes(spec)
    pod_security, container_security = security_contexts(settings)
    size = {"cpu": settings.preflight_cpu, "memory": settings.preflight_memory, "ephemeral-storage": TMP_SIZE}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or settings.trainer_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(PREFLIGHT_COMMAND),
        "env": _environment(),
        "volumeMounts": mounts,
        "securityContext": container_security,
        "resources": {"limits": dict(size), "requests": dict(size)},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The fence pins every operator-made pod to the trainer's identity; this one needs no
        # API access at all, so it gets no token.
        "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": vols,
        "terminationGracePeriodSeconds": 5,
    }
    job_spec: dict[str, Any] = {
        # A failed check fails the same way again: one attempt.
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "activeDeadlineSeconds": settings.preflight_deadline_seconds,
        "template": {
            "metadata": {
                "labels": {**labels(owner.name), PREFLIGHT_POD_LABEL: "true"},
                "annotations": {CONFIG_ANNOTATION: config_json(owner, spec)},
            },
            "spec": pod_spec,
        },
    }
    meta = metadata(owner, preflight_job_name(owner.name), COMPONENT_PREFLIGHT)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
