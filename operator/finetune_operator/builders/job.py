"""The batch/v1 Job that runs the trainer: placement, mounts, security, retries."""

from typing import Any, Final

from finetune_api.constants import TRAINER_SERVICE_ACCOUNT
from finetune_api.contract import (
    ALLOCATOR,
    COMPILER_OFF,
    CONFIG_ANNOTATION,
    CONFIG_DIR,
    CONFIG_KEY,
    CONTAINER,
    DATASET_HUB_TOKEN_ENV,
    DATASET_MOUNT,
    DATASET_S3_PREFIX,
    EVAL_HUB_TOKEN_ENV,
    EVAL_MOUNT,
    EVAL_S3_PREFIX,
    HUB_CACHE,
    HUB_ENDPOINT_ENV,
    HUB_TOKEN_ENV,
    HUB_TOKEN_KEY,
    MODEL_MOUNT,
    OBJECT_CACHE_SIZE_ENV,
    OBJECTS_MOUNT,
    OFFLINE,
    OUTPUT_MOUNT,
    S3_OUTPUT_ROLES,
    SHM_MOUNT,
    TMP_MOUNT,
    TRAINER_COMMAND,
    cache_claim_name,
    hub_tokens,
    library_environment,
    s3_secrets,
    uses_hub,
    uses_objects,
)
from finetune_api.gpus import is_pascal
from finetune_api.object_storage import ACCESS_KEY_FIELDS
from finetune_api.reasons import NON_RETRYABLE, TERMINATION_LOG, UNCOUNTED
from finetune_api.server_spec import ServerPlacement
from finetune_api.spec import FineTuneJobSpec, PlacementSpec
from finetune_plan.host.need import HostNeed
from finetune_plan.pod import pod_plan

from .. import quantities
from ..children import (
    HUB_EGRESS_LABEL,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    NAME_CHECK_LABEL,
    OBJECT_EGRESS_LABEL,
    Owner,
    job_name,
    labels,
    metadata,
    name_checked,
)
from ..settings import Settings
from .config import config_json
from .pvc import output_claim_name

COMMAND: Final = TRAINER_COMMAND
# The variables of S3 credentials a pod may get, each from the key of the same name (less any
# prefix) of the Secret an s3 field names.
S3_ENV_NAMES: Final = frozenset(
    prefix + key for prefix in ("", DATASET_S3_PREFIX, EVAL_S3_PREFIX) for key in ACCESS_KEY_FIELDS
)
# Every variable `environment` may write; the operator fence admits no other name.
ENV_NAMES: Final = frozenset(
    {"POD_NAME", "POD_NAMESPACE", "HOME", "PYTHONUNBUFFERED", "HF_HOME"}
    | {HUB_TOKEN_ENV, DATASET_HUB_TOKEN_ENV, EVAL_HUB_TOKEN_ENV}
    | {*ALLOCATOR, *OFFLINE, *COMPILER_OFF, *HUB_ENDPOINT_ENV}
    | S3_ENV_NAMES
    # The fetch Job's: the object cache claim's size (builders/objects.py).
    | {OBJECT_CACHE_SIZE_ENV}
)
# Room for the container's logs in its ephemeral-storage limit, on top of /tmp.
LOG_ALLOWANCE: Final = "1Gi"


