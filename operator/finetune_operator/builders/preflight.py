"""The pre-flight Job: the trainer image on the CPU, checking a job's claims before its GPU Job.

`python -m finetune_trainer --config ... --check-inputs` (finetune_trainer/launch/input_check.py) finds
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
    S3_INPUT_ROLES,
    TMP_MOUNT,
    input_sources,
    preflight_job_name,
    uses_objects,
)
from finetune_api.reasons import TERMINATION_LOG
from finetune_api.spec import FineTuneJobSpec

from ..children import OBJECT_EGRESS_LABEL, Owner, labels, metadata
from ..settings import Settings
from .config import config_json
from .job import input_claims, s3_credentials, security_contexts

# Room for the tokenizer files and library caches the check writes under HOME.
TMP_SIZE: Final = "1Gi"


def needed(spec: FineTuneJobSpec, settings: Settings) -> bool:
    """Whether the job has anything on a claim to check, or S3 objects to list and fetch (which
    only the pre-flight and the fetch Job do: never the GPU pod). A Hub model and dataset have
    nothing: the pre-flight pod has no route to the Hub."""
    on_claims = any(source is not None and source.pvc is not None for source in input_sources(spec).values())
    return uses_objects(spec) or (settings.preflight and on_claims)


def check_volumes(spec: FineTuneJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    items = [{"path": CONFIG_KEY, "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_ANNOTATION}']"}}]
    vols: list[dict[str, Any]] = [
        {"name": "config", "downwardAPI": {"items": items}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    # The object cache claim is the fetch Job's: the pre-flight only lists the objects.
    inputs, input_mounts = input_claims(spec, without_objects=True)
    return vols + inputs, mounts + input_mounts


def environment(spec: FineTuneJobSpec) -> list[dict[str, Any]]:
    """The input check's and the fetch's: no Hub, no compiler, and the S3 sources' credentials
    from their Secrets by reference (builders/objects.py)."""
    fixed = {"HOME": TMP_MOUNT, "PYTHONUNBUFFERED": "1", **OFFLINE, **COMPILER_OFF}
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *({"name": k, "value": v} for k, v in fixed.items()),
        *s3_credentials(spec, S3_INPUT_ROLES),
    ]


def preflight_job(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    vols, mounts = check_volumes(spec)
    name = preflight_job_name(owner.name)
    return cpu_job(
        owner, spec, settings, command=PREFLIGHT_COMMAND, volumes=(vols, mounts), named=(name, COMPONENT_PREFLIGHT)
    )


def cpu_job(
    owner: Owner,
    spec: FineTuneJobSpec,
    settings: Settings,
    *,
    command: tuple[str, ...],
    volumes: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    named: tuple[str, str],
    env: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    """A CPU Job of the trainer image in the pre-flight's shape (no GPU, no token, claims it only
    reads read-only): the input check, and the fetch of S3 objects."""
    vols, mounts = volumes
    pod_security, container_security = security_contexts(settings)
    size = {"cpu": settings.preflight_cpu, "memory": settings.preflight_memory, "ephemeral-storage": TMP_SIZE}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or settings.trainer_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(command),
        "env": [*environment(spec), *env],
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
    pod_labels = {**labels(owner.name), PREFLIGHT_POD_LABEL: "true"}
    if uses_objects(spec):
        pod_labels[OBJECT_EGRESS_LABEL] = "true"
    job_spec: dict[str, Any] = {
        # A failed check fails the same way again: one attempt.
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "activeDeadlineSeconds": settings.preflight_deadline_seconds,
        "template": {
            "metadata": {
                "labels": pod_labels,
                "annotations": {CONFIG_ANNOTATION: config_json(owner, spec)},
            },
            "spec": pod_spec,
        },
    }
    name, component = named
    meta = metadata(owner, name, component)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
