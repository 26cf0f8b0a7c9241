"""The fetch Job and the object cache claim: a job's S3 objects onto a claim before its GPU Job.

After the pre-flight listed a job's S3 sources (and said their bytes), the operator makes the
namespace's object cache claim where the job names none (`finetune-object-cache`, sized from
those bytes with room to spare, kept for the namespace's later jobs and never owned by one), then
the fetch Job: the trainer image on the CPU in the pre-flight's shape (no GPU, no token, its
other claims read-only), with the cache claim read-write at contract.OBJECTS_MOUNT and the
sources' credentials by reference, running `--fetch-inputs`. The GPU Job follows once it passed,
reading the copies read-only; it holds no input credentials and no route to the stores.
"""

import math
from typing import Any, Final

from finetune_api.constants import LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY
from finetune_api.contract import (
    COMPONENT_FETCH,
    FETCH_COMMAND,
    OBJECT_CACHE_SIZE_ENV,
    OBJECTS_MOUNT,
    cache_claim_name,
    fetch_job_name,
)
from finetune_api.object_storage import NAMESPACE_CACHE_CLAIM
from finetune_api.spec import FineTuneJobSpec

from ..children import Owner
from ..settings import Settings
from .preflight import check_volumes, cpu_job

COMPONENT_CACHE: Final = "object-cache"
GIB: Final = 1 << 30
# The namespace's claim is made once, for the first job's objects, and shared by the later
# ones: room for them beside the first (half again), and never below the chart's least.
HEADROOM: Final = 1.5


def claim_size(listed_bytes: int, least: str) -> str:
    """The size of the namespace's cache claim for a first job listing `listed_bytes`."""
    from finetune_api.quantities import to_bytes

    wanted = max(int(listed_bytes * HEADROOM), to_bytes(least))
    return f"{math.ceil(wanted / GIB)}Gi"


def cache_claim(namespace: str, size: str, settings: Settings) -> dict[str, Any]:
    """The namespace's object cache claim: read by jobs on many nodes at once (ReadWriteMany, or
    the chart's access mode), owned by no job (it outlives each), named for the fence."""
    spec: dict[str, Any] = {
        "accessModes": [settings.object_cache_access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if settings.object_cache_storage_class:
        spec["storageClassName"] = settings.object_cache_storage_class
    labels = {LABEL_COMPONENT: COMPONENT_CACHE, LABEL_MANAGED_BY: MANAGED_BY}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": NAMESPACE_CACHE_CLAIM, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def fetch_job(owner: Owner, spec: FineTuneJobSpec, settings: Settings, capacity: str | None) -> dict[str, Any]:
    """The fetch Job of a job whose pre-flight passed; `capacity`: the cache claim's size, when known."""
    vols, mounts = check_volumes(spec)
    claim = {"claimName": cache_claim_name(spec)}
    vols.append({"name": "objects", "persistentVolumeClaim": claim})
    mounts.append({"name": "objects", "mountPath": OBJECTS_MOUNT})
    env = ({"name": OBJECT_CACHE_SIZE_ENV, "value": capacity},) if capacity else ()
    named = (fetch_job_name(owner.name), COMPONENT_FETCH)
    return cpu_job(owner, spec, settings, command=FETCH_COMMAND, volumes=(vols, mounts), named=named, env=env)