def pod_failure_policy() -> dict[str, Any]:
    """Fail at once on exits that would fail the same way again; never count disruptions."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": sorted(int(code) for code in NON_RETRYABLE),
                },
            },
            # Preemption, node drain, eviction: not the trainer's fault; the retry resumes.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # The trainer stopped on SIGTERM with its state saved: the retry loses nothing.
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": sorted(int(code) for code in UNCOUNTED),
                },
            },
        ]
    }


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    # The Hub token reaches the pod only this way: never in args, annotations or the config.
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": HUB_TOKEN_KEY}}}


def s3_credentials(spec: FineTuneJobSpec, roles: tuple[str, ...]) -> list[dict[str, Any]]:
    """The credentials of `roles`' s3 fields, each variable from the key of its own name of the
    Secret the field names (contract.s3_secrets gives the prefixes): by reference only, so the
    operator never reads a Secret and the pod spec carries none of its bytes."""
    env: list[dict[str, Any]] = []
    for _, prefix, secret in s3_secrets(spec, roles):
        names = {e["name"] for e in env}
        env += [
            {"name": prefix + key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for key in ACCESS_KEY_FIELDS
            if prefix + key not in names
        ]
    return env


def environment(spec: FineTuneJobSpec, settings: Settings) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # The root filesystem is read-only; libraries that write under $HOME get the tmp volume.
        {"name": "HOME", "value": TMP_MOUNT},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    pascal = spec.resources.gpus > 0 and is_pascal(spec.resources.gpu_product)
    env += [{"name": k, "value": v} for k, v in library_environment(hub=uses_hub(spec), compiler=not pascal).items()]
    if uses_hub(spec):
        env.append({"name": "HF_HOME", "value": HUB_CACHE})
        env += [{"name": k, "value": v} for k, v in sorted(settings.hub_env.items())]
    # One variable per Secret (contract.hub_tokens): a source whose Secret another names shares it.
    written: set[str] = set()
    for _, name, secret in hub_tokens(spec):
        if name not in written:
            written.add(name)
            env.append(_secret_env(name, secret))
    # The trainer copies its outputs to output.s3 after training ended well.
    return env + s3_credentials(spec, S3_OUTPUT_ROLES)


def memory_limit(spec: FineTuneJobSpec, settings: Settings, host: HostNeed | None) -> str | None:
    """The spec's memory; unset, the planner's host figure for the pod (with its margin), where the
    operator can plan the model; else the chart's default."""
    if spec.resources.memory:
        return spec.resources.memory
    return host.quantity if host is not None else settings.default_memory


def resources(spec: FineTuneJobSpec, settings: Settings, host: HostNeed | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    cpu = spec.resources.cpu or settings.default_cpu
    memory = memory_limit(spec, settings, host)
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if spec.resources.gpus > 0:
        limits[settings.gpu_resource] = str(spec.resources.gpus)
    # Requests equal limits: a training pod that gets squeezed mid-run loses hours of work.
    requests = dict(limits)
    # Disk is the exception: the limit covers the whole /tmp plus logs, but a trainer rarely
    # fills /tmp, and reserving all of it per pod would leave disk idle on every node.
    disk = quantities.to_bytes(settings.tmp_size) + quantities.to_bytes(LOG_ALLOWANCE)
    limits["ephemeral-storage"] = quantities.mebibytes(disk, round_up=True)
    requests["ephemeral-storage"] = settings.ephemeral_storage_request
    return {"limits": limits, "requests": requests}


def shm_size(spec: FineTuneJobSpec, settings: Settings, host: HostNeed | None = None) -> str:
    """/dev/shm: the configured size, but never more than its share of the memory limit.

    A memory-backed emptyDir is charged to the pod's memory, so an /dev/shm as large as the
    limit turns a full disk into an OOM kill of the trainer.
    """
    memory = memory_limit(spec, settings, host)
    if memory is None:
        return settings.shm_size
    cap = int(quantities.to_bytes(memory) * settings.shm_memory_fraction)
    if quantities.to_bytes(settings.shm_size) <= cap:
        return settings.shm_size
    return quantities.mebibytes(cap, round_up=False)


def volumes(
    owner: Owner, spec: FineTuneJobSpec, settings: Settings, host: HostNeed | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    vols: list[dict[str, Any]] = [
        {
            "name": "config",
            "downwardAPI": {
                "items": [
                    {"path": CONFIG_KEY, "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_ANNOTATION}']"}}
                ]
            },
        },
        {"name": "output", "persistentVolumeClaim": {"claimName": output_claim_name(owner, spec)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(spec, settings, host)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "output", "mountPath": OUTPUT_MOUNT},
        {"name": "shm", "mountPath": SHM_MOUNT},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    inputs, input_mounts = input_claims(spec)
    return vols + inputs, mounts + input_mounts


def input_claims(
    spec: FineTuneJobSpec, *, without_objects: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model, dataset and held-out claims a spec names, as volumes and read-only mounts (the trainer's
    Job and the input check's mount them alike), and the object cache claim the trainer reads S3
    sources' copies from (the pre-flight lists them, the fetch Job writes it: builders/objects.py)."""
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if uses_objects(spec) and not without_objects:
        vols.append(
            {"name": "objects", "persistentVolumeClaim": {"claimName": cache_claim_name(spec), "readOnly": True}}
        )
        mounts.append({"name": "objects", "mountPath": OBJECTS_MOUNT, "readOnly": True})
    held_out = spec.dataset.eval.pvc if spec.dataset.eval is not None else None
    for name, source, mount in (
        ("model", spec.model.source.pvc, MODEL_MOUNT),
        ("dataset", spec.dataset.source.pvc, DATASET_MOUNT),
        ("eval", held_out, EVAL_MOUNT),
    ):
        if source is not None:
            vols.append({"name": name, "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}})
            mounts.append({"name": name, "mountPath": mount, "readOnly": True})
    return vols, mounts


def security_contexts(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod and container contexts that pass Pod Security `restricted`."""
    uid = settings.trainer_uid
    pod = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return pod, container


def placement(spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    return pod_placement(spec.placement, spec.resources.gpus, spec.resources.gpu_product, settings)


def pod_placement(
    user: PlacementSpec | ServerPlacement, gpus: int, gpu_product: str, settings: Settings
) -> dict[str, Any]:
    """A pod's nodeSelector, tolerations, affinity and priority class: a trainer's or a ModelServer's."""
    node_selector = dict(user.node_selector)
    tolerations: list[dict[str, Any]] = []
    if gpus > 0:
        # The GPU product wins over a user label of the same key: it is what the job asked for.
        node_selector[settings.gpu_product_label] = gpu_product
        tolerations.extend(dict(t) for t in settings.gpu_tolerations)
    tolerations.extend(t.model_dump(by_alias=True, exclude_none=True) for t in user.tolerations)
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = node_selector
    if tolerations:
        out["tolerations"] = tolerations
    if user.affinity:
        out["affinity"] = user.affinity
    if user.priority_class_name:
        out["priorityClassName"] = user.priority_class_name
    return out


def job(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    pod_labels = labels(owner.name)
    if uses_hub(spec):
        # Marks the pods whose own NetworkPolicy opens HTTPS egress (builders/network.py).
        pod_labels[HUB_EGRESS_LABEL] = "true"
    if spec.output.s3 is not None:
        # The trainer copies its outputs there: its pods may reach the chart's object stores.
        pod_labels[OBJECT_EGRESS_LABEL] = "true"
    if name_checked(owner.name, spec.resources.multinode):
        pod_labels[NAME_CHECK_LABEL] = "true"
    job_meta = metadata(owner, job_name(owner.name))
    queue = spec.placement.queue_name
    if queue:
        job_meta["labels"][KUEUE_QUEUE_LABEL] = queue
    if spec.placement.workload_priority_class_name:
        job_meta["labels"][KUEUE_PRIORITY_LABEL] = spec.placement.workload_priority_class_name
    # One plan for the pod: its grace period and, when the spec leaves it unset, its memory.
    planned = pod_plan(spec, host_memory_per_gpu=settings.host_memory_for(spec.resources.gpu_product))
    vols, mounts = volumes(owner, spec, settings, planned.host)
    pod_security, container_security = security_contexts(settings)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image or settings.trainer_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(COMMAND),
        "env": environment(spec, settings),
        "volumeMounts": mounts,
        "securityContext": container_security,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    container["resources"] = resources(spec, settings, planned.host)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
        # The trainer patches its own status with this token.
        "automountServiceAccountToken": True,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": vols,
        # Time for the trainer, on SIGTERM (suspend, preemption, drain), to finish its micro-batch
        # and write a checkpoint of that point: the planner's estimate (finetune_plan/grace.py).
        "terminationGracePeriodSeconds": planned.grace.seconds,
        **placement(spec, settings),
    }
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.backoff_limit,
        "completions": 1,
        "parallelism": 1,
        # Kueue admits a queued Job by unsuspending it.
        "suspend": spec.suspend or queue is not None,
        "podFailurePolicy": pod_failure_policy(),
        # A replacement pod starts only once the failed one is gone: two trainers never share
        # the output folder.
        "podReplacementPolicy": "Failed",
        "template": {
            "metadata": {"labels": pod_labels, "annotations": {CONFIG_ANNOTATION: config_json(owner, spec)}},
            "spec": pod_spec,
        },
    }
    job_spec.update({k: v for k, v in mutable_fields(spec, settings).items() if v is not None})
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}


def mutable_fields(spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    """The Job fields that follow the FineTuneJob after creation (the rest is immutable). The
    platform's default deadline stands where the spec sets none."""
    deadline = spec.active_deadline_seconds or settings.default_active_deadline_seconds
    return {
        "activeDeadlineSeconds": deadline,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
    }
